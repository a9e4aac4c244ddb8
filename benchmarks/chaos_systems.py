"""The chaos check's inputs and outputs in Redis and PostgreSQL, read and written with the
systems' own clients (never with headrace), for ``benchmarks/chaos.py``:

* ``--source redis``: the generator's events appended to a new stream, then the final record;
* ``--source postgres-cdc``: the events inserted into a new table (500 a transaction) after a
  logical replication slot of the run's name was created, so the slot sees every insert;
* ``--sink redis``: the windows as entries of a new stream (the Redis sink's stream mode,
  JSON in the field ``data``), and the sink's commit key.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from typing import Any

REDIS_URL = "redis://127.0.0.1:6379/0"
DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
INSERTS_PER_TRANSACTION = 500


def iso(micros: int) -> str:
    """An event time as JSON carries it: ISO-8601 in UTC, to the microsecond."""
    moment = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(microseconds=micros)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _redis() -> Any:
    import redis

    return redis.Redis.from_url(REDIS_URL)


def fill_stream(stream: str, records: list[tuple[str, int]]) -> None:
    """``records`` (user, event time in µs) appended to ``stream`` as JSON in the field ``data``."""
    client = _redis()
    for first in range(0, len(records), 5_000):
        pipe = client.pipeline(transaction=False)
        for user, at in records[first:first + 5_000]:
            pipe.xadd(stream, {"data": json.dumps({"user_id": user, "event_time": iso(at)})})
        pipe.execute()
    if client.xlen(stream) != len(records):
        raise RuntimeError(f"the stream {stream} holds {client.xlen(stream)} entries, not {len(records)}")


def fill_table(table: str, slot: str, records: list[tuple[str, int]]) -> None:
    """Create ``slot`` (wal2json) first, then ``table`` and its rows, so the slot sees every insert."""
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (slot,))
        conn.execute(f'CREATE TABLE "{table}" (id bigserial PRIMARY KEY, user_id text, event_time timestamptz)')
        for first in range(0, len(records), INSERTS_PER_TRANSACTION):
            with conn.transaction(), conn.cursor() as cursor:
                cursor.executemany(f'INSERT INTO "{table}" (user_id, event_time) VALUES (%s, %s)',
                                   [(user, iso(at)) for user, at in records[first:first + INSERTS_PER_TRANSACTION]])


def redis_commit(identity: str) -> int:
    """The last batch id the Redis sink recorded under ``identity`` (-1: none)."""
    from headrace.connectors.redis_sink import COMMITS_PREFIX

    found = _redis().get(COMMITS_PREFIX + identity)
    return -1 if found is None else int(found)


def stream_windows(stream: str) -> Counter:
    """(user, window start in ms, count) of every entry of the Redis sink's stream."""
    def epoch_ms(value: str) -> int:
        return int(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)

    client, written, after = _redis(), Counter(), "-"
    while True:
        entries = client.xrange(stream, min=after, count=10_000)
        for _id, fields in entries:
            row = json.loads(fields[b"data"])
            written[(row["user_id"], epoch_ms(row["window_start"]), row["count"])] += 1
        if len(entries) < 10_000:
            return written
        after = "(" + entries[-1][0].decode()


def drop_redis(keys: list[str]) -> None:
    if keys:
        _redis().delete(*keys)


def drop_cdc(table: str, slot: str) -> None:
    """Drop the run's slot (it holds WAL while it exists) and its source table."""
    import psycopg

    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                     (slot,))
        conn.execute(f'DROP TABLE IF EXISTS "{table}"')
