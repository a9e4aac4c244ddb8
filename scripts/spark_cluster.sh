#!/usr/bin/env bash
# A local Spark standalone cluster for headrace's cluster tests: one master and N workers on
# 127.0.0.1, run from the installed pyspark package (its bin/spark-class and jars; no Spark download).
# Safe to run any number of times.
#
# Usage: bash scripts/spark_cluster.sh start [--workers N] [--port PORT] [--memory MEM] [--dir DIR]
#        bash scripts/spark_cluster.sh stop [--dir DIR]
#        bash scripts/spark_cluster.sh status [--dir DIR]
#        bash scripts/spark_cluster.sh kill-worker N [--dir DIR]
#   start        starts the master and the workers that do not run, waits until the master reports
#                every worker ALIVE, then prints the master URL (spark://127.0.0.1:PORT) on stdout; when
#                all run already it only prints it (a bare start takes what runs in DIR, and starts again
#                a worker that was killed).
#   stop         stops the workers (their executors with them) and the master: SIGTERM, SIGKILL after 30 s.
#   status       prints the master URL and exits 0 when the master and every worker run and are ALIVE;
#                exits 3 when nothing runs, 1 when only some of it does.
#   kill-worker  SIGKILL to worker N's process group: the worker's JVM, the executors it launched and
#                their Python workers, as when a machine is lost. Prints the pid of the worker killed.
#   --workers    how many workers (default 2), each with 1 core and --memory (default 1g) for executors.
#   --port       the master's port (default 7077); its web UI is on PORT+1000 (http://127.0.0.1:8077/json/
#                lists the workers), worker N's web UI on PORT+1000+N.
#   --dir        pid files, logs (master.log, worker-N/worker.log) and the workers' work folders (executor
#                logs: worker-N/work/<app>/<executor>/stderr); default ${HEADRACE_SPARK_CLUSTER_DIR:-/tmp/headrace-spark-cluster}
#   env          HEADRACE_PYTHON: the Python whose pyspark runs the cluster (default .venv/bin/python, else
#                python3); PYSPARK_PYTHON for the executors' Python workers (default that Python);
#                JAVA_HOME; SPARK_DAEMON_MEMORY (the master's and workers' own heap, default 512m).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${HEADRACE_SPARK_CLUSTER_DIR:-/tmp/headrace-spark-cluster}
python=${HEADRACE_PYTHON:-$root/.venv/bin/python}
[ -x "$python" ] || python=$(command -v python3 || true)
host=127.0.0.1

