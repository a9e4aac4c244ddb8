"""NATS JetStream: a replayable source reading a stream by sequence, and a sink publishing with message ids.

Both use the asyncio client ``nats-py`` (``pip install 'headrace[nats]'``), each call on an event
loop of its own (``asyncio.run``): Spark calls data sources and ``foreachBatch`` synchronously.

**Source offsets.** ``{"seq": last stream sequence}``, e.g. ``{"seq": 1200}``. Spark logs the end
offset before the batch runs; the batch reads the stream's sequences ``start+1`` to ``end``
(inclusive) that match the subjects filter, never "whatever is there now", so a replayed batch
reads exactly the same messages. Each Spark partition reads its own range through an *ephemeral
pull consumer* (no acks, in memory, deleted at the end and by the server after
``CONSUMER_IDLE_S`` if its reader died) that starts at the range's first sequence; the reader stops
at the range's last sequence, or when the consumer has no more messages (``num_pending``). A
single subject filter (wildcards allowed) is the consumer's own filter; several are matched here
(nats-server 2.9 filters one subject per consumer). Exactly-once while the messages are kept: a
message removed (limits, ``max_age``, purge) before its batch committed is not read again.
Nothing is written to the server but the short-lived consumers.

**Batches.** ``latestOffset`` reads the stream's last sequence, at most ``max_records_per_batch``
sequences past the start (with a filter, fewer records may match), and skips sequences the
stream no longer has. A batch is split into Spark partitions of ``partition_records`` sequences.

**Records.** ``format="json"``: the payload is a JSON object read against ``schema`` as JSON lines
are (``headrace/connectors/file_formats/jsonl.py``); ``format="raw"``: the payload itself is the
schema's one column (string or binary). Besides the schema's columns, every record has
``nats_subject``, ``nats_seq`` and ``nats_time`` (the JetStream timestamp of the message:
``event_time="nats_time"`` uses it as event time). A message that does not fit goes to the dead
letters with ``<stream>/<seq>`` as its position.

**Sink.** Each row is published as a JSON object (Spark's ``to_json``) to ``subject`` (or
``subject.<key value>``) with the header ``Nats-Msg-Id`` = ``<sink identity>/<batch id>/<row>``,
where the sink identity is what ``bind`` gets (step, pipeline and checkpoint) and ``<row>`` names
the row by its content (a digest of its JSON and the count of equal rows before it): Spark does
not fix the order of a batch's rows after a shuffle, so a position could name another row in a
replay. After every message of the batch is acknowledged, the sink records the batch id in the
key-value bucket ``headrace_sink_commits``; ``committed`` skips a batch recorded there. A batch
replayed after a crash *between* its messages and that record is published again with the same
message ids, which JetStream drops when they arrive within the stream's duplicate window.

Guarantee (the decision): exactly-once by default, and ``prepare`` refuses a target stream whose
duplicate window is shorter than ``MIN_DUPLICATE_WINDOW_S`` (JetStream's default, 2 minutes), so
a driver killed while publishing a batch must be restarted within that window (raise the stream's
``duplicate_window`` for slower restarts). ``exactly_once=False`` takes any window and declares
at-least-once. The rows pass through the driver (``toArrow``): one connection publishes them and
can only record the batch after every acknowledgement, and the batch is read in full, as
Spark 4.1+ needs; cap batch sizes at the source for large batches.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from headrace.connectors import broker
from headrace.connectors.base import redact_dsn
from headrace.connectors.file_formats.reader import batch_schema
from headrace.connectors.payloads import Dead, PayloadDecoder, record_batches
from headrace.contract import Guarantee, SourceContext
from headrace.errors import PlanError, SinkError, SourceError
from headrace.schema import Schema, to_ddl

DEFAULT_URL = "nats://127.0.0.1:4222"
FORMATS = ("json", "raw")
STARTS = ("earliest", "latest")
METADATA: Schema = (("nats_subject", "string"), ("nats_seq", "long"), ("nats_time", "timestamp"))
DEFAULT_MAX_RECORDS = 100_000
PARTITION_RECORDS = 50_000  # stream sequences per Spark partition, at most
FETCH_MESSAGES = 2_000  # messages per pull request, and rows per Arrow batch at most
CONNECT_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 30.0
CONSUMER_IDLE_S = 120.0  # the server deletes a reader's consumer this long after it was last used
COMMITS_BUCKET = "headrace_sink_commits"
MIN_DUPLICATE_WINDOW_S = 120.0
_BAD_TOKEN = re.compile(r"[\s.*>]")


def nats_module() -> Any:
    return broker.client_library("nats", "the NATS connectors need", "nats", "nats-py>=2.6")


async def nats_connect(url: str) -> Any:
    """A connection that fails fast (one retry, no reconnects later) and logs nothing by itself; a
    failure names its cause."""
    errors: list[Exception] = []

    async def keep(exc: Exception) -> None:
        errors.append(exc)

    try:
        # nats-py retries forever with max_reconnect_attempts=0: 1 is one retry.
        return await nats_module().connect(url, connect_timeout=CONNECT_TIMEOUT_S, allow_reconnect=False,
                                     max_reconnect_attempts=1, reconnect_time_wait=0.2, error_cb=keep)
    except Exception as exc:
        raise Unreachable(reason(errors[-1] if errors else exc)) from None


class Unreachable(ConnectionError):
    """No connection to the server; the message is the cause."""


def reason(exc: BaseException) -> str:
    text = str(exc).strip()
    if isinstance(exc, Unreachable):
        return text
    return f"{type(exc).__name__}: {text}" if text and type(exc).__name__ not in text else text or type(exc).__name__


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` matches the NATS subject filter ``pattern`` (``*``: one token, ``>``: the rest).

    >>> subject_matches("orders.*", "orders.eu"), subject_matches("orders.>", "orders.eu.1")
    (True, True)
    >>> subject_matches("orders.*", "orders.eu.1"), subject_matches("orders.>", "orders")
    (False, False)
    """
    want, got = pattern.split("."), subject.split(".")
    for k, token in enumerate(want):
        if token == ">":
            return len(got) > k
        if k >= len(got) or (token != "*" and token != got[k]):
            return False
    return len(got) == len(want)


def micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // _ONE_US


_ONE_US = datetime.resolution


# ----------------------------------------------------------------------------------------
# Messages to Arrow record batches.

class MessageDecoder:
    """Turns messages (payload, subject, stream sequence, time in µs) into record batches of the
    source's Arrow schema: good rows first, then dead letters (``headrace/connectors/payloads.py``)."""

    def __init__(self, options: dict[str, str], schema: Schema, stream: str) -> None:
        self.stream = stream
        self.payloads = PayloadDecoder(schema, options.get("format", "json"))
        self.arrow = batch_schema((*schema, *METADATA), dead_letters=True)

    def batches(self, payloads: list[bytes], subjects: list[str], seqs: list[int], times: list[int]
                ) -> Iterator[pa.RecordBatch]:
        dead: Dead = {}
        columns = self.payloads.columns(payloads, dead)
        metadata = [pa.array(subjects, pa.string()), pa.array(seqs, pa.int64()),
                    pa.array(times, pa.int64()).cast(self.arrow.field("nats_time").type)]
        yield from record_batches(self.arrow, columns, metadata, dead, [f"{self.stream}/{seq}" for seq in seqs])


# ----------------------------------------------------------------------------------------
# Reading a range of stream sequences.

class RangeReader:
    """The messages of ``stream`` with sequences after ``after`` up to ``upto`` (inclusive) that match
    ``subjects``, through an ephemeral pull consumer starting at ``after + 1`` (module docstring)."""

    def __init__(self, url: str, stream: str, subjects: tuple[str, ...], after: int, upto: int, source: str) -> None:
        self.url, self.stream, self.subjects, self.source = url, stream, subjects, source
        self.after, self.upto, self.last = after, upto, after
        self.done = upto <= after
        self._nc: Any = None
        self._js: Any = None
        self._sub: Any = None
        self._consumer = f"headrace_{uuid.uuid4().hex}"
        self._delivered = 0  # the consumer sequence of the last message

    def _failed(self, doing: str, exc: BaseException) -> SourceError:
        return SourceError(f"source {self.source!r}: NATS at {redact_dsn(self.url)}: stream {self.stream!r}: "
                           f"{doing}: {reason(exc)}")

    async def open(self) -> None:
        if self.done:
            return
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        try:
            self._nc = await nats_connect(self.url)
        except Exception as exc:  # noqa: BLE001 - nats-py's errors, named in the message
            raise self._failed("cannot connect", exc) from None
        self._js = self._nc.jetstream(timeout=REQUEST_TIMEOUT_S)
        config = ConsumerConfig(
            name=self._consumer, deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.after + 1,
            ack_policy=AckPolicy.NONE, filter_subject=self.subjects[0] if len(self.subjects) == 1 else None,
            inactive_threshold=CONSUMER_IDLE_S, mem_storage=True, num_replicas=1)
        try:
            info = await self._js.add_consumer(self.stream, config)
            self._sub = await self._js.pull_subscribe_bind(consumer=self._consumer, stream=self.stream)
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"cannot read sequences {self.after + 1}..{self.upto}", exc) from None
        self.done = info.num_pending == 0

    async def next_chunk(self) -> list[Any]:
        """The next messages of the range (possibly none), in sequence order."""
        if self.done:
            return []
        nats = nats_module()
        want = max(1, min(FETCH_MESSAGES, self.upto - self.last))
        try:
            messages = await self._sub.fetch(want, timeout=REQUEST_TIMEOUT_S)
        except nats.errors.TimeoutError:
            messages = []
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"cannot read sequences {self.last + 1}..{self.upto}", exc) from None
        if not messages:  # no reply: were the range's last messages removed meanwhile?
            try:
                pending = (await self._sub.consumer_info()).num_pending
            except Exception as exc:  # noqa: BLE001
                raise self._failed(f"cannot read sequences {self.last + 1}..{self.upto}", exc) from None
            if pending:
                raise self._failed(f"cannot read sequences {self.last + 1}..{self.upto}",
                                   TimeoutError(f"no messages within {REQUEST_TIMEOUT_S:.0f} s"))
            self.done = True
            return []
        kept = []
        for message in messages:
            meta = message.metadata
            if meta.sequence.consumer != self._delivered + 1:
                raise self._failed(f"reading sequences {self.after + 1}..{self.upto}",
                                   RuntimeError(f"messages were lost in delivery (consumer sequence "
                                                f"{meta.sequence.consumer} after {self._delivered})"))
            self._delivered = meta.sequence.consumer
            if meta.sequence.stream > self.upto:
                self.done = True
                break
            self.last = meta.sequence.stream
            if not self.subjects or len(self.subjects) == 1 or \
                    any(subject_matches(pattern, message.subject) for pattern in self.subjects):
                kept.append(message)
            if meta.num_pending == 0 or self.last >= self.upto:
                self.done = True
                break
        return kept

    async def close(self) -> None:
        if self._nc is None:
            return
        try:
            if self._sub is not None:
                await self._js.delete_consumer(self.stream, self._consumer)
        except Exception:  # noqa: BLE001 - the server deletes an idle consumer anyway
            pass
        try:
            await self._nc.close()
        except Exception:  # noqa: BLE001 - closing must not fail
            pass


