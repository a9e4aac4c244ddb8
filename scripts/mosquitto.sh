#!/usr/bin/env bash
# A local MQTT broker for headrace's MQTT source and sink: Debian's mosquitto (installed with apt-get
# when missing), on 127.0.0.1:1883, daemonized, persistence on, so persistent sessions and the QoS 1
# messages queued for them survive the broker's own restart. Safe to run any number of times.
#
# Usage: bash scripts/mosquitto.sh start|stop|status
#   start   starts the broker unless one answers on 127.0.0.1:PORT already (then it says nothing),
#           and prints its URL (mqtt://127.0.0.1:1883) on stdout.
#   stop    stops the broker this script started (SIGTERM, which writes its persistence file out).
#   status  prints the URL and exits 0 when a broker answers; exits 3 when none does.
#   env     HEADRACE_MOSQUITTO_DIR (config, persistence, log and pid file; default /tmp/headrace-mosquitto),
#           HEADRACE_MOSQUITTO_PORT (default 1883)
set -euo pipefail

dir=${HEADRACE_MOSQUITTO_DIR:-/tmp/headrace-mosquitto}
port=${HEADRACE_MOSQUITTO_PORT:-1883}
host=127.0.0.1
url=mqtt://$host:$port

say() { echo "mosquitto: $*" >&2; }
die() { say "$*"; exit 1; }

answers() {  # an MQTT broker on host:port replies CONNACK (0x20) to a clean MQTT 3.1.1 CONNECT
  (
    exec 3<>"/dev/tcp/$host/$port" || exit 1
    # CONNECT: protocol MQTT level 4, clean session, keep-alive 10 s, client id "hr-probe"
    printf '\x10\x14\x00\x04MQTT\x04\x02\x00\x0a\x00\x08hr-probe' >&3
    reply=$(timeout 2 head -c 2 <&3 | od -An -tx1 | tr -d ' \n') || exit 1
    printf '\xe0\x00' >&3 2>/dev/null || true  # DISCONNECT
    [ "${reply:0:2}" = "20" ]
  ) 2>/dev/null
}
listening() { (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; }
our_pid() {  # pid of the broker this script started in $dir, if it runs
  local pid
  pid=$(cat "$dir/mosquitto.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q mosquitto && echo "$pid"
}
binary() { command -v mosquitto 2>/dev/null || { [ -x /usr/sbin/mosquitto ] && echo /usr/sbin/mosquitto; }; }

install() {
  [ "$(id -u)" = 0 ] || die "mosquitto is not installed and this user is not root: cannot apt-get install it"
  command -v apt-get >/dev/null 2>&1 || die "mosquitto is not installed and there is no apt-get here: install it yourself"
  say "installing mosquitto (apt-get)"
  local tries=0
  until { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto >/dev/null; }; do
    tries=$((tries + 1))
    [ $tries -lt 10 ] || die "apt-get install mosquitto failed (is dpkg's lock held by another apt-get?)"
    sleep 6
  done
  # Debian's package may start its own service on 1883 (not where systemd and policy-rc.d forbid
  # it): stop it, so that the broker below, with its own persistence, takes the port.
  if answers && ! our_pid >/dev/null; then
    service mosquitto stop >/dev/null 2>&1 || true
  fi
}

start() {
  if answers; then echo "$url"; return 0; fi
  listening && die "port $host:$port is taken by a process that is not an MQTT broker (see: ss -ltnp 'sport = :$port')"
  [ -n "$(binary)" ] || install
  if answers; then echo "$url"; return 0; fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  cat > "$dir/mosquitto.conf" <<EOF
# Written by headrace's scripts/mosquitto.sh.
listener $port $host
allow_anonymous true
pid_file $dir/mosquitto.pid
user root
persistence true
persistence_location $dir/
autosave_interval 1
persistent_client_expiration 7d
max_queued_messages 1000000
max_inflight_messages 100
log_dest file $dir/mosquitto.log
log_type error
log_type warning
log_type notice
EOF
  "$(binary)" -d -c "$dir/mosquitto.conf" 2>>"$dir/mosquitto.log" || die "mosquitto did not start; see $dir/mosquitto.log"
  local deadline=$((SECONDS + 30))
  until answers; do
    if [ $SECONDS -ge $deadline ]; then
      tail -20 "$dir/mosquitto.log" >&2 2>/dev/null || true
      die "mosquitto does not answer on $host:$port after 30 s; see $dir/mosquitto.log"
    fi
    sleep 0.2
  done
  say "mosquitto up on $host:$port, persistence in $dir"
  echo "$url"
}

stop() {
  local pid
  if ! pid=$(our_pid); then
    if answers; then say "the broker on $host:$port was not started by this script ($dir): left running"
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
  if ! answers; then say "not running on $host:$port"; return 3; fi
  if our_pid >/dev/null; then say "running, persistence in $dir"; else say "a broker not started by this script answers on $host:$port"; fi
  echo "$url"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" >&2; exit 2 ;;
esac
