#!/usr/bin/env bash
# A local Apache Kafka for headrace's Kafka source and sinks: 1 or 3 combined broker+controller nodes
# in KRaft mode on 127.0.0.1, run from Kafka's own jars on Maven Central (fetched once with mvn into a
# cache folder). Safe to run any number of times.
#
# Usage: bash scripts/kafka.sh start [--brokers 1|3] [--dir DIR] [--port PORT]
#        bash scripts/kafka.sh stop [--dir DIR]
#        bash scripts/kafka.sh status [--dir DIR]
#   start   starts the nodes and waits until a topic can be created, then prints the bootstrap servers
#           (127.0.0.1:9092, or 127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094) on stdout; when they run
#           already it only prints them (a bare start takes whatever runs in DIR). The data is kept
#           across stop/start with the same --brokers and --port, and wiped when they change.
#   stop    stops the nodes (SIGTERM, then SIGKILL after 30 s); the data stays in DIR.
#   status  prints the bootstrap servers and exits 0 when every node runs; exits 3 when none runs.
#   --dir   data, configs and logs (node-N/server.log); default ${HEADRACE_KAFKA_DIR:-/tmp/headrace-kafka}
#   --port  node N's broker port is PORT+N-1 (default PORT 9092), its controller port PORT+100+N-1.
#   env     HEADRACE_KAFKA_VERSION (default 4.3.1: Maven Central lacks kafka-tools 4.4.0), JAVA_HOME,
#           HEADRACE_KAFKA_CACHE (default ~/.cache/headrace/kafka), KAFKA_HEAP_OPTS (default -Xmx512m -Xms128m),
#           HEADRACE_M2 (Maven's local repository, default ~/.cache/headrace/m2, as scripts/fetch_jars.sh)
set -euo pipefail

version=${HEADRACE_KAFKA_VERSION:-4.3.1}
cache=${HEADRACE_KAFKA_CACHE:-$HOME/.cache/headrace/kafka}/$version
libs=$cache/libs
m2=${HEADRACE_M2:-$HOME/.cache/headrace/m2}
dir=${HEADRACE_KAFKA_DIR:-/tmp/headrace-kafka}
heap=${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m}
java=${JAVA_HOME:+$JAVA_HOME/bin/}java
host=127.0.0.1
ready_topic=headrace-ready

say() { echo "kafka: $*" >&2; }
die() { say "$*"; exit 1; }

cmd=${1:-}
[ $# -gt 0 ] && shift
brokers=1 port=9092 asked=  # asked: --brokers or --port given
while [ $# -gt 0 ]; do
  case $1 in
    --brokers) brokers=$2; asked=1; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --port) port=$2; asked=1; shift 2 ;;
    *) die "unknown argument $1 (usage: kafka.sh start|stop|status [--brokers 1|3] [--dir DIR] [--port PORT])" ;;
  esac
done
case $brokers in 1|3) ;; *) die "--brokers must be 1 or 3" ;; esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
layout=$dir/cluster.env  # BROKERS PORT VERSION CLUSTER_ID of the cluster whose data is in $dir

