#!/usr/bin/env bash
# Install (if missing) and start the services the tests use: PostgreSQL on 127.0.0.1:5432,
# user postgres, trust auth for local TCP connections, wal_level=logical and wal2json
# (scripts/postgres_logical.sh); Spark's Kafka connector jars
# (scripts/fetch_jars.sh) and one Apache Kafka broker on 127.0.0.1:9092 (scripts/kafka.sh); Redis on
# 127.0.0.1:6379 (scripts/redis.sh); NATS with JetStream on 127.0.0.1:4222 (scripts/nats.sh); Mosquitto
# (MQTT) on 127.0.0.1:1883 (scripts/mosquitto.sh); Chromium for the web UI's tests and a native BLAS for Spark MLlib (Debian's packages).
# Safe to run any number of times.
# Exits non-zero, saying why, when a service cannot be had (then its tests skip, or fail in CI).
set -euo pipefail

PG_PORT=5432
MARK="# headrace: trust local TCP"

say() { echo "services: $*" >&2; }

pg_ready() {
  psql -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc "select 1" >/dev/null 2>&1
}

install_postgres() {
  if [ "$(id -u)" != 0 ]; then
    say "PostgreSQL is not installed and this user is not root: cannot apt-get install postgresql"; return 1
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    say "PostgreSQL is not installed and there is no apt-get here: install a PostgreSQL server yourself"; return 1
  fi
  say "installing postgresql (apt-get)"
  apt-get update -qq >/dev/null || { say "apt-get update failed"; return 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null \
    || { say "apt-get install postgresql failed"; return 1; }
}

start_postgres() {
  if pg_ready; then say "PostgreSQL is up on 127.0.0.1:$PG_PORT"; return 0; fi
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || ! command -v pg_ctlcluster >/dev/null 2>&1; then
    install_postgres || return 1
  fi
  if [ "$(id -u)" != 0 ]; then
    say "PostgreSQL is installed but not reachable on 127.0.0.1:$PG_PORT, and only root can start it here"; return 1
  fi
  local version
  version=$(ls /usr/lib/postgresql | sort -V | tail -1)
  # The cluster serving port 5432, else the 'main' cluster of the newest version (created if missing).
  local cluster
  cluster=$(pg_lsclusters -h 2>/dev/null | awk -v port="$PG_PORT" '$3 == port {print $1 "/" $2; exit}')
  if [ -z "$cluster" ]; then
    cluster="$version/main"
    if ! pg_lsclusters -h 2>/dev/null | awk '{print $1 "/" $2}' | grep -qx "$cluster"; then
      say "creating PostgreSQL cluster $cluster"
      pg_createcluster --port "$PG_PORT" "$version" main >/dev/null || { say "pg_createcluster failed"; return 1; }
    fi
    pg_conftool "${cluster%/*}" "${cluster#*/}" set port "$PG_PORT"
  fi
  local ver=${cluster%/*} name=${cluster#*/}
  pg_conftool "$ver" "$name" set listen_addresses localhost  # 127.0.0.1 and ::1
  local hba="/etc/postgresql/$ver/$name/pg_hba.conf"
  if ! grep -qF "$MARK" "$hba"; then  # first matching line wins: put ours first
    { echo "$MARK"; echo "host all all 127.0.0.1/32 trust"; echo "host all all ::1/128 trust"; cat "$hba"; } \
      > "$hba.headrace" && cat "$hba.headrace" > "$hba" && rm -f "$hba.headrace"
  fi
  if pg_ctlcluster "$ver" "$name" status >/dev/null 2>&1; then
    pg_ctlcluster "$ver" "$name" restart || { say "pg_ctlcluster $ver $name restart failed"; return 1; }
  else
    pg_ctlcluster "$ver" "$name" start \
      || { say "pg_ctlcluster $ver $name start failed; see /var/log/postgresql/postgresql-$ver-$name.log"; return 1; }
  fi
  for _ in $(seq 1 60); do
    if pg_ready; then say "PostgreSQL $ver/$name is up on 127.0.0.1:$PG_PORT"; return 0; fi
    sleep 0.5
  done
  say "PostgreSQL $ver/$name started but does not accept connections on 127.0.0.1:$PG_PORT after 30 s"
  return 1
}

ensure_database() {  # tests/test_sinks.py writes into the database "test"
  local name=$1
  if [ "$(psql -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -tAc \
        "select 1 from pg_database where datname = '$name'")" != 1 ]; then
    psql -w -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -qc "create database \"$name\"" >/dev/null \
      || { say "cannot create the PostgreSQL database $name"; return 1; }
  fi
}

install_chromium() {  # tests/test_ui.py drives the web UI in a headless Chromium (Debian's package)
  if command -v chromium >/dev/null 2>&1; then say "Chromium is installed: $(command -v chromium)"; return 0; fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "Chromium is not installed, and only root can apt-get install chromium here"; return 1
  fi
  apt-get update -qq >/dev/null || { say "apt-get update failed"; return 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
    || { say "apt-get install chromium failed"; return 1; }
  say "Chromium is installed: $(command -v chromium)"
}

install_native_blas() {  # Spark MLlib (examples/titanic_scoring.py) prints a line on stderr without one
  if ldconfig -p 2>/dev/null | grep -q "libblas.so.3 "; then say "a native BLAS is installed (libblas.so.3)"; return 0; fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "no native BLAS (libblas.so.3), and only root can apt-get install libblas3 here"; return 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libblas3 >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libblas3 >/dev/null; } \
    || { say "apt-get install libblas3 failed"; return 1; }
  say "a native BLAS is installed (libblas.so.3)"
}

here=$(dirname "$0")
status=0
if start_postgres; then ensure_database test || status=1; else status=1; fi
if pg_ready; then bash "$here/postgres_logical.sh" || status=1; fi  # wal_level=logical, wal2json
if jars=$(bash "$here/fetch_jars.sh"); then say "Spark's connector jars are in $jars"; else status=1; fi
if servers=$(bash "$here/kafka.sh" start); then say "Kafka is up on $servers"; else status=1; fi
if url=$(bash "$here/redis.sh" start); then say "Redis is up on $url"; else status=1; fi
if url=$(bash "$here/mosquitto.sh" start); then say "Mosquitto (MQTT) is up on $url"; else status=1; fi
if url=$(bash "$here/nats.sh" start); then say "NATS (JetStream) is up on $url"; else status=1; fi
if url=$(bash "$here/rabbitmq.sh" start); then say "RabbitMQ (streams) is up on $url"; else status=1; fi
install_chromium || status=1
install_native_blas || status=1
exit "$status"