say() { echo "spark-cluster: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2; }

cmd=${1:-}
[ $# -gt 0 ] && shift
victim=
if [ "$cmd" = kill-worker ]; then
  victim=${1:-}
  [ $# -gt 0 ] && shift
  [[ $victim =~ ^[1-9][0-9]*$ ]] || die "kill-worker needs a worker number (1, 2, ...)"
fi
workers=2 port=7077 memory=1g asked=  # asked: --workers or --port given
while [ $# -gt 0 ]; do
  case $1 in
    --workers) workers=$2; asked=1; shift 2 ;;
    --port) port=$2; asked=1; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    *) die "unknown argument $1 (usage: spark_cluster.sh start|stop|status|kill-worker N [--workers N] [--port PORT] [--memory MEM] [--dir DIR])" ;;
  esac
done
[[ $workers =~ ^[1-9][0-9]*$ ]] || die "--workers must be a number of at least 1"
[[ $port =~ ^[0-9]+$ ]] || die "--port must be a number"
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
layout=$dir/cluster.env  # WORKERS PORT of the cluster that runs (or ran) from $dir

saved() { if [ -f "$layout" ]; then sed -n "s/^$1=//p" "$layout"; fi; }
webui_of() { echo $(($1 + 1000)); }  # the master's web UI port for master port $1

# --- the running processes -----------------------------------------------------------------------
# Each daemon is started with setsid: its pid is its process group, which holds the executors and
# Python workers it starts. A pid file counts only while that pid's command line is still ours.
daemon_pid() {  # pid of the daemon whose pid file is $1 and whose command line holds $2, else fails
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -qF -- "$2" && echo "$pid"
}
master_pid() { daemon_pid "$dir/master.pid" "org.apache.spark.deploy.master.Master"; }
worker_pid() { daemon_pid "$dir/worker-$1/worker.pid" "--work-dir $dir/worker-$1/work"; }
listening() { (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }
running_workers() {
  local n i c=0
  n=$(saved WORKERS)
  for ((i = 1; i <= ${n:-0}; i++)); do worker_pid "$i" >/dev/null && c=$((c + 1)); done
  echo "$c"
}

alive_workers() {  # the worker numbers the master's JSON reports ALIVE (each found by its web UI port)
  local webui json
  webui=$(webui_of "$(saved PORT)")
  json=$(curl -sf --max-time 5 "http://$host:$webui/json/" 2>/dev/null) || return 0
  JSON=$json "$python" - "$webui" <<'EOF'
import json, os, sys
state = json.loads(os.environ["JSON"])
webui = int(sys.argv[1])
for worker in state.get("workers", []):
    if worker.get("state") == "ALIVE":
        port = int(str(worker.get("webuiaddress", "")).rsplit(":", 1)[-1] or 0)
        if port > webui:
            print(port - webui)
EOF
}

all_alive() {  # every worker 1..WORKERS runs and is ALIVE in the master's view
  local n i alive
  n=$(saved WORKERS)
  alive=" $(alive_workers | tr '\n' ' ') "
  for ((i = 1; i <= n; i++)); do
    worker_pid "$i" >/dev/null && [[ $alive == *" $i "* ]] || return 1
  done
}

# --- starting ------------------------------------------------------------------------------------
spark_home() {
  [ -n "$python" ] || die "no Python found: set HEADRACE_PYTHON to a Python with pyspark installed"
  "$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null \
    || die "$python has no pyspark (bash scripts/setup.sh installs it into .venv; or set HEADRACE_PYTHON)"
}

launch() {  # pidfile logfile class args...: spark-class in the background, in a session of its own
  local pidfile=$1 log=$2 class=$3 pid
  shift 2
  setsid nohup "$SPARK_HOME/bin/spark-class" "$@" > "$log" 2>&1 < /dev/null &
  pid=$!
  echo "$pid" > "$pidfile"
  # Until the child has replaced itself with spark-class, its command line is still this script's
  # and the daemon checks (daemon_pid) would take it for a daemon that exited while starting.
  while kill -0 "$pid" 2>/dev/null && ! tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -qF -- "$class"; do
    sleep 0.05
  done
}

start() {
  local t0=$SECONDS i n
  if master_pid >/dev/null; then
    n=$(saved WORKERS)
    if [ -z "$asked" ]; then workers=$n port=$(saved PORT); fi  # a bare start takes what runs
    if [ "$(saved PORT)" != "$port" ]; then
      die "a master runs in $dir on port $(saved PORT); stop it first (spark_cluster.sh stop --dir $dir)"
    fi
    if [ "$n" = "$workers" ] && [ "$(running_workers)" = "$n" ] && all_alive; then
      echo "spark://$host:$port"; return 0
    fi
  fi
  local webui
  webui=$(webui_of "$port")
  command -v "${JAVA_HOME:+$JAVA_HOME/bin/}java" >/dev/null \
    || die "needs Java 17+ (apt-get install openjdk-17-jre-headless, or set JAVA_HOME)"
  SPARK_HOME=$(spark_home)
  export SPARK_HOME SPARK_LOCAL_IP=$host SPARK_DAEMON_MEMORY=${SPARK_DAEMON_MEMORY:-512m}
  export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$python} SPARK_NO_DAEMONIZE=1
  # Workers of a former layout with more workers than asked now: stop the extra ones.
  for ((i = workers + 1; i <= ${n:-0}; i++)); do
    local extra
    if extra=$(worker_pid "$i"); then kill -TERM -- "-$extra" 2>/dev/null || true; fi
  done
  printf 'WORKERS=%s\nPORT=%s\nSPARK_HOME=%s\nPYSPARK_PYTHON=%s\n' "$workers" "$port" "$SPARK_HOME" \
    "$PYSPARK_PYTHON" > "$layout"

  if ! master_pid >/dev/null; then
    for p in "$port" "$webui"; do
      listening "$p" && die "port $host:$p is taken by another process (see: ss -ltnp 'sport = :$p'); use --port"
    done
    launch "$dir/master.pid" "$dir/master.log" org.apache.spark.deploy.master.Master \
      --host "$host" --port "$port" --webui-port "$webui"
  fi
  local deadline=$((SECONDS + 120))
  until listening "$port" && curl -sf --max-time 5 "http://$host:$webui/json/" >/dev/null 2>&1; do
    master_pid >/dev/null || { tail -30 "$dir/master.log" >&2; die "the master exited while starting; its log: $dir/master.log"; }
    [ $SECONDS -lt $deadline ] || die "the master does not answer on $host:$port after 120 s; see $dir/master.log"
    sleep 0.3
  done

  for ((i = 1; i <= workers; i++)); do
    local node=$dir/worker-$i
    worker_pid "$i" >/dev/null && continue
    listening $((webui + i)) && die "port $host:$((webui + i)) (worker $i's web UI) is taken by another process; use --port"
    mkdir -p "$node/work"
    launch "$node/worker.pid" "$node/worker.log" org.apache.spark.deploy.worker.Worker "spark://$host:$port" \
      --host "$host" --cores 1 --memory "$memory" --webui-port $((webui + i)) --work-dir "$node/work"
  done
  until all_alive; do
    for ((i = 1; i <= workers; i++)); do
      worker_pid "$i" >/dev/null && continue
      tail -30 "$dir/worker-$i/worker.log" >&2 || true
      die "worker $i exited while starting; its log: $dir/worker-$i/worker.log"
    done
    [ $SECONDS -lt $deadline ] || die "the master does not report $workers worker(s) ALIVE after 120 s; see $dir/worker-*/worker.log"
    sleep 0.5
  done
  say "Spark standalone master and $workers worker(s) ALIVE in $((SECONDS - t0)) s (web UI http://$host:$webui, logs in $dir)"
  echo "spark://$host:$port"
}

stop() {
  local n i pid pids=()
  n=$(saved WORKERS)
  for ((i = 1; i <= ${n:-0}; i++)); do
    if pid=$(worker_pid "$i"); then kill -TERM -- "-$pid" 2>/dev/null && pids+=("$pid"); fi
  done
  if pid=$(master_pid); then kill -TERM -- "-$pid" 2>/dev/null && pids+=("$pid"); fi
  if [ ${#pids[@]} = 0 ]; then say "not running ($dir)"; return 0; fi
  local deadline=$((SECONDS + 30))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then say "pid $pid still up after 30 s: SIGKILL"; kill -KILL -- "-$pid" 2>/dev/null || true; fi
      sleep 0.2
    done
  done
  rm -f "$dir/master.pid" "$dir"/worker-*/worker.pid
  say "stopped ${#pids[@]} process(es) ($dir)"
}

status() {
  local n running
  n=$(saved WORKERS)
  if ! master_pid >/dev/null; then
    running=$(running_workers)
    say "no master runs ($dir)${n:+; $running of $n worker(s) run}"
    [ "${running:-0}" = 0 ] && return 3
    return 1
  fi
  running=$(running_workers)
  say "master on $host:$(saved PORT) (web UI http://$host:$(webui_of "$(saved PORT)")), $running of $n worker(s) running, ALIVE: $(alive_workers | tr '\n' ' ')"
  echo "spark://$host:$(saved PORT)"
  all_alive || return 1
}

kill_worker() {
  local pid
  pid=$(worker_pid "$victim") || die "worker $victim does not run ($dir)"
  kill -KILL -- "-$pid"
  say "worker $victim (pid $pid) and its executors killed with SIGKILL"
  echo "$pid"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  status) status ;;
  kill-worker) kill_worker ;;
  *) usage ;;
esac
