#!/usr/bin/env bash
# A local Redis for headrace's Redis Streams source: Debian's redis-server (installed with apt-get when
# missing), on 127.0.0.1:6379, daemonized, append-only file on, so its streams survive its own restart.
# Safe to run any number of times.
#
# Usage: bash scripts/redis.sh start|stop|status
#   start   starts the server unless a Redis answers on 127.0.0.1:PORT already (then it says nothing),
#           and prints its URL (redis://127.0.0.1:6379/0) on stdout.
#   stop    stops the server this script started (SHUTDOWN, which writes the append-only file out).
#   status  prints the URL and exits 0 when a Redis answers; exits 3 when none does.
#   env     HEADRACE_REDIS_DIR (data, config, log and pid file; default /tmp/headrace-redis),
#           HEADRACE_REDIS_PORT (default 6379)
set -euo pipefail

dir=${HEADRACE_REDIS_DIR:-/tmp/headrace-redis}
port=${HEADRACE_REDIS_PORT:-6379}
host=127.0.0.1
url=redis://$host:$port/0

say() { echo "redis: $*" >&2; }
die() { say "$*"; exit 1; }

answers() {  # a Redis on host:port replies +PONG to PING
  (
    exec 3<>"/dev/tcp/$host/$port" || exit 1
    printf 'PING\r\n' >&3
    IFS= read -r -t 2 reply <&3 || exit 1
    [ "${reply%$'\r'}" = "+PONG" ]
  ) 2>/dev/null
}
listening() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }
our_pid() {  # pid of the server this script started in $dir, if it runs
  local pid
  pid=$(cat "$dir/redis.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q redis-server && echo "$pid"
}

install() {
  [ "$(id -u)" = 0 ] || die "redis-server is not installed and this user is not root: cannot apt-get install it"
  command -v apt-get >/dev/null 2>&1 || die "redis-server is not installed and there is no apt-get here: install Redis yourself"
  say "installing redis-server (apt-get)"
  apt-get update -qq >/dev/null || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null \
    || die "apt-get install redis-server failed"
  # Debian's package may start its own service on 6379 (not where systemd and policy-rc.d forbid
  # it): stop it, so that the server below, with its own data dir, takes the port.
  if answers && ! our_pid >/dev/null; then
    service redis-server stop >/dev/null 2>&1 || true
  fi
}

start() {
  if answers; then echo "$url"; return 0; fi
  listening && die "port $host:$port is taken by a process that is not a Redis (see: ss -ltnp 'sport = :$port')"
  command -v redis-server >/dev/null 2>&1 || install
  if answers; then echo "$url"; return 0; fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cat > "$dir/redis.conf" <<EOF
# Written by headrace's scripts/redis.sh.
bind $host
port $port
protected-mode yes
daemonize yes
pidfile $dir/redis.pid
logfile $dir/redis.log
dir $dir
appendonly yes
appendfsync everysec
save ""
EOF
  redis-server "$dir/redis.conf" || die "redis-server did not start; see $dir/redis.log"
  local deadline=$((SECONDS + 30))
  until answers; do
    if [ $SECONDS -ge $deadline ]; then
      tail -20 "$dir/redis.log" >&2 2>/dev/null || true
      die "Redis does not answer on $host:$port after 30 s; see $dir/redis.log"
    fi
    sleep 0.2
  done
  say "Redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') up on $host:$port, data in $dir"
  echo "$url"
}

stop() {
  local pid
  if ! pid=$(our_pid); then
    if answers; then say "the Redis on $host:$port was not started by this script ($dir): left running"
    else say "not running ($dir)"; fi
    return 0
  fi
  redis-cli -h "$host" -p "$port" shutdown >/dev/null 2>&1 || kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then say "pid $pid still up after 30 s: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
    sleep 0.2
  done
  say "stopped ($dir)"
}

status() {
  if ! answers; then say "not running on $host:$port"; return 3; fi
  if our_pid >/dev/null; then say "running, data in $dir"; else say "a Redis not started by this script answers on $host:$port"; fi
  echo "$url"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
esac
