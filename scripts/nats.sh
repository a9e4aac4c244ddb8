#!/usr/bin/env bash
# A local NATS server with JetStream for headrace's NATS source and sink: Debian's nats-server
# (installed with apt-get when missing), on 127.0.0.1:4222, JetStream on (-js), its store under
# /tmp/headrace-nats, so streams survive the server's own restart. Safe to run any number of times.
#
# Usage: bash scripts/nats.sh start|stop|status
#   start   starts the server unless a NATS server with JetStream answers on 127.0.0.1:PORT already
#           (then it says nothing), and prints its URL (nats://127.0.0.1:4222) on stdout.
#   stop    stops the server this script started (SIGTERM: JetStream flushes its store).
#   status  prints the URL and exits 0 when a NATS server with JetStream answers; exits 3 when none does.
#   env     HEADRACE_NATS_DIR (store, log and pid file; default /tmp/headrace-nats),
#           HEADRACE_NATS_PORT (default 4222)
set -euo pipefail

dir=${HEADRACE_NATS_DIR:-/tmp/headrace-nats}
port=${HEADRACE_NATS_PORT:-4222}
host=127.0.0.1
url=nats://$host:$port
PATH=$PATH:/usr/sbin  # where Debian puts nats-server

say() { echo "nats: $*" >&2; }
die() { say "$*"; exit 1; }

info() {  # the INFO line a NATS server sends first on a new connection
  (
    exec 3<>"/dev/tcp/$host/$port" || exit 1
    IFS= read -r -t 2 line <&3 || exit 1
    printf '%s\n' "$line"
  ) 2>/dev/null
}
answers() { info | grep -q '^INFO .*"jetstream":true'; }
listening() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }
our_pid() {  # pid of the server this script started in $dir, if it runs
  local pid
  pid=$(cat "$dir/nats.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q nats-server && echo "$pid"
}

install() {
  [ "$(id -u)" = 0 ] || die "nats-server is not installed and this user is not root: cannot apt-get install it"
  command -v apt-get >/dev/null 2>&1 || die "nats-server is not installed and there is no apt-get here: install nats-server yourself"
  say "installing nats-server (apt-get)"
  local attempt
  for attempt in 1 2 3 4 5 6; do  # another apt-get may hold dpkg's lock for a while
    if apt-get update -qq >/dev/null 2>&1 \
       && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >/dev/null 2>&1; then
      return 0
    fi
    say "apt-get failed (attempt $attempt; dpkg's lock may be held): retrying in 10 s"
    sleep 10
  done
  die "apt-get install nats-server failed"
}

start() {
  if answers; then echo "$url"; return 0; fi
  if listening; then
    if info | grep -q '^INFO '; then
      die "a NATS server without JetStream answers on $host:$port: restart it with -js"
    fi
    die "port $host:$port is taken by a process that is not a NATS server (see: ss -ltnp 'sport = :$port')"
  fi
  command -v nats-server >/dev/null 2>&1 || install
  mkdir -p "$dir/store"
  dir=$(cd "$dir" && pwd)
  # nats-server does not daemonize itself on Linux: a session of its own, detached from ours.
  setsid nats-server -a "$host" -p "$port" -js -sd "$dir/store" -P "$dir/nats.pid" -l "$dir/nats.log" \
    </dev/null >/dev/null 2>&1 &
  local deadline=$((SECONDS + 30))
  until answers; do
    if [ $SECONDS -ge $deadline ]; then
      tail -20 "$dir/nats.log" >&2 2>/dev/null || true
      die "NATS does not answer on $host:$port after 30 s; see $dir/nats.log"
    fi
    sleep 0.2
  done
  say "nats-server $(nats-server --version 2>/dev/null | sed -n 's/.*v\([0-9.]*\).*/\1/p') up on $host:$port, JetStream store in $dir/store"
  echo "$url"
}

stop() {
  local pid
  if ! pid=$(our_pid); then
    if answers; then say "the NATS server on $host:$port was not started by this script ($dir): left running"
    else say "not running ($dir)"; fi
    return 0
  fi
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then say "pid $pid still up after 30 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    sleep 0.2
  done
  say "stopped ($dir)"
}

status() {
  if ! answers; then say "no NATS server with JetStream on $host:$port"; return 3; fi
  if our_pid >/dev/null; then say "running, JetStream store in $dir/store"; else say "a NATS server not started by this script answers on $host:$port"; fi
  echo "$url"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
esac
