"""A Redis sink: each micro-batch, and its batch id, in one ``MULTI``/``EXEC`` transaction.

**Modes.** ``stream=``: each row is appended to a Redis stream (``XADD <stream> *``), as the
JSON object of the row in the field ``data`` (``format="json"``, what ``hr.sources.Redis``
reads by default) or one field per column (``format="fields"``). ``key_prefix=`` with
``key=``: each row is upserted into the hash ``<key_prefix>:<key value>[:<key value>...]``
(``HSET`` of its non-null columns, ``HDEL`` of its null ones: the hash ends as the row's
last version, as a PostgreSQL upsert leaves a table row); the last row of a key in a batch wins.

**Values.** Computed by Spark from the rows: the JSON object is Spark's ``to_json`` (null
columns left out, timestamps ISO-8601 in the session's zone, UTC); a field is the column as
text: strings as they are, numbers and booleans as Spark writes them, timestamps as in the
JSON, dates ``yyyy-MM-dd``, structs, arrays and maps as JSON, binary columns as their bytes.

**Exactly-once.** The transaction holds the batch's commands and ``SET
headrace:sink_commits:<identity> <batch id>``, where the identity is the sink's step,
pipeline and checkpoint (``bind``), so Redis applies the records and the batch id together.
The sink ``WATCH``es its commit key and reads it first: a batch whose id is recorded (Spark
replays the batch a crash interrupted) is skipped; if another writer of the same identity
commits in between, ``EXEC`` is refused and the check runs again. Redis does not roll a
transaction back when one of its commands fails, so before ``MULTI`` the sink checks that
every key it writes is free or of the right type (a stream, a hash), and stops naming the
key when one is not. A transient failure (connection refused or lost, a timeout, a server
loading its data) makes the sink try the batch again on a new connection, with exponential
backoff (:mod:`headrace.connectors.retry`); an attempt whose ``EXEC`` went through but whose
answer was lost finds its batch id and writes nothing.

**Batch size.** A batch's rows pass through the driver (``toArrow``) and Redis keeps the
queued commands of the transaction in memory until ``EXEC``, which then runs them all while
other clients wait: a batch of N rows costs about N times the row's size on the driver and
in Redis, and blocks Redis for about N microseconds. Keep batches to some 100 000 rows (the
sources' ``max_records_per_batch``). A Redis Cluster is not supported (the keys of one
transaction must share a slot).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any, TypeVar

from headrace.connectors.base import StepSink, check_sink_columns, redact_dsn, run_batch
from headrace.connectors.retry import DEFAULT_FIRST_S, DEFAULT_RETRIES, Backoff, RetriesExhausted, retry
from headrace.contract import Guarantee
from headrace.errors import PlanError, SetupError, SinkError
from headrace.sink_step import SinkStep

T = TypeVar("T")

DEFAULT_URL = "redis://127.0.0.1:6379/0"
COMMITS_PREFIX = "headrace:sink_commits:"
FORMATS = ("json", "fields")
DATA_FIELD = "data"
KEY_SEPARATOR = ":"
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX"  # as Spark's to_json writes timestamps
CONNECT_TIMEOUT_S = 5
SOCKET_TIMEOUT_S = 120

# Returns the first key (and its type) that is neither missing nor of type ARGV[1].
_TYPE_CHECK = """
for i = 1, #KEYS do
  local found = redis.call('TYPE', KEYS[i]).ok
  if found ~= 'none' and found ~= ARGV[1] then return {KEYS[i], found} end
