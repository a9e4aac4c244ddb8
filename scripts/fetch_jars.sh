#!/usr/bin/env bash
# Fetch the jars Spark needs for Kafka (spark-sql-kafka-0-10, spark-avro) and Delta Lake (delta-spark) from Maven
# Central, with their transitive dependencies less what the installed pyspark already ships (so no
# duplicate or conflicting jars), into one folder, with a manifest jars.txt: a "<package coordinate>
# <jar file>" line for each jar a package needs, and "# jar <file> <coordinate>" comments naming the
# Maven coordinates each file came from. Safe to run any number of times: quiet when complete.
#
# Usage: bash scripts/fetch_jars.sh [--dir DIR] [--no-delta] [--force]
#   DIR     default ${HEADRACE_JARS_DIR:-$HOME/.cache/headrace/jars}; the script owns its *.jar files
#   env     HEADRACE_SPARK_PACKAGE_VERSION: default pyspark's version if Maven Central has it, else the
#             newest earlier release of the same major version
#           HEADRACE_DELTA_VERSION: default the newest delta-spark built for pyspark's major.minor, else
#             none (a Delta built for another Spark minor fails with NoSuchMethodError); "none": no Delta
#           HEADRACE_PYTHON (default .venv/bin/python), HEADRACE_MAVEN_REPO (for version look-ups)
#           HEADRACE_M2 (Maven's local repository, default ~/.cache/headrace/m2: not ~/.m2, whose pom-only
#             entries make Spark's spark.jars.packages (Ivy) fail with "download failed: ...!x.jar")
# Prints the folder last, on stdout; notes go to stderr. Then use it as
#   spark.jars = ",".join(sorted(glob(DIR + "/*.jar")))
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${HEADRACE_JARS_DIR:-$HOME/.cache/headrace/jars}
delta_req=${HEADRACE_DELTA_VERSION:-auto}
kafka_req=${HEADRACE_SPARK_PACKAGE_VERSION:-auto}
python=${HEADRACE_PYTHON:-$root/.venv/bin/python}
repo_url=${HEADRACE_MAVEN_REPO:-https://repo1.maven.org/maven2}
m2=${HEADRACE_M2:-$HOME/.cache/headrace/m2}
dep_plugin=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
force=0
while [ $# -gt 0 ]; do
  case $1 in
    --dir) dir=$2; shift 2 ;;
    --no-delta) delta_req=none; shift ;;
    --force) force=1; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 0 ;;
    *) echo "fetch_jars: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

say() { echo "fetch_jars: $*" >&2; }
die() { say "$*"; exit 1; }

# --- what pyspark ships ------------------------------------------------------------------------
[ -x "$python" ] || die "no Python at $python (run scripts/setup.sh, or set HEADRACE_PYTHON)"
read -r spark_version pyspark_jars < <("$python" -c \
  'import os, pyspark; print(pyspark.__version__, os.path.join(os.path.dirname(pyspark.__file__), "jars"))') \
  || die "cannot import pyspark with $python"
[ -d "$pyspark_jars" ] || die "pyspark's jars folder $pyspark_jars is missing"
scala=$(ls "$pyspark_jars" | sed -n 's/^spark-core_\(2\.1[0-9]\)-.*\.jar$/\1/p' | head -1)
[ -n "$scala" ] || die "cannot tell pyspark's Scala version from $pyspark_jars/spark-core_*.jar"
jackson=$(ls "$pyspark_jars" | sed -n 's/^jackson-databind-\([0-9][^-]*\)\.jar$/\1/p' | head -1)

key="pyspark=$spark_version scala=$scala spark-sql-kafka=$kafka_req spark-avro=$kafka_req delta=$delta_req"
manifest=$dir/jars.txt

complete() {  # the manifest was written for these inputs and every file it lists is there
  [ -f "$manifest" ] && grep -qxF "# inputs: $key" "$manifest" || return 1
  local f
  while read -r _ f; do [ -f "$dir/$f" ] || return 1; done < <(grep -v '^#' "$manifest")
}
if [ "$force" = 0 ] && complete; then echo "$dir"; exit 0; fi

command -v curl >/dev/null || die "needs curl"
# shellcheck source=scripts/maven.sh
source "$root/scripts/maven.sh"
need_mvn
start=$SECONDS

