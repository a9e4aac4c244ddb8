#!/usr/bin/env bash
# A local RabbitMQ with the stream plugin, for headrace's RabbitMQ Streams source and sink: Debian's
# rabbitmq-server (installed with apt-get when missing), run as a node of its own
# (RABBITMQ_NODENAME=headrace-rabbit@localhost, data and logs under /tmp/headrace-rabbitmq), detached,
# listening on 127.0.0.1 only: AMQP on 5672, the stream protocol on 5552 (advertised as 127.0.0.1:5552,
# the address the stream protocol tells clients to connect to). guest/guest works from localhost.
# Safe to run any number of times.
#
# Usage: bash scripts/rabbitmq.sh start|stop|status
#   start   starts the node unless a stream listener answers on 127.0.0.1:5552 already (then it says
#           nothing), and prints the stream URL (rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f) on stdout.
#   stop    stops the node this script started.
#   status  prints the URL and exits 0 when a stream listener answers; exits 3 when none does.
#   env     HEADRACE_RABBITMQ_DIR (default /tmp/headrace-rabbitmq), HEADRACE_RABBITMQ_PORT (AMQP,
#           default 5672), HEADRACE_RABBITMQ_STREAM_PORT (default 5552)
set -euo pipefail

dir=${HEADRACE_RABBITMQ_DIR:-/tmp/headrace-rabbitmq}
amqp_port=${HEADRACE_RABBITMQ_PORT:-5672}
port=${HEADRACE_RABBITMQ_STREAM_PORT:-5552}
host=127.0.0.1
node=headrace-rabbit@localhost
url="rabbitmq-stream://guest:guest@$host:$port/%2f"
bin=/usr/lib/rabbitmq/bin

say() { echo "rabbitmq: $*" >&2; }
die() { say "$*"; exit 1; }

answers() {  # a stream listener on host:port replies to PeerProperties (key 17) with key 0x8011
  (
    exec 3<>"/dev/tcp/$host/$port" || exit 1
    printf '\x00\x00\x00\x0c\x00\x11\x00\x01\x00\x00\x00\x01\x00\x00\x00\x00' >&3
    reply=$(timeout 3 head -c 6 <&3 | od -An -tx1 | tr -d ' \n')
    [ "${reply:8:4}" = "8011" ]
  ) 2>/dev/null
}
listening() { (exec 3<>"/dev/tcp/$host/$1") 2>/dev/null; }

node_env() {
  export RABBITMQ_NODENAME=$node RABBITMQ_BASE=$dir RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log \
    RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins \
    RABBITMQ_PID_FILE=$dir/rabbitmq.pid RABBITMQ_NODE_IP_ADDRESS=$host RABBITMQ_NODE_PORT=$amqp_port \
    ERL_EPMD_ADDRESS=$host HOME=$dir
}
ctl() { node_env; "$bin/rabbitmqctl" -n "$node" "$@"; }
our_pid() {  # pid of the node this script started, if it runs
  local pid
  pid=$(cat "$dir/rabbitmq.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q -- "-home $dir " && echo "$pid"
}

install() {
  [ "$(id -u)" = 0 ] || die "rabbitmq-server is not installed and this user is not root: cannot apt-get install it"
  command -v apt-get >/dev/null 2>&1 || die "rabbitmq-server is not installed and there is no apt-get here: install RabbitMQ yourself"
  say "installing rabbitmq-server (apt-get)"
  local tries=0
  until { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server; } >"$dir/apt.log" 2>&1; do
    tries=$((tries + 1))
    [ $tries -lt 6 ] || die "apt-get install rabbitmq-server failed; see $dir/apt.log"
    say "apt-get failed (another apt may hold dpkg's lock): trying again in 10 s"
    sleep 10
  done
  # Debian's package may start its own service (not where policy-rc.d forbids it): it listens on all
  # interfaces without the stream plugin, so stop it and run the node below.
  service rabbitmq-server stop >/dev/null 2>&1 || true
}

configure() {
  mkdir -p "$dir/log" "$dir/mnesia"
  cat > "$dir/rabbitmq.conf" <<EOF
# Written by headrace's scripts/rabbitmq.sh.
listeners.tcp.default = $host:$amqp_port
stream.listeners.tcp.default = $host:$port
stream.advertised_host = $host
stream.advertised_port = $port
distribution.listener.interface = $host
loopback_users.guest = true
log.file.level = warning
log.console = false
EOF
  echo '[rabbitmq_stream].' > "$dir/enabled_plugins"
  # The Erlang cookie rabbitmqctl shares with the node (HOME is $dir for both).
  [ -s "$dir/.erlang.cookie" ] || { head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$dir/.erlang.cookie"; }
  chmod 400 "$dir/.erlang.cookie"
}

start() {
  if answers; then echo "$url"; return 0; fi
  listening "$port" && die "port $host:$port is taken by a process that is not a RabbitMQ stream listener (see: ss -ltnp 'sport = :$port')"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [ -x "$bin/rabbitmq-server" ] || install
  if answers; then echo "$url"; return 0; fi
  listening "$amqp_port" && die "port $host:$amqp_port (AMQP) is taken by another process (see: ss -ltnp 'sport = :$amqp_port')"
  configure
  if ! our_pid >/dev/null; then
    (node_env; cd "$dir" && "$bin/rabbitmq-server" -detached >"$dir/log/start.out" 2>&1) \
      || die "rabbitmq-server -detached failed; see $dir/log/start.out"
  fi
  local deadline=$((SECONDS + 120))
  until answers; do
    if [ $SECONDS -ge $deadline ]; then
      tail -20 "$dir"/log/*.log >&2 2>/dev/null || true
      die "RabbitMQ's stream listener does not answer on $host:$port after 120 s; see $dir/log"
    fi
    sleep 0.5
  done
  say "RabbitMQ up: streams on $host:$port, AMQP on $host:$amqp_port, node $node, data in $dir"
  echo "$url"
}

stop() {
  local pid
  if ! pid=$(our_pid); then
    if answers; then say "the RabbitMQ on $host:$port was not started by this script ($dir): left running"
    else say "not running ($dir)"; fi
    return 0
  fi
  ctl stop >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 60))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then say "pid $pid still up after 60 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    sleep 0.5
  done
  say "stopped ($dir)"
}

status() {
  if ! answers; then say "not running on $host:$port"; return 3; fi
  if our_pid >/dev/null; then say "running, node $node, data in $dir"; else say "a RabbitMQ not started by this script answers on $host:$port"; fi
  echo "$url"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
esac