# --- the running nodes ---------------------------------------------------------------------------
node_pid() {  # pid of node $1 if it runs (its command line names its server.properties), else fails
  local pid
  pid=$(cat "$dir/node-$1/kafka.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -qF "$dir/node-$1/server.properties" \
    && echo "$pid"
}
listening() { (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }
saved() { if [ -f "$layout" ]; then sed -n "s/^$1=//p" "$layout"; fi; }
bootstrap_of() {  # brokers port
  local i out=
  for ((i = 0; i < $1; i++)); do out+="${out:+,}$host:$(($2 + i))"; done
  echo "$out"
}
running_count() {
  local n i c=0
  n=$(saved BROKERS)
  for ((i = 1; i <= ${n:-0}; i++)); do node_pid "$i" >/dev/null && c=$((c + 1)); done
  echo "$c"
}

# --- Kafka's jars --------------------------------------------------------------------------------
# shellcheck source=scripts/maven.sh
source "$(dirname "$0")/maven.sh"  # need_mvn, copy_with_dependencies

fetch_libs() {  # kafka_2.13 (the broker), kafka-tools (TopicCommand) and a log4j binding, into $libs
  [ -f "$libs/.complete" ] && return 0
  need_mvn
  local t0=$SECONDS
  say "fetching Apache Kafka $version's jars from Maven Central into $libs"
  rm -rf "$libs.tmp"
  copy_with_dependencies "$cache" "$libs.tmp" "$m2" "Kafka $version" \
    "org.apache.kafka:kafka_2.13:$version" "org.apache.kafka:kafka-tools:$version"
  # Kafka logs through slf4j 1.x; its distribution adds log4j's binding, at the log4j-core version.
  local log4j
  log4j=$(ls "$libs.tmp" | sed -n 's/^log4j-core-\(.*\)\.jar$/\1/p' | head -1)
  [ -n "$log4j" ] || die "no log4j-core among Kafka $version's dependencies"
  mvn -B -q -Dmaven.repo.local="$m2" "$DEPENDENCY_PLUGIN:copy" -Dartifact="org.apache.logging.log4j:log4j-slf4j-impl:$log4j" \
    -DoutputDirectory="$libs.tmp" > "$cache/mvn.log" 2>&1 \
    || { tail -20 "$cache/mvn.log" >&2; die "mvn could not fetch log4j-slf4j-impl $log4j"; }
  touch "$libs.tmp/.complete"
  rm -rf "$libs" && mv "$libs.tmp" "$libs"
  say "fetched $(ls "$libs" | wc -l) jars in $((SECONDS - t0)) s"
}

run_java() {  # a Kafka tool in the foreground, quiet unless it fails
  "$java" -Xmx256m -XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile="$dir/tools-log4j2.properties" \
    -cp "$libs/*" "$@"
}

# --- configuration -------------------------------------------------------------------------------
new_cluster_id() {  # a random Kafka Uuid: 16 bytes, base64url without padding, not starting with '-'
  local id
  while :; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
    [ "${id:0:1}" != - ] && break
  done
  echo "$id"
}

write_configs() {
  local n=$brokers isr=$((brokers < 2 ? 1 : 2)) voters='' i
  for ((i = 1; i <= n; i++)); do voters+="${voters:+,}$i@$host:$((port + 100 + i - 1))"; done
  for ((i = 1; i <= n; i++)); do
    local node=$dir/node-$i bp=$((port + i - 1)) cp=$((port + 100 + i - 1))
    mkdir -p "$node"
    cat > "$node/server.properties" <<EOF
# Written by headrace's scripts/kafka.sh: node $i of $n, broker and controller, KRaft mode.
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://$host:$bp,CONTROLLER://$host:$cp
advertised.listeners=PLAINTEXT://$host:$bp
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$node/data
num.network.threads=2
num.io.threads=4
num.partitions=1
default.replication.factor=$n
min.insync.replicas=1
auto.create.topics.enable=true
offsets.topic.replication.factor=$n
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=$n
transaction.state.log.min.isr=$isr
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=$n
share.coordinator.state.topic.min.isr=$isr
group.initial.rebalance.delay.ms=0
# Keep every record whatever its timestamp: tests and examples write records stamped on fixed,
# long-past days, which a time-based retention would delete from under a running pipeline.
log.retention.ms=-1
EOF
  done
  cat > "$dir/log4j2.properties" <<'EOF'
# The nodes' log: node-N/server.log (kafka.logs.dir is set per node)
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.state.name = state.change.logger
logger.state.level = WARN
EOF
  cat > "$dir/tools-log4j2.properties" <<'EOF'
status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = err
EOF
}

storage_tool() {  # kafka.tools.StorageTool up to Kafka 4.x; org.apache.kafka.tools.StorageTool later
  if LC_ALL=C grep -qa 'org/apache/kafka/tools/StorageTool.class' "$libs"/kafka-tools-*.jar "$libs"/kafka-storage-*.jar 2>/dev/null; then
    echo org.apache.kafka.tools.StorageTool
  else
    echo kafka.tools.StorageTool
  fi
}

# --- commands ------------------------------------------------------------------------------------
start() {
  local t0=$SECONDS i n running
  running=$(running_count)
  if [ "$running" -gt 0 ]; then
    n=$(saved BROKERS)
    if [ -z "$asked" ]; then brokers=$n port=$(saved PORT); fi  # a bare start takes what runs
    if [ "$n" != "$brokers" ] || [ "$(saved PORT)" != "$port" ]; then
      die "already running in $dir with $n node(s) from port $(saved PORT); stop it first (kafka.sh stop --dir $dir)"
    fi
    if [ "$running" = "$n" ]; then bootstrap_of "$n" "$port"; return 0; fi
    say "$running of $n nodes run; starting the others"
  fi
  for ((i = 1; i <= brokers; i++)); do
    node_pid "$i" >/dev/null && continue
    for p in $((port + i - 1)) $((port + 100 + i - 1)); do
      listening "$p" && die "port $host:$p is taken by another process (see: ss -ltnp 'sport = :$p'); use --port"
    done
  done
  if [ -f "$layout" ] && [ "$(saved BROKERS) $(saved PORT) $(saved VERSION)" != "$brokers $port $version" ]; then
    say "the data in $dir is for another layout ($(saved BROKERS) node(s), port $(saved PORT), Kafka $(saved VERSION)): starting afresh"
    rm -rf "$dir"/node-* "$layout"
  fi
  command -v "$java" >/dev/null || die "needs Java 17+ (apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
  fetch_libs

  local cid
  cid=$(saved CLUSTER_ID)
  [ -n "$cid" ] || cid=$(new_cluster_id)
  write_configs
  printf 'BROKERS=%s\nPORT=%s\nVERSION=%s\nCLUSTER_ID=%s\n' "$brokers" "$port" "$version" "$cid" > "$layout"
  local tool
  tool=$(storage_tool)
  for ((i = 1; i <= brokers; i++)); do
    local node=$dir/node-$i
    [ -f "$node/data/meta.properties" ] && continue
    run_java "$tool" format -t "$cid" -c "$node/server.properties" --ignore-formatted > "$node/format.log" 2>&1 \
      || { cat "$node/format.log" >&2; die "formatting $node/data failed"; }
  done

  for ((i = 1; i <= brokers; i++)); do
    local node=$dir/node-$i
    node_pid "$i" >/dev/null && continue
    # shellcheck disable=SC2086  # $heap is a list of options
    setsid nohup "$java" $heap -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
      -Dkafka.logs.dir="$node" -Dlog4j2.configurationFile="$dir/log4j2.properties" \
      -cp "$libs/*" kafka.Kafka "$node/server.properties" > "$node/kafka.out" 2>&1 < /dev/null &
    echo $! > "$node/kafka.pid"
  done

  # Up when every broker port accepts connections and a topic replicated on every node can be made.
  local deadline=$((SECONDS + 120)) bootstrap
  bootstrap=$(bootstrap_of "$brokers" "$port")
  for ((i = 1; i <= brokers; i++)); do
    until listening $((port + i - 1)); do
      # the process itself, not node_pid: just after the fork its command line is still this shell's
      if ! kill -0 "$(cat "$dir/node-$i/kafka.pid" 2>/dev/null)" 2>/dev/null; then
        tail -30 "$dir/node-$i/server.log" "$dir/node-$i/kafka.out" >&2 2>/dev/null || true
        die "node $i exited while starting; its log: $dir/node-$i/server.log"
      fi
      [ $SECONDS -lt $deadline ] || die "node $i does not listen on $host:$((port + i - 1)) after 120 s; see $dir/node-$i/server.log"
      sleep 0.3
    done
  done
  until run_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create --if-not-exists \
      --topic "$ready_topic" --partitions 1 --replication-factor "$brokers" > "$dir/ready.log" 2>&1; do
    [ $SECONDS -lt $deadline ] || { cat "$dir/ready.log" >&2; die "cannot create a topic on $bootstrap after 120 s"; }
    sleep 1
  done
  echo "$bootstrap" > "$dir/bootstrap.txt"
  say "Kafka $version up: $brokers node(s) in $((SECONDS - t0)) s, data and logs in $dir"
  echo "$bootstrap"
}

stop() {
  local n i pid pids=()
  n=$(saved BROKERS)
  for ((i = 1; i <= ${n:-0}; i++)); do
    if pid=$(node_pid "$i"); then kill -TERM "$pid" 2>/dev/null && pids+=("$pid"); fi
  done
  if [ ${#pids[@]} = 0 ]; then say "not running ($dir)"; return 0; fi
  local deadline=$((SECONDS + 30))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then say "pid $pid still up after 30 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
      sleep 0.2
    done
  done
  rm -f "$dir"/node-*/kafka.pid
  say "stopped ${#pids[@]} node(s) ($dir)"
}

status() {
  local n running
  n=$(saved BROKERS)
  running=$(running_count)
  if [ -z "$n" ] || [ "$running" = 0 ]; then say "not running ($dir)"; return 3; fi
  say "Kafka $(saved VERSION): $running of $n node(s) running, data and logs in $dir"
  bootstrap_of "$n" "$(saved PORT)"
  [ "$running" = "$n" ] || return 1
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
esac
