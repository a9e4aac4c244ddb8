# Sourced by scripts/fetch_jars.sh, scripts/kafka.sh and scripts/hdfs.sh (which define say and die):
# need_mvn makes sure Maven is there, installing it with apt-get when run as root.
need_mvn() {
  command -v mvn >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing maven (apt-get)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven; } >/dev/null \
      || die "apt-get install maven failed"
  else
    die "needs Maven (mvn): install it (Debian/Ubuntu: apt-get install maven)"
  fi
}

DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.8.1

# copy_with_dependencies WORK OUT M2 WHAT GROUP:ARTIFACT:VERSION...: the artifacts and their
# runtime dependencies from Maven Central into OUT, through a pom written in WORK (its log:
# WORK/mvn.log), with Maven's local repository M2. WHAT names them in the error.
copy_with_dependencies() {
  local work=$1 out=$2 m2=$3 what=$4 coordinate deps="" group artifact version
  shift 4
  for coordinate in "$@"; do
    IFS=: read -r group artifact version <<< "$coordinate"
    deps="$deps<dependency><groupId>$group</groupId><artifactId>$artifact</artifactId><version>$version</version></dependency>"
  done
  mkdir -p "$work"
  cat > "$work/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>
  <groupId>headrace</groupId><artifactId>fetched</artifactId><version>0</version><packaging>pom</packaging>
  <dependencies>$deps</dependencies>
</project>
POM
  mvn -B -q -Dmaven.repo.local="$m2" -f "$work/pom.xml" "$DEPENDENCY_PLUGIN:copy-dependencies" -DincludeScope=runtime \
    -DoutputDirectory="$out" > "$work/mvn.log" 2>&1 \
    || { tail -20 "$work/mvn.log" >&2; die "mvn could not fetch $what (see $work/mvn.log)"; }
}