# --- versions ----------------------------------------------------------------------------------
releases() {  # the release versions of group:artifact on $repo_url, oldest first (no previews, rcs)
  local g=${1%%:*} a=${1#*:}
  curl -fsSL --retry 2 "$repo_url/${g//.//}/$a/maven-metadata.xml" \
    | sed -n 's:.*<version>\([0-9][0-9.]*\)</version>.*:\1:p' | sort -V
}
vle() { [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }  # $1 <= $2
major=${spark_version%%.*}
minor=$(echo "$spark_version" | cut -d. -f1,2)

notes=()
spark_release() {  # the release of Spark package $1 (group:artifact) for pyspark: its version, else the newest earlier one
  local all v
  all=$(releases "$1") || die "cannot list $1 versions on $repo_url"
  if grep -qxF "$spark_version" <<<"$all"; then echo "$spark_version"; return; fi
  v=$(grep "^$major\." <<<"$all" | while read -r r; do vle "$r" "$spark_version" && echo "$r"; done | tail -1)
  [ -n "$v" ] || die "no $1 release for Spark $major.x up to $spark_version"
  echo "$v"
}
kafka_version=$kafka_req
if [ "$kafka_version" = auto ]; then
  kafka_version=$(spark_release "org.apache.spark:spark-sql-kafka-0-10_$scala")
  [ "$kafka_version" = "$spark_version" ] || notes+=("org.apache.spark:spark-sql-kafka-0-10_$scala:$spark_version is not on Maven Central; using $kafka_version (set HEADRACE_SPARK_PACKAGE_VERSION to choose)")
fi
avro_version=$kafka_req
if [ "$avro_version" = auto ]; then
  avro_version=$(spark_release "org.apache.spark:spark-avro_$scala")
  [ "$avro_version" = "$spark_version" ] || notes+=("org.apache.spark:spark-avro_$scala:$spark_version is not on Maven Central; using $avro_version")
fi

delta_version=$delta_req
if [ "$delta_version" = auto ]; then
  all=$(releases "io.delta:delta-spark_$scala") || die "cannot list delta-spark versions on $repo_url"
  delta_version=
  for v in $(tac <<<"$all"); do  # newest first; stop at the first built for a Spark not newer than ours
    built_for=$(curl -fsSL --retry 2 "$repo_url/io/delta/delta-spark_$scala/$v/delta-spark_$scala-$v.pom" \
      | grep -A1 "<artifactId>spark-sql_$scala</artifactId>" | sed -n 's:.*<version>\(.*\)</version>.*:\1:p' | head -1)
    [ -n "$built_for" ] || continue
    if [ "$(echo "$built_for" | cut -d. -f1,2)" = "$minor" ]; then delta_version=$v; break; fi
    if vle "$built_for" "$minor"; then  # older releases are built for older Sparks still
      notes+=("no delta-spark release is built for Spark $minor (the newest, $v, is built for Spark $built_for and fails on Spark $minor with NoSuchMethodError); leaving Delta out (HEADRACE_DELTA_VERSION=$v forces it)")
      break
    fi
  done
  delta_version=${delta_version:-none}
fi

roots=("org.apache.spark:spark-sql-kafka-0-10_$scala:$kafka_version" "org.apache.spark:spark-avro_$scala:$avro_version")
[ "$delta_version" = none ] || roots+=("io.delta:delta-spark_$scala:$delta_version")
for n in "${notes[@]}"; do say "note: $n"; done

# --- resolve with Maven, pruning whatever pyspark ships ------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/headrace-fetch-jars.XXXXXX")
trap 'rm -rf "$work"' EXIT

write_pom() {  # the pom of $pom_roots; $@: artifactIds to exclude (with their own dependencies) from each
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
    echo '<groupId>headrace</groupId><artifactId>spark-jars</artifactId><version>0</version><packaging>pom</packaging>'
    if [ -n "$jackson" ]; then  # line up Jackson modules that pyspark lacks with the Jackson it has
      echo "<dependencyManagement><dependencies><dependency><groupId>com.fasterxml.jackson</groupId><artifactId>jackson-bom</artifactId><version>$jackson</version><type>pom</type><scope>import</scope></dependency></dependencies></dependencyManagement>"
    fi
    echo '<dependencies>'
    local r g a v x
    for r in "${pom_roots[@]}"; do
      IFS=: read -r g a v <<<"$r"
      echo "<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version><exclusions>"
      for x in "$@"; do echo "<exclusion><groupId>*</groupId><artifactId>$x</artifactId></exclusion>"; done
      echo '</exclusions></dependency>'
    done
    echo '</dependencies></project>'
  } > "$work/pom.xml"
}

resolve() {  # writes $work/deps.txt: group:artifact:type[:classifier]:version:scope, one a line
  rm -f "$work/list.txt"
  mvn -B -q -Dmaven.repo.local="$m2" -f "$work/pom.xml" "$dep_plugin:list" -DincludeScope=runtime -DoutputFile="$work/list.txt" \
    > "$work/mvn.log" 2>&1 || { cat "$work/mvn.log" >&2; die "mvn could not resolve ${roots[*]}"; }
  sed -n 's/^ *\([^ :]*:[^ :]*:[^ ]*\).*/\1/p' "$work/list.txt" | grep -v '^The' | sort -u > "$work/deps.txt"
}

shipped() {  # the pyspark jar holding artifactId $1, if any
  local f
  for f in "$pyspark_jars/$1"-[0-9]*.jar; do [ -f "$f" ] && echo "${f##*/}" && return; done
  return 0
}

excluded=()
pom_roots=("${roots[@]}")
for _ in 1 2 3 4 5 6; do  # to a fixed point: pruning can change which versions Maven mediates
  write_pom "${excluded[@]}"
  resolve
  more=0
  while IFS=: read -r g a _; do
    [ -n "$(shipped "$a")" ] || continue
    case " ${excluded[*]} " in *" $a "*) ;; *) excluded+=("$a"); more=1 ;; esac
  done < "$work/deps.txt"
  [ "$more" = 1 ] || break
