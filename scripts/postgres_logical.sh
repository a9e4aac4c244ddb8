#!/usr/bin/env bash
# Makes the local PostgreSQL cluster on 127.0.0.1:PORT ready for headrace's change data capture
# source (hr.sources.PostgresChanges): wal_level=logical, max_replication_slots and max_wal_senders at
# least 10, and the wal2json output plugin (Debian's postgresql-<version>-wal2json, installed with
# apt-get when missing). The cluster is restarted only when a setting that needs it changed.
# Run it after PostgreSQL is up (scripts/services.sh does). Safe to run any number of times: it says
# nothing when the cluster is ready, and exits non-zero saying why when it cannot make it so.
#
# Why wal2json: it writes each change as JSON with its column names, types and values, the old key
# or the whole old row as the table's REPLICA IDENTITY gives it, and filters tables on the server
# (add-tables). test_decoding is a test plugin whose text output is not meant to be parsed;
# pgoutput needs a publication kept beside the slot and a binary protocol parser.
#
# Usage: bash scripts/postgres_logical.sh
#   env  HEADRACE_PG_PORT (default 5432)
set -euo pipefail

port=${HEADRACE_PG_PORT:-5432}
min_slots=10

say() { echo "postgres_logical: $*" >&2; }
die() { say "$*"; exit 1; }
sql() { psql -w -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAXc "$1"; }
ready() { sql "select 1" >/dev/null 2>&1; }

command -v pg_lsclusters >/dev/null 2>&1 || die "pg_lsclusters not found: PostgreSQL is not installed the Debian way (run scripts/services.sh)"
ready || die "PostgreSQL does not answer on 127.0.0.1:$port (start it with scripts/services.sh)"
cluster=$(pg_lsclusters -h | awk -v port="$port" '$3 == port {print $1 " " $2; exit}')
[ -n "$cluster" ] || die "no Debian PostgreSQL cluster listens on port $port (pg_lsclusters); set wal_level=logical yourself"
read -r ver name <<<"$cluster"

if [ ! -e "/usr/lib/postgresql/$ver/lib/wal2json.so" ]; then
  [ "$(id -u)" = 0 ] || die "the wal2json plugin is missing and this user is not root: cannot apt-get install postgresql-$ver-wal2json"
  say "installing postgresql-$ver-wal2json (apt-get)"
  for attempt in 1 2 3 4 5 6; do  # another apt-get may hold dpkg's lock
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "postgresql-$ver-wal2json" >/dev/null 2>&1; then break; fi
    if [ "$attempt" = 1 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
    [ "$attempt" = 6 ] && die "apt-get install postgresql-$ver-wal2json failed (is dpkg locked, or the package missing?)"
    sleep 10
  done
fi

changed=
want() {  # want NAME VALUE [min]: the configured value of NAME is VALUE (or at least VALUE with min)
  local key=$1 value=$2 mode=${3:-} now
  now=$(pg_conftool -s "$ver" "$name" show "$key" 2>/dev/null || true)
  now=${now//\'/}
  [ -n "$now" ] || now=$(sql "show $key")
  if [ "$mode" = min ] && [[ "$now" =~ ^[0-9]+$ ]] && [ "$now" -ge "$value" ]; then return 0; fi
  if [ "$now" = "$value" ]; then return 0; fi
  pg_conftool "$ver" "$name" set "$key" "$value" || die "pg_conftool $ver $name set $key $value failed"
  changed=1
}
want wal_level logical
want max_replication_slots "$min_slots" min
want max_wal_senders "$min_slots" min

running() { [ "$(sql "show wal_level")" = logical ] && [ "$(sql "show max_replication_slots")" -ge "$min_slots" ] \
            && [ "$(sql "show max_wal_senders")" -ge "$min_slots" ]; }
if [ -n "$changed" ] || ! running; then
  say "restarting PostgreSQL $ver/$name for wal_level=logical"
  pg_ctlcluster "$ver" "$name" restart || die "pg_ctlcluster $ver $name restart failed; see /var/log/postgresql/postgresql-$ver-$name.log"
  for _ in $(seq 1 60); do ready && break; sleep 0.5; done
  ready || die "PostgreSQL $ver/$name does not answer on 127.0.0.1:$port 30 s after its restart"
  running || die "PostgreSQL $ver/$name still runs with wal_level=$(sql "show wal_level"), max_replication_slots=$(sql "show max_replication_slots"), max_wal_senders=$(sql "show max_wal_senders") after a restart; see /etc/postgresql/$ver/$name/postgresql.conf"
fi