end
return false
"""


def _redis() -> Any:
    try:
        import redis
    except ImportError:
        raise SetupError("the Redis sink needs the Python package redis: pip install 'headrace[redis]' "
                         "(or pip install 'redis>=5')") from None
    return redis


def transient(exc: BaseException) -> bool:
    """Whether another attempt may succeed where ``exc`` failed: a connection refused, lost or
    timed out, a server still loading its data, a transaction refused by ``WATCH``."""
    redis = _redis()
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, redis.WatchError))


def _keys(key: str | Sequence[str] | None, where: str) -> tuple[str, ...]:
    if key is None:
        return ()
    keys = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, Sequence) else None
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise PlanError(f"{where}: key must be a column name or a list of column names, got {key!r}")
    if len(set(keys)) != len(keys):
        raise PlanError(f"{where}: key {list(keys)} names a column twice")
    return keys


class Redis(StepSink):
    """Write each batch to Redis at ``url``, exactly once: give either ``stream`` (append the
    rows as stream entries) or ``key_prefix`` and ``key`` (upsert each row as the hash
    ``<key_prefix>:<key values>``).

    ``format`` (stream mode): "json" (the row as a JSON object in the field ``data``) or
    "fields" (a field per column). ``key``: the column(s) naming a row's hash, joined by ``:``.
    ``retries``, ``retry_backoff``: after a transient failure a batch is tried again up to
    ``retries`` times, first after ``retry_backoff`` seconds, then twice as long each time
    (defaults: 5 and 0.5 s, about 15 s in all). ``name``: the identity the batch ids are
    committed under when the sink is not bound to a pipeline's step. See the module's
    docstring for the transaction, the values and the size of a batch.
    """

    guarantee = Guarantee.EXACTLY_ONCE
    native_format = None
    keyed_updates = "(key_prefix=..., key=[...])"  # a hash per key, replaced by its last row

    def __init__(self, *, url: str = DEFAULT_URL, stream: str | None = None, key_prefix: str | None = None,
                 key: str | Sequence[str] | None = None, format: str = "json", retries: int = DEFAULT_RETRIES,
                 retry_backoff: float = DEFAULT_FIRST_S, name: str | None = None) -> None:
        if stream is not None and key_prefix is not None:
            raise PlanError("Redis sink: give either stream= (append entries) or key_prefix= (upsert hashes), "
                            "not both")
        if stream is None and key_prefix is None:
            raise PlanError("Redis sink: give stream= (append each row as a stream entry) or key_prefix= and key= "
                            "(upsert each row as a hash), e.g. hr.sinks.Redis(stream='orders')")
        target = stream if stream is not None else key_prefix
        if not isinstance(target, str) or not target:
            kind = "stream" if stream is not None else "key_prefix"
            raise PlanError(f"Redis sink: {kind} must be a non-empty string, got {target!r}")
        where = f"Redis sink for stream {stream!r}" if stream is not None else f"Redis sink for hashes {key_prefix}:*"
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise PlanError(f"{where}: url {redact_dsn(str(url))!r} is not a redis://, rediss:// or unix:// URL")
        keys = _keys(key, where)
        if key_prefix is not None and not keys:
            raise PlanError(f"{where}: key= names the column(s) whose values name each row's hash, e.g. key='user'")
        if stream is not None and keys:
            raise PlanError(f"{where}: key= is for hashes (key_prefix=); a stream's entries have no key")
        if format not in FORMATS:
            raise PlanError(f"{where}: unknown format {format!r}; use one of {', '.join(FORMATS)}")
        if key_prefix is not None and format != "json":
            raise PlanError(f"{where}: format= is for streams; a hash always has a field per column")
        if name is not None and (not isinstance(name, str) or not name):
            raise PlanError(f"{where}: name must be a non-empty string, got {name!r}")
        self.url, self.stream, self.key_prefix, self.key, self.format = url, stream, key_prefix, keys, format
        self.backoff = Backoff.checked(retries, retry_backoff, where)
        self._name = name
        self._step: SinkStep | None = None
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    # -- identity ----------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The identity batch ids are committed under: the bound step's, else ``name=`` or the target."""
        return self._name or (self.stream if self.stream is not None else f"{self.key_prefix}:*")

    @property
    def commits_key(self) -> str:
        return COMMITS_PREFIX + self.name

    def _reset(self) -> None:
        self._client = None

    def describe(self) -> dict[str, Any]:
        mode = {"stream": self.stream, "format": self.format} if self.stream is not None else \
            {"key_prefix": self.key_prefix, "key": list(self.key)}
        return {"type": "Redis", "url": redact_dsn(self.url), **mode, "guarantee": self.guarantee.value}

    def __repr__(self) -> str:
        mode = f"stream={self.stream!r}, format={self.format!r}" if self.stream is not None else \
            f"key_prefix={self.key_prefix!r}, key={list(self.key)!r}"
        return f"Redis(url={redact_dsn(self.url)!r}, {mode})"

    # -- connection and retries ------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._client is None:
            self._client = _redis().Redis.from_url(self.url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                                                   socket_timeout=SOCKET_TIMEOUT_S)
        return self._client

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing must not fail
                pass

    def _retrying(self, doing: str, action: Callable[[], T]) -> T:
        """``action()``, tried again on a new connection after each transient failure; a
        SinkError naming the step and the server when it cannot be done."""
        redis = _redis()
        try:
            return retry(action, self.backoff, transient, on_retry=lambda _exc: self.close())
        except RetriesExhausted as out:
            self.close()
            state = "kept refusing the transaction" if isinstance(out.last, redis.WatchError) else "unreachable"
            raise SinkError(f"{self._where()}: Redis at {redact_dsn(self.url)} {state} after {out.attempts} "
                            f"attempt{'s' if out.attempts > 1 else ''} over {out.elapsed_s:.1f} s: {out.last}; "
                            f"gave up trying to {doing}. Restart the pipeline once the server is back (it goes "
                            "on from its checkpoint, exactly once), or let the sink wait longer with retries= and "
                            "retry_backoff=") from None
        except redis.RedisError as exc:
            self.close()
            raise SinkError(f"{self._where()}: Redis at {redact_dsn(self.url)}: cannot {doing}: {exc}") from None

    def prepare(self, run_dir: str) -> None:
        """Before the query starts: fail when the server cannot be reached."""
        self._retrying("connect", lambda: self._connect().ping())

    def last_committed(self) -> int | None:
        """The last batch id this sink committed, or None."""
        found = self._retrying("read its last committed batch", lambda: self._connect().get(self.commits_key))
        return None if found is None else int(found)

    def committed(self, batch_id: int) -> bool:
        last = self.last_committed()
        return last is not None and last >= batch_id

    # -- writing --------------------------------------------------------------------------------

    def _values(self, df: Any) -> Any:
        """The batch as text (or bytes) columns computed by Spark: ``data`` (the row's JSON), or
        each column's text, then ``_hr_key`` (the hash's key) in hash mode."""
        from pyspark.sql import functions as F
        from pyspark.sql import types

        columns = list(df.columns)
        check_sink_columns(self._where(), columns, self.key)
        if self.stream is not None and self.format == "json":
            return df.select(F.to_json(F.struct(*[F.col(f"`{c}`") for c in columns])).alias(DATA_FIELD))

        def text(field: Any) -> Any:
            column, kind = F.col(f"`{field.name}`"), field.dataType
            if isinstance(kind, (types.StringType, types.BinaryType)):
                return column
            if isinstance(kind, (types.TimestampType, types.TimestampNTZType)):
                return F.date_format(column, TIMESTAMP_FORMAT)
            if isinstance(kind, (types.StructType, types.ArrayType, types.MapType)):
                return F.to_json(column)
            return column.cast("string")

        texts = {field.name: text(field) for field in df.schema.fields}
        selected = [texts[c].alias(c) for c in columns]
        if self.key:
            parts = [texts[k].cast("string") for k in self.key]
            selected.append(F.concat_ws(KEY_SEPARATOR, F.lit(self.key_prefix), *parts).alias("_hr_key"))
            null_key = reduce(lambda a, b: a | b, [F.col(f"`{k}`").isNull() for k in self.key])
            selected.append(null_key.alias("_hr_null_key"))
        return df.select(*selected)

    def write_batch(self, df: Any, batch_id: int) -> None:
        values = self._values(df)
        if self.committed(batch_id):  # (the dispatcher asks committed() first; this is for direct calls)
            run_batch(df)
            return
        table = values.toArrow()  # reads the whole batch, so its stateful operators commit
        if self.key and table.num_rows:
            nulls = table.column("_hr_null_key").to_pylist()
            if any(nulls):
                row = {k: v for k, v in table.slice(nulls.index(True), 1).to_pylist()[0].items()
                       if not k.startswith("_hr_")}
                raise SinkError(f"{self._where()}: batch {batch_id}: a row has a null key column "
                                f"({', '.join(self.key)}): {row}; a hash needs every key column set")
        self._retrying(f"write batch {batch_id}", lambda: self._write_once(batch_id, table))

    def _write_once(self, batch_id: int, table: Any) -> None:
        """One attempt: WATCH the commit key, skip a committed batch, check the keys' types, then
        the records and the batch id in one MULTI/EXEC."""
        client = self._connect()
        with client.pipeline(transaction=True) as pipe:
            pipe.watch(self.commits_key)
            last = pipe.get(self.commits_key)
            if last is not None and int(last) >= batch_id:
                return  # committed before: a replay, or an attempt whose answer was lost
            keys = [self.stream] if self.stream is not None else sorted(set(table.column("_hr_key").to_pylist()))
            self._check_types(pipe, keys, batch_id)
            pipe.multi()
            if self.stream is not None:
                self._append(pipe, table)
            else:
                self._upsert(pipe, table)
            pipe.set(self.commits_key, batch_id)
            results = pipe.execute(raise_on_error=False)
        failed = [(n, r) for n, r in enumerate(results) if isinstance(r, Exception)]
        if failed:
            number, error = failed[0]
            raise SinkError(f"{self._where()}: batch {batch_id}: Redis refused command {number + 1} of its "
                            f"transaction ({error}); Redis applied the others, batch id included. Fix the cause "
                            "and check the data written by this batch")

    def _check_types(self, pipe: Any, keys: list[str], batch_id: int) -> None:
        kind = "stream" if self.stream is not None else "hash"
        if not keys:
            return
        found = pipe.eval(_TYPE_CHECK, len(keys), *keys, kind)
        if found:
            key, other = (v.decode() if isinstance(v, bytes) else v for v in found)
            raise SinkError(f"{self._where()}: batch {batch_id}: the key {key!r} holds a {other}, not a {kind}; "
                            "delete or rename it, or write elsewhere")

    def _append(self, pipe: Any, table: Any) -> None:
        names = table.column_names
        columns = [table.column(n).to_pylist() for n in names]
        for row in zip(*columns):
            fields = {n: v for n, v in zip(names, row) if v is not None}
            if not fields:  # a stream entry needs a field: an all-null row keeps its first column, empty
                fields = {names[0]: ""}
            pipe.xadd(self.stream, fields)

    def _upsert(self, pipe: Any, table: Any) -> None:
        names = [n for n in table.column_names if not n.startswith("_hr_")]
        columns = [table.column(n).to_pylist() for n in names]
        for key, row in zip(table.column("_hr_key").to_pylist(), zip(*columns)):
            values = {n: v for n, v in zip(names, row) if v is not None}
            pipe.hset(key, mapping=values)  # the key columns are never null: never empty
            nulls = [n for n, v in zip(names, row) if v is None]
            if nulls:
                pipe.hdel(key, *nulls)