def stream_state(url: str, source: str, stream: str) -> Any:
    """The JetStream stream's state (first and last sequence); a SourceError names what failed."""
    def failed(doing: str, exc: BaseException) -> SourceError:
        return SourceError(f"source {source!r}: NATS at {redact_dsn(url)}: {doing}: {reason(exc)}")

    async def state() -> Any:
        try:
            nc = await nats_connect(url)
        except Exception as exc:  # noqa: BLE001
            raise failed("cannot connect", exc) from None
        try:
            return (await nc.jetstream(timeout=REQUEST_TIMEOUT_S).stream_info(stream)).state
        except nats_module().js.errors.NotFoundError:
            raise SourceError(f"source {source!r}: NATS at {redact_dsn(url)}: no JetStream stream named {stream!r}; "
                              f"create it first (e.g. nats stream add {stream})") from None
        except Exception as exc:  # noqa: BLE001
            raise failed(f"cannot read the stream {stream!r}", exc) from None
        finally:
            await nc.close()
    return asyncio.run(state())


def _check_url(where: str, url: str) -> None:
    if not isinstance(url, str) or not url.startswith(("nats://", "tls://", "ws://", "wss://")):
        raise PlanError(f"{where}: url {redact_dsn(str(url))!r} is not a nats://, tls://, ws:// or wss:// URL")


