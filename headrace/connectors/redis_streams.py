"""Redis Streams: a replayable source reading the entries of one or more streams (``XRANGE``).

**Offsets.** ``{stream: last entry id}``, e.g. ``{"clicks": "1700000000000-3"}``: Spark logs the
end offset before the batch runs, and the batch reads, per stream, the entries after the start id
up to and including the end id (``XRANGE stream (start end``), never "whatever is there now", so a
replayed batch reads exactly the same entries. Exactly-once while the entries are kept: an entry
trimmed (``XTRIM``, ``MAXLEN``) or deleted before its batch committed is not read again. Nothing is
written to Redis (no consumer group).

**Batches.** ``latestOffset`` walks each stream from its start id on the server (a Lua script that
returns entry ids only) up to ``max_records_per_batch`` entries per micro-batch, shared fairly
between the streams, and notes every ``partition_records``-th id: each stream is one Spark
partition, split there when larger. ``read`` fetches its range in chunks and yields Arrow batches.

**Records.** ``format="json"``: the entry's field ``field`` (default ``data``) holds a JSON object,
read against ``schema`` as JSON lines are (``headrace/connectors/file_formats/jsonl.py``);
``format="fields"``: the entry's own fields are the record's, their text converted to the schema's
types as CSV fields are (a missing field is null). Besides the schema's columns, every record has
``redis_stream``, ``redis_id`` and ``redis_time`` (the millisecond part of the entry id, a
timestamp: ``event_time="redis_time"`` uses it as event time). An entry that does not fit goes to
the dead letters with ``<stream>/<entry id>`` as its position.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.connectors import broker
from headrace.connectors.base import redact_dsn
from headrace.connectors.file_formats.csv import TEXT_CONVERTERS
from headrace.connectors.file_formats.reader import batch_schema
from headrace.connectors.file_formats.values import convert_values
from headrace.connectors.payloads import Dead, PayloadDecoder, message_schema, record_batches, text
from headrace.contract import SourceContext
from headrace.errors import PlanError, SourceError
from headrace.schema import Schema, arrow_type, to_ddl

DEFAULT_URL = "redis://127.0.0.1:6379/0"
FORMATS = ("json", "fields")
STARTS = ("earliest", "latest")
METADATA: Schema = (("redis_stream", "string"), ("redis_id", "string"), ("redis_time", "timestamp"))
DEFAULT_MAX_RECORDS = 100_000
PARTITION_RECORDS = 50_000  # entries per Spark partition, at most
CHUNK_ENTRIES = 10_000  # entries fetched per XRANGE call, and rows per Arrow batch
FIRST_ID = "0-0"

# Walks a stream after ARGV[1] up to ARGV[4] (inclusive; "+" for the end), at most ARGV[2] entries
# (0: no cap), and returns {count, last id, every ARGV[3]-th id}; ARGV[5] entries were counted
# before (the split points continue their count). Only ids leave the server.
PLAN_SCRIPT = """
local after, cap, every, upto, before = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
local count, last, result = 0, after, {0, after}
while cap == 0 or count < cap do
  local want = 1000
  if cap > 0 and cap - count < want then want = cap - count end
  local entries = redis.call('XRANGE', KEYS[1], '(' .. last, upto, 'COUNT', want)
  for i = 1, #entries do
    count = count + 1
    last = entries[i][1]
    if (before + count) % every == 0 then result[#result + 1] = last end
  end
  if #entries < want then break end
end
result[1], result[2] = count, last
return result
"""


def entry_key(entry_id: str) -> tuple[int, int]:
    """An entry id as a pair that sorts as Redis orders entries.

    >>> entry_key("1700-2"), entry_key("999-10") < entry_key("1000-0")
    ((1700, 2), True)
    """
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def redis_client(url: str) -> Any:
    redis = broker.client_library("redis", "the Redis source needs", "redis", "redis>=5")
    return redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=60, decode_responses=False)


def failed(source: str, url: str, doing: str, exc: Exception) -> SourceError:
    return SourceError(f"source {source!r}: Redis at {redact_dsn(url)}: {doing}: {exc}")


# ----------------------------------------------------------------------------------------
# Entries to Arrow record batches.

class EntryDecoder:
    """Turns a chunk of one stream's entries, ``[(id, {field: value})]`` as bytes, into record
    batches of the source's Arrow schema: good rows first, then dead letters
    (``headrace/connectors/payloads.py``)."""

    def __init__(self, options: dict[str, str], schema: Schema, stream: str) -> None:
        self.schema, self.stream = schema, stream
        self.format = options.get("format", "json")
        self.field = options.get("field", "data").encode()
        self.payloads = PayloadDecoder(schema, "json")
        self.arrow = batch_schema((*schema, *METADATA), dead_letters=True)

    def batches(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> Iterator[pa.RecordBatch]:
        ids = pa.array([entry_id for entry_id, _ in entries], pa.binary()).cast(pa.string())
        dead: Dead = {}
        columns = self._json(entries, dead) if self.format == "json" else self._fields(entries, dead)
        millis = pc.list_element(pc.split_pattern(ids, "-", max_splits=1), 0).cast(pa.int64())
        metadata = [pa.array([self.stream] * len(entries), pa.string()), ids,
                    pc.multiply(millis, 1000).cast(arrow_type("timestamp"))]
        positions = [f"{self.stream}/{entry_id}" for entry_id in ids.to_pylist()]
        yield from record_batches(self.arrow, columns, metadata, dead, positions)

    def _json(self, entries: list[tuple[bytes, dict[bytes, bytes]]], dead: Dead) -> list[pa.Array]:
        """The entries' field ``field``, each a JSON object; an entry without it is a dead letter."""
        values: list[bytes] = []
        for row, (_, fields) in enumerate(entries):
            value = fields.get(self.field)
            if value is None:
                raw = json.dumps({text(k): text(v) for k, v in fields.items()})
                dead[row] = (raw, f"the entry has no field {text(self.field)!r}")
            values.append(b"{}" if value is None else value)
        return self.payloads.columns(values, dead)

    def _fields(self, entries: list[tuple[bytes, dict[bytes, bytes]]], dead: Dead) -> list[pa.Array]:
        texts: list[dict[str, str]] = []
        for row, (_, fields) in enumerate(entries):
            try:
                texts.append({k.decode(): v.decode() for k, v in fields.items()})
            except UnicodeDecodeError as exc:
                raw = json.dumps({text(k): text(v) for k, v in fields.items()})
                dead[row] = (raw, f"invalid UTF-8 ({exc.reason})")
                texts.append({})
        errors: dict[int, str] = {}
        columns = [convert_values(name, type_name, [t.get(name) for t in texts], TEXT_CONVERTERS[type_name], errors)
                   for name, type_name in self.schema]
        for row, error in errors.items():
            dead.setdefault(row, (json.dumps(texts[row]), error))
        return columns


@dataclass(frozen=True, init=False)
class Redis(broker.Source, metadata=METADATA, spark_reader="redis_streams:RedisDataSource"):
    """Entries of Redis streams, read with ``XRANGE`` from ``url``.

    ``streams``: a stream name, a comma-separated list or a list. ``format``: "json" (the entry's
    field ``field`` holds a JSON object) or "fields" (the entry's fields are the record's).
    ``schema``: the record's fields (any form ``schema_of`` accepts); the source adds
    ``redis_stream``, ``redis_id`` and ``redis_time``. ``start``: where a new pipeline starts,
    "earliest" or "latest" (a restarted one continues from its checkpoint).
    ``max_records_per_batch``: entries per micro-batch, shared between the streams (None: all
    there are). ``partition_records``: entries per Spark partition at most (a stream's range is
    split beyond it). Exactly-once while the entries are kept.
    """

    streams: tuple[str, ...]
    data_schema: Schema
    url: str
    format: str
    field: str
    start: str
    max_records_per_batch: int | None
    partition_records: int

    def __init__(self, streams: str | Sequence[str], *, schema: Any, url: str = DEFAULT_URL, format: str = "json",
                 field: str = "data", start: str = "earliest",
                 max_records_per_batch: int | None = DEFAULT_MAX_RECORDS,
                 partition_records: int = PARTITION_RECORDS) -> None:
        names = broker.name_list(streams)
        where = f"Redis({', '.join(names)})"
        if not names:
            raise PlanError("Redis(): give at least one stream name, e.g. Redis('clicks', schema=...)")
        if len(set(names)) != len(names):
            raise PlanError(f"{where}: a stream is named twice")
        broker.check_reading(where, format, FORMATS, schema, start, STARTS)
        if not url.startswith(("redis://", "rediss://", "unix://")):
            raise PlanError(f"{where}: url {redact_dsn(url)!r} is not a redis://, rediss:// or unix:// URL")
        if format == "json" and not field:
            raise PlanError(f"{where}: field= names the entry field holding the JSON object; it is empty")
        broker.check_batch_sizes(where, max_records_per_batch, partition_records)
        data_schema = message_schema(schema, METADATA, where)
        self._assign(streams=names, data_schema=data_schema, url=url, format=format, field=field, start=start,
                     max_records_per_batch=max_records_per_batch, partition_records=partition_records)

    def offset_identity(self) -> dict[str, Any]:
        """An offset is an entry id per stream: the streams and how an entry becomes a record fix
        what it means; the server's URL, where a new pipeline starts and batch sizes do not."""
        return {"streams": list(self.streams), "format": self.format,
                "field": self.field if self.format == "json" else None, "schema": to_ddl(self.data_schema)}

    def describe(self) -> dict[str, Any]:
        return {"type": "Redis", "streams": list(self.streams), "url": redact_dsn(self.url), "format": self.format,
                "field": self.field if self.format == "json" else None, "schema": to_ddl(self.data_schema),
                "start": self.start, "max_records_per_batch": self.max_records_per_batch,
                "partition_records": self.partition_records,
                "guarantee": self.guarantee.value, "dead_letters": True}

    def prepare(self, context: SourceContext) -> None:
        """Fail before Spark starts when the server cannot be reached."""
        client = redis_client(self.url)
        try:
            client.ping()
        except Exception as exc:  # noqa: BLE001
            raise failed(context.source_name, self.url, "cannot connect", exc) from None
        finally:
            client.close()