done
[ "$more" = 0 ] || die "the exclusions did not settle; see $work/pom.xml"

mvn -B -q -Dmaven.repo.local="$m2" -f "$work/pom.xml" "$dep_plugin:copy-dependencies" -DincludeScope=runtime \
  -DoutputDirectory="$work/jars" > "$work/mvn.log" 2>&1 \
  || { cat "$work/mvn.log" >&2; die "mvn copy-dependencies failed"; }
mv "$work/deps.txt" "$work/all.txt"

jar_of() {  # the file name and coordinate of a g:a:type[:classifier]:version:scope line, if a jar
  local g a t f4 f5 f6 c v
  IFS=: read -r g a t f4 f5 f6 <<<"$1"
  if [ -n "$f6" ]; then c=$f4 v=$f5; else c='' v=$f4; fi
  [ "$t" = jar ] && echo "$a-$v${c:+-$c}.jar $g:$a:$v${c:+:$c}"
}
for r in "${roots[@]}"; do  # which of the jars each package needs (the same exclusions, alone)
  pom_roots=("$r")
  write_pom "${excluded[@]}"
  resolve
  while IFS=: read -r g a t rest; do  # the file of the same artifact in the joint resolution
    line=$(grep -m1 "^$g:$a:$t:" "$work/all.txt") || die "$g:$a of $r is missing from the joint resolution"
    read -r file _ < <(jar_of "$line") || continue
    echo "$r $file"
  done < "$work/deps.txt" >> "$work/packages.txt"
done

# --- install into $dir with the manifest ---------------------------------------------------------
mkdir -p "$dir"
rm -f "$dir"/*.jar "$manifest"
{
  echo "# Jars for Spark's Kafka connector, Avro functions and Delta Lake, written by scripts/fetch_jars.sh; do not edit."
  echo "# inputs: $key"
  echo "# pyspark $spark_version (Scala $scala) at $pyspark_jars"
  for n in "${notes[@]}"; do echo "# note: $n"; done
  for a in "${excluded[@]}"; do echo "# left out, pyspark ships it: $a ($(shipped "$a"))"; done
  while read -r line; do
    read -r file coordinate < <(jar_of "$line") || continue
    [ -f "$work/jars/$file" ] || die "mvn did not copy $file"
    mv "$work/jars/$file" "$dir/"
    echo "# jar $file $coordinate"
  done < "$work/all.txt"
  echo "# <package coordinate> <jar file>, for each jar the package needs:"
  cat "$work/packages.txt"
} > "$manifest.tmp"
leftover=$(ls "$work/jars" 2>/dev/null || true)
[ -z "$leftover" ] || die "jars copied but not in the dependency list: $leftover"
mv "$manifest.tmp" "$manifest"  # written last: its "# inputs:" line marks the folder complete
say "$(ls "$dir"/*.jar | wc -l) jars in $((SECONDS - start)) s for ${roots[*]}"
echo "$dir"