@dataclass(frozen=True, init=False)
class Nats(broker.Source, metadata=METADATA, spark_reader="nats_jetstream:NatsDataSource"):
    """Messages of the JetStream stream ``stream`` at ``url``, read by stream sequence.

    ``subjects``: a subject filter (wildcards allowed), a comma-separated list or a list (None: every
    message of the stream). ``format``: "json" (the payload is a JSON object) or "raw" (the payload
    is the schema's one column, string or binary). ``schema``: the record's fields (any form
    ``schema_of`` accepts); the source adds ``nats_subject``, ``nats_seq`` and ``nats_time``.
    ``start``: where a new pipeline starts, "earliest" or "latest" (a restarted one continues from
    its checkpoint). ``max_records_per_batch``: stream sequences per micro-batch (None: all there
    are). ``partition_records``: sequences per Spark partition at most. Exactly-once while the
    messages are kept.
    """

    stream: str
    data_schema: Schema
    subjects: tuple[str, ...]
    url: str
    format: str
    start: str
    max_records_per_batch: int | None
    partition_records: int

    def __init__(self, stream: str, *, schema: Any, subjects: str | Sequence[str] | None = None,
                 url: str = DEFAULT_URL, format: str = "json", start: str = "earliest",
                 max_records_per_batch: int | None = DEFAULT_MAX_RECORDS,
                 partition_records: int = PARTITION_RECORDS) -> None:
        if not isinstance(stream, str) or not stream.strip() or _BAD_TOKEN.search(stream.strip()):
            raise PlanError(f"Nats(): stream must be a JetStream stream name (no spaces, '.', '*' or '>'), "
                            f"got {stream!r}")
        stream = stream.strip()
        where = f"Nats({stream})"
        filters = broker.name_list(subjects)
        for subject in filters:
            if re.search(r"\s", subject) or "" in subject.split("."):
                raise PlanError(f"{where}: {subject!r} is not a NATS subject filter (tokens separated by '.')")
        if len(set(filters)) != len(filters):
            raise PlanError(f"{where}: a subject is named twice in subjects=")
        broker.check_reading(where, format, FORMATS, schema, start, STARTS)
        _check_url(where, url)
        broker.check_batch_sizes(where, max_records_per_batch, partition_records)
        data_schema = broker.payload_schema(where, schema, METADATA, format,
                                            "string or binary field, e.g. schema='payload string'; got {schema}")
        self._assign(stream=stream, data_schema=data_schema, subjects=filters, url=url, format=format, start=start,
                     max_records_per_batch=max_records_per_batch, partition_records=partition_records)

    def offset_identity(self) -> dict[str, Any]:
        """An offset is a stream sequence: the stream, the filter and how a message becomes a record
        fix what it means; the server's URL, where a new pipeline starts and batch sizes do not."""
        return {"stream": self.stream, "subjects": list(self.subjects), "format": self.format,
                "schema": to_ddl(self.data_schema)}

    def describe(self) -> dict[str, Any]:
        return {"type": "Nats", "stream": self.stream, "subjects": list(self.subjects) or None,
                "url": redact_dsn(self.url), "format": self.format, "schema": to_ddl(self.data_schema),
                "start": self.start, "max_records_per_batch": self.max_records_per_batch,
                "partition_records": self.partition_records,
                "guarantee": self.guarantee.value, "dead_letters": True}

    def prepare(self, context: SourceContext) -> None:
        """Fail before Spark starts when the server cannot be reached or the stream does not exist."""
        nats_module()
        stream_state(self.url, context.source_name, self.stream)


# ----------------------------------------------------------------------------------------
# The sink.

def commit_key(identity: str) -> str:
    """The key of a sink identity in the commits bucket (letters, digits, ``-_=/``, and a digest).

    >>> commit_key("out/orders@3274e357-0c1e")
    'out/orders_3274e357-0c1e.26183026d9'
    """
    digest = hashlib.sha1(identity.encode()).hexdigest()[:10]
    return re.sub(r"[^-/_=a-zA-Z0-9]", "_", identity) + "." + digest


def message_ids(prefix: str, values: list[str]) -> list[str]:
    """``<prefix>/<digest of the value>.<how many equal values came before>`` for each value: ids
    that name rows by content, whatever their order in a replay.

    >>> ids = message_ids("s/0", ['{"a":1}', '{"a":2}', '{"a":1}'])
    >>> [i.rsplit(".", 1)[1] for i in ids], [i.rsplit(".", 1)[0] for i in ids].count(ids[0].rsplit(".", 1)[0])
    (['0', '0', '1'], 2)
    """
    seen: dict[str, int] = {}
    ids = []
    for value in values:
        digest = hashlib.sha256(value.encode()).hexdigest()[:32]
        count = seen.get(digest, 0)
        seen[digest] = count + 1
        ids.append(f"{prefix}/{digest}.{count}")
    return ids


