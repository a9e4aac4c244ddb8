#!/usr/bin/env bash
# A local HDFS for headrace's state dirs on Hadoop file systems: one NameNode and one DataNode on
# 127.0.0.1, in one JVM (Hadoop's MiniDFSCluster, started by Hadoop's MiniHadoopClusterManager without
# its MapReduce and YARN parts), run from Apache Hadoop's own jars on Maven Central
# (org.apache.hadoop:hadoop-client-minicluster, fetched once with mvn into a cache folder) at the Hadoop
# version pyspark bundles. Safe to run any number of times.
#
# Usage: bash scripts/hdfs.sh start [--port PORT] [--dir DIR]
#        bash scripts/hdfs.sh stop [--dir DIR]
#        bash scripts/hdfs.sh status [--dir DIR]
#   start   starts the NameNode and DataNode, waits until the NameNode is out of safe mode, then prints the
#           file system's URI (hdfs://127.0.0.1:PORT) on stdout; when it runs already it only prints it (a
#           bare start takes whatever runs in DIR). The data is kept across stop/start (formatted only when
#           DIR has none).
#   stop    stops it (SIGTERM, then SIGKILL after 30 s); the data stays in DIR.
#   status  prints the URI and exits 0 when it runs; exits 3 when it does not.
#   --port  the NameNode's RPC port (default 8020); its web UI and the DataNode's ports are chosen free.
#   --dir   data (DIR/data), pid file (hdfs.pid), Hadoop's log (hdfs.log) and the JVM's output (hdfs.out);
#           default ${HEADRACE_HDFS_DIR:-/tmp/headrace-hdfs}
#   env     HEADRACE_HADOOP_VERSION (default: the version of pyspark's jars/hadoop-client-api-*.jar),
#           HEADRACE_PYTHON (the Python whose pyspark says it; default .venv/bin/python, else python3),
#           HEADRACE_HDFS_CACHE (default ~/.cache/headrace/hdfs), HEADRACE_M2 (Maven's local repository,
#           default ~/.cache/headrace/m2, as scripts/fetch_jars.sh), JAVA_HOME, HDFS_HEAP_OPTS (default -Xmx512m).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${HEADRACE_HDFS_DIR:-/tmp/headrace-hdfs}
python=${HEADRACE_PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=$(command -v python3 || true)
m2=${HEADRACE_M2:-$HOME/.cache/headrace/m2}
heap=${HDFS_HEAP_OPTS:--Xmx512m}
java=${JAVA_HOME:+$JAVA_HOME/bin/}java
host=127.0.0.1

say() { echo "hdfs: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2; }

cmd=${1:-}
[ $# -gt 0 ] && shift
port=8020 asked=  # asked: --port given
while [ $# -gt 0 ]; do
  case $1 in
    --port) port=$2; asked=1; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) die "unknown argument $1 (usage: hdfs.sh start|stop|status [--port PORT] [--dir DIR])" ;;
  esac
done
[[ $port =~ ^[0-9]+$ ]] || die "--port must be a number"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
data=$dir/data
details=$dir/details.json  # written by MiniHadoopClusterManager once the cluster is up
saved_port() { cat "$dir/port" 2>/dev/null || true; }

# --- the running JVM -----------------------------------------------------------------------------
running_pid() {  # pid of the cluster's JVM if it runs (its command line names $data), else fails
  local pid
  pid=$(cat "$dir/hdfs.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -qF "hdfs.minidfs.basedir=$data " \
    && echo "$pid"
}
listening() { (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }

# --- Hadoop's jars -------------------------------------------------------------------------------
# shellcheck source=scripts/maven.sh
source "$(dirname "$0")/maven.sh"  # need_mvn, copy_with_dependencies

hadoop_version() {  # the Hadoop pyspark bundles: its jars/hadoop-client-api-<version>.jar
  if [ -n "${HEADRACE_HADOOP_VERSION:-}" ]; then echo "$HEADRACE_HADOOP_VERSION"; return 0; fi
  [ -n "$python" ] || die "needs Python with pyspark (set HEADRACE_PYTHON), or HEADRACE_HADOOP_VERSION"
  local jars
  jars=$("$python" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))') \
    || die "$python cannot import pyspark; set HEADRACE_PYTHON or HEADRACE_HADOOP_VERSION"
  local found
  found=$(ls "$jars" | sed -n 's/^hadoop-client-api-\(.*\)\.jar$/\1/p' | head -1)
  [ -n "$found" ] || die "no hadoop-client-api jar in $jars; set HEADRACE_HADOOP_VERSION"
  echo "$found"
}

fetch_libs() {  # hadoop-client-minicluster (with hadoop-client-api and -runtime) and a log binding, into $libs
  [ -f "$libs/.complete" ] && return 0
  need_mvn
  local t0=$SECONDS
  say "fetching Apache Hadoop $version's minicluster jars from Maven Central into $libs"
  rm -rf "$libs.tmp"
  copy_with_dependencies "$cache" "$libs.tmp" "$m2" "Hadoop $version" \
    "org.apache.hadoop:hadoop-client-minicluster:$version"
  # Hadoop logs through slf4j; without a binding it logs nothing. Hadoop's own binding is
  # slf4j-reload4j, at the slf4j-api version Hadoop depends on (reload4j comes with it).
  local slf4j
  slf4j=$(ls "$libs.tmp" | sed -n 's/^slf4j-api-\(.*\)\.jar$/\1/p' | head -1)
  [ -n "$slf4j" ] || die "no slf4j-api among Hadoop $version's dependencies"
  copy_with_dependencies "$cache/log" "$libs.tmp" "$m2" "slf4j-reload4j $slf4j" "org.slf4j:slf4j-reload4j:$slf4j"
  touch "$libs.tmp/.complete"
  rm -rf "$libs" && mv "$libs.tmp" "$libs"
  say "fetched $(ls "$libs" | wc -l) jars in $((SECONDS - t0)) s"
}

write_log_config() {
  cat > "$dir/log4j.properties" <<EOF
# Written by headrace's scripts/hdfs.sh: Hadoop's log in $dir/hdfs.log
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$dir/hdfs.log
log4j.appender.file.Append=true
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d{ISO8601} %p %c{1}: %m%n
log4j.logger.org.apache.hadoop.mapreduce.MiniHadoopClusterManager=INFO
log4j.logger.org.apache.hadoop.hdfs.MiniDFSCluster=INFO
EOF
}

in_safe_mode() {  # exit 0 while the NameNode is in safe mode or does not answer
  ! "$java" -Xmx128m -XX:TieredStopAtLevel=1 -Dlog4j.configuration="file:$dir/log4j.properties" -cp "$libs/*" \
    org.apache.hadoop.hdfs.tools.DFSAdmin -fs "hdfs://$host:$port" -safemode get 2>/dev/null | grep -q 'OFF'
}

# --- commands ------------------------------------------------------------------------------------
start() {
  local t0=$SECONDS pid
  if pid=$(running_pid); then
    if [ -n "$asked" ] && [ "$(saved_port)" != "$port" ]; then
      die "already running in $dir on port $(saved_port); stop it first (hdfs.sh stop --dir $dir)"
    fi
    echo "hdfs://$host:$(saved_port)"
    return 0
  fi
  listening "$port" && die "port $host:$port is taken by another process (see: ss -ltnp 'sport = :$port'); use --port"
  command -v "$java" >/dev/null || die "needs Java 17+ (apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
  version=$(hadoop_version)
  cache=${HEADRACE_HDFS_CACHE:-$HOME/.cache/headrace/hdfs}/$version
  libs=$cache/libs
  fetch_libs
  write_log_config

  local format=
  [ -d "$data/name-0-1/current" ] || { format=-format; rm -rf "$data"; }
  rm -f "$details"
  echo "$port" > "$dir/port"
  echo "$version" > "$dir/version"
  # shellcheck disable=SC2086  # $heap and $format are lists of options
  setsid nohup "$java" $heap -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dlog4j.configuration="file:$dir/log4j.properties" -cp "$libs/*" \
    org.apache.hadoop.mapreduce.MiniHadoopClusterManager -nomr -datanodes 1 -nnport "$port" $format \
    -writeDetails "$details" -D "hdfs.minidfs.basedir=$data" -D dfs.replication=1 \
    > "$dir/hdfs.out" 2>&1 < /dev/null &
  local launched=$!  # setsid and nohup exec java: the same pid, whose command line names $data once they have
  echo "$launched" > "$dir/hdfs.pid"

  # Up when the manager has written its details (NameNode and DataNode started) and safe mode is off.
  local deadline=$((SECONDS + 180))
  until [ -s "$details" ] && ! in_safe_mode; do
    if ! kill -0 "$launched" 2>/dev/null; then
      tail -30 "$dir/hdfs.log" "$dir/hdfs.out" >&2 2>/dev/null || true
      die "the cluster's JVM exited while starting; its log: $dir/hdfs.log"
    fi
    if [ $SECONDS -ge $deadline ]; then
      kill -TERM "$launched" 2>/dev/null || true
      die "HDFS not up on $host:$port after 180 s (stopped it); see $dir/hdfs.log"
    fi
    sleep 1
  done
  say "HDFS (Hadoop $version) up in $((SECONDS - t0)) s${format:+ (formatted)}: data and logs in $dir"
  echo "hdfs://$host:$port"
}

stop() {
  local pid
  if ! pid=$(running_pid); then say "not running ($dir)"; return 0; fi
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then say "pid $pid still up after 30 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    sleep 0.2
  done
  rm -f "$dir/hdfs.pid" "$details"
  say "stopped ($dir)"
}

status() {
  if ! running_pid >/dev/null; then say "not running ($dir)"; return 3; fi
  say "HDFS (Hadoop $(cat "$dir/version" 2>/dev/null)) running, data and logs in $dir"
  echo "hdfs://$host:$(saved_port)"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