class NatsSink(broker.Sink):
    """Publish each row as a JSON object to the JetStream subject ``subject`` at ``url``.

    ``key``: a column whose value is appended to the subject as its last token
    (``subject.<value>``); None: every row goes to ``subject``. ``stream``: the stream that must take
    the messages (None: the stream whose subjects hold ``subject``, found when the query starts).
    ``exactly_once``: require the stream's duplicate window to be at least 2 minutes (see the
    module's docstring); False takes any window and declares at-least-once.
    """

    def __init__(self, subject: str, *, url: str = DEFAULT_URL, key: str | None = None, stream: str | None = None,
                 exactly_once: bool = True, name: str | None = None) -> None:
        if not isinstance(subject, str) or not subject.strip() or re.search(r"[\s*>]", subject) \
                or "" in subject.split("."):
            raise PlanError(f"Nats sink: subject must be a NATS subject without wildcards (tokens separated by "
                            f"'.'), got {subject!r}")
        where = f"Nats sink for subject {subject!r}"
        _check_url(where, url)
        broker.check_key(where, key)
        if stream is not None and (not isinstance(stream, str) or not stream or _BAD_TOKEN.search(stream)):
            raise PlanError(f"{where}: stream must be a JetStream stream name, got {stream!r}")
        super().__init__(name)
        self.subject, self.url, self.key, self.stream = subject, url, key, stream
        self.exactly_once = bool(exactly_once)
        self._target: str | None = stream  # the stream found by prepare

    @property
    def guarantee(self) -> Guarantee:  # type: ignore[override]
        return Guarantee.EXACTLY_ONCE if self.exactly_once else Guarantee.AT_LEAST_ONCE

    @property
    def name(self) -> str:
        return self._name or self.subject

    def describe(self) -> dict[str, Any]:
        return {"type": "Nats", "subject": self.subject, "url": redact_dsn(self.url), "key": self.key,
                "stream": self.stream, "exactly_once": self.exactly_once, "guarantee": self.guarantee.value}

    def __repr__(self) -> str:
        return (f"Nats({self.subject!r}, url={redact_dsn(self.url)!r}, key={self.key!r}, stream={self.stream!r}, "
                f"exactly_once={self.exactly_once!r})")

    def _failed(self, doing: str, exc: BaseException) -> SinkError:
        return SinkError(f"{self._where()}: NATS at {redact_dsn(self.url)}: {doing}: {reason(exc)}")

    async def _session(self) -> tuple[Any, Any]:
        try:
            nc = await nats_connect(self.url)
        except Exception as exc:  # noqa: BLE001 - nats-py's errors, named in the message
            raise self._failed("cannot connect", exc) from None
        return nc, nc.jetstream(timeout=REQUEST_TIMEOUT_S)

    async def _commits(self, js: Any) -> Any:
        """The key-value bucket holding each sink's last committed batch id (created when missing)."""
        errors = nats_module().js.errors
        try:
            return await js.key_value(COMMITS_BUCKET)
        except errors.BucketNotFoundError:
            return await js.create_key_value(bucket=COMMITS_BUCKET, history=1)

    # -- before the query ---------------------------------------------------------------------

    def prepare(self, run_dir: str) -> None:
        """Find the target stream, check its duplicate window, and make the commits bucket."""
        nats_module()
        self._target = asyncio.run(self._prepare())

    async def _prepare(self) -> str:
        errors = nats_module().js.errors
        nc, js = await self._session()
        probe = f"{self.subject}.x" if self.key else self.subject
        try:
            try:
                found = await js.find_stream_name_by_subject(probe)
            except errors.NotFoundError:
                found = None
            if self.stream is not None and found != self.stream:
                try:
                    await js.stream_info(self.stream)
                except errors.NotFoundError:
                    raise SinkError(f"{self._where()}: NATS at {redact_dsn(self.url)}: no JetStream stream named "
                                    f"{self.stream!r}; create it first, with a subject that takes {probe!r}") from None
                raise SinkError(f"{self._where()}: the JetStream stream {self.stream!r} does not take the subject "
                                f"{probe!r}" + (f" (the stream {found!r} does)" if found else "")
                                + "; add it to the stream's subjects")
            if found is None:
                raise SinkError(f"{self._where()}: NATS at {redact_dsn(self.url)}: no JetStream stream takes the "
                                f"subject {probe!r}; create one (e.g. nats stream add --subjects "
                                f"'{self.subject}{'.*' if self.key else ''}')")
            window = float((await js.stream_info(found)).config.duplicate_window or 0)
            if self.exactly_once and window < MIN_DUPLICATE_WINDOW_S:
                raise SinkError(
                    f"{self._where()}: the JetStream stream {found!r} drops duplicate messages within "
                    f"{window:g} s; exactly-once needs a duplicate window of at least {MIN_DUPLICATE_WINDOW_S:g} s "
                    f"(nats stream edit {found} --dupe-window 2m), or pass exactly_once=False (at-least-once)")
            await self._commits(js)
            return str(found)
        except SinkError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise self._failed("cannot check the target stream", exc) from None
        finally:
            await nc.close()

    # -- commits ------------------------------------------------------------------------------

    def last_committed(self) -> int | None:
        """The last batch id this sink recorded, or None."""
        return asyncio.run(self._last_committed())

    async def _last_committed(self) -> int | None:
        errors = nats_module().js.errors
        nc, js = await self._session()
        try:
            entry = await (await self._commits(js)).get(commit_key(self.name))
            return int(entry.value)
        except errors.KeyNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001
            raise self._failed(f"cannot read the bucket {COMMITS_BUCKET}", exc) from None
        finally:
            await nc.close()

    def committed(self, batch_id: int) -> bool:
        last = self.last_committed()
        return last is not None and last >= batch_id

    # -- writing ------------------------------------------------------------------------------

    def write_batch(self, df: Any, batch_id: int) -> None:
        # toArrow reads the whole batch, so its stateful operators commit
        table = broker.keyed_json(df, self.key, self._where()).toArrow()
        values = [str(v) for v in table.column("value").to_pylist()]
        keys = table.column("key").to_pylist() if self.key else None
        subjects = [self.subject] * len(values) if keys is None else [self._subject(k, values[i])
                                                                       for i, k in enumerate(keys)]
        asyncio.run(self._publish(batch_id, subjects, values))

    def _subject(self, key: Any, value: str) -> str:
        if key is None or key == "" or _BAD_TOKEN.search(str(key)):
            raise SinkError(f"{self._where()}: the key column {self.key!r} holds {key!r} in the row {value}; "
                            f"a subject token cannot be empty nor hold spaces, '.', '*' or '>'")
        return f"{self.subject}.{key}"

    async def _publish(self, batch_id: int, subjects: list[str], values: list[str]) -> None:
        nc, js = await self._session()
        ids = message_ids(f"{self.name}/{batch_id}", values)
        try:
            acks = []
            try:
                for subject, value, msg_id in zip(subjects, values, ids, strict=True):
                    acks.append(await js.publish_async(subject, value.encode(), stream=self._target,
                                                       headers={"Nats-Msg-Id": msg_id}))
            except Exception as exc:  # noqa: BLE001
                raise self._failed(f"cannot publish batch {batch_id}", exc) from None
            if acks:
                _, waiting = await asyncio.wait(acks, timeout=REQUEST_TIMEOUT_S)
                if waiting:
                    raise SinkError(f"{self._where()}: NATS at {redact_dsn(self.url)}: {len(waiting)} of the "
                                    f"{len(acks)} messages of batch {batch_id} were not acknowledged within "
                                    f"{REQUEST_TIMEOUT_S:.0f} s")
                for row, ack in enumerate(acks):
                    if ack.exception() is not None:
                        raise self._failed(f"batch {batch_id}: JetStream refused the row {values[row]} on "
                                           f"{subjects[row]!r}", ack.exception())  # type: ignore[arg-type]
            try:
                await (await self._commits(js)).put(commit_key(self.name), str(batch_id).encode())
            except Exception as exc:  # noqa: BLE001
                raise self._failed(f"cannot record batch {batch_id} in the bucket {COMMITS_BUCKET}", exc) from None
        finally:
            await nc.close()
