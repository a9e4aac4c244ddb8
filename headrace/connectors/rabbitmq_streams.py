"""RabbitMQ Streams: a replayable source reading a stream by offset, and a sink publishing with de-duplication.

Both speak RabbitMQ's stream protocol through the asyncio client ``rstream``
(``pip install 'headrace[rabbitmq]'``), on an event loop of their own: Spark calls data sources and
``foreachBatch`` synchronously. The URL is ``rabbitmq-stream://user:password@host:port/vhost`` (the
vhost URL-encoded: ``%2f`` is ``/``).

**Source offsets.** ``{"offset": last stream offset read}``, e.g. ``{"offset": 1199}`` (-1: none yet).
Spark logs the end offset before the batch runs; the batch reads the stream offsets ``start+1`` to
``end`` (inclusive): each Spark partition subscribes at the first offset of its range and stops at
its last, never "whatever is there now", so a replayed batch reads exactly the same messages.
Exactly-once while the messages are kept: a message removed by the stream's retention before its
batch committed is not read again. Nothing is written to the broker (no stored consumer offsets).

**Latest offset.** The stream protocol of RabbitMQ 3.10 (Debian 12's) has no ``stream stats``
command, so ``latestOffset`` subscribes at ``last``: the broker then delivers the stream's last
committed chunk first, whose first offset plus its record count, minus one, is the last committed
offset. An empty stream delivers nothing: it is waited for ``LAST_CHUNK_WAIT_S`` each time. The end
is capped by ``max_records_per_batch`` and by adaptive admission; what is left is reported as the
source's backlog. With the stop file present it returns its start.

**Records.** ``format="json"``: the payload is a JSON object read against ``schema`` as JSON lines
are; ``format="raw"``: the payload is the schema's one column (string or binary). A payload in AMQP
1.0 encoding (what most clients, and this module's sink, publish) is read from its data (or value)
section; any other payload is taken as is. Besides the schema's columns, every record has
``rabbitmq_offset`` and ``rabbitmq_time`` (the time the broker wrote the message's chunk:
``event_time="rabbitmq_time"`` uses it as event time). A message that does not fit goes to the dead
letters with ``<stream>@<offset>`` as its position.

**Sink.** Each row is published as a JSON object (Spark's ``to_json``) in an AMQP 1.0 data section,
with the publisher ``reference`` ``headrace/<sink identity>`` (``bind``: step, pipeline and
checkpoint) and a ``publishing_id`` per row. The broker keeps, per stream and reference, the last
publishing id it wrote, and drops a message whose id is not above it. A batch's rows are sorted by
their JSON (then key), so a replay publishes them in the same order, and row ``k`` of ``n`` of
batch ``b`` gets ``b * 2**20 + 2**20 - n + k``: ids grow strictly across batches and a batch's last
row takes the top id of the batch's block, so ``committed(b)`` is "the broker's last id for the
reference is at least ``(b + 1) * 2**20 - 1``" (``query_publisher_sequence``). A batch over 2**20
rows is refused.

Exactly-once holds when (1) a replayed batch has the same rows as its first run (a replayable
source and deterministic steps: headrace's design), (2) nothing else publishes under the same
reference, i.e. one pipeline per sink step and checkpoint, and (3) the stream keeps its publisher
tracking (deleting and re-creating the stream forgets it). A crash in the middle of a batch leaves a
prefix of its rows written; the replay re-sends them all and the broker drops that prefix. The rows
pass through the driver (``toArrow``), which reads the batch in full; cap batch sizes at the source.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, TypeVar, overload
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from headrace.connectors import broker
from headrace.connectors.base import redact_dsn
from headrace.connectors.file_formats.reader import batch_schema
from headrace.connectors.payloads import Dead, PayloadDecoder, record_batches, text
from headrace.contract import Guarantee, SourceContext
from headrace.errors import PlanError, SinkError, SourceError
from headrace.schema import Schema, to_ddl

T = TypeVar("T")

DEFAULT_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f"
FORMATS = ("json", "raw")
STARTS = ("first", "last", "next")
METADATA: Schema = (("rabbitmq_offset", "long"), ("rabbitmq_time", "timestamp"))
DEFAULT_MAX_RECORDS = 100_000
PARTITION_RECORDS = 50_000  # offsets per Spark partition, at most
ROWS_PER_BATCH = 10_000  # rows per Arrow batch a reader yields
CREDIT = 4  # chunks the broker may send ahead of the reader
CONNECT_TIMEOUT_S = 10.0
LAST_CHUNK_WAIT_S = 2.0  # how long an empty stream is waited for its last chunk
READ_IDLE_S = 60.0  # a read waiting this long for a planned offset fails
CONFIRM_TIMEOUT_S = 120.0
BLOCK = 2 ** 20  # publishing ids per batch
FRAME_BYTES = 512 * 1024  # payload bytes per publish frame (the client's frame_max is 1 MiB)


def rstream_module() -> Any:
    return broker.client_library("rstream", "RabbitMQ Streams need", "rabbitmq", "rstream>=1.1")


@dataclass(frozen=True)
class StreamUrl:
    """A ``rabbitmq-stream://user:password@host:port/vhost`` URL, parsed.

    >>> StreamUrl.parse("rabbitmq-stream://app:s3cret@mq:5553/prod%2Feu")
    StreamUrl(host='mq', port=5553, user='app', password='s3cret', vhost='prod/eu')
    >>> StreamUrl.parse("rabbitmq-stream://127.0.0.1").vhost
    '/'
    """

    host: str
    port: int
    user: str
    password: str
    vhost: str

    @staticmethod
    def parse(url: str) -> StreamUrl:
        parts = urlsplit(url)
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        return StreamUrl(parts.hostname or "127.0.0.1", parts.port or 5552, unquote(parts.username or "guest"),
                         unquote(parts.password or "guest"), unquote(path) or "/")


def _check_url(where: str, url: Any) -> None:
    if not isinstance(url, str) or not url.startswith(("rabbitmq-stream://", "rabbitmq-stream+tls://")):
        raise PlanError(f"{where}: url {redact_dsn(str(url))!r} is not a rabbitmq-stream:// URL, e.g. {DEFAULT_URL}")
    try:
        StreamUrl.parse(url)
    except ValueError as exc:
        raise PlanError(f"{where}: url {redact_dsn(url)!r} is not a valid URL: {exc}") from None


def reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


async def rabbitmq_connect(url: str, name: str) -> Any:
    """A started, authenticated stream-protocol client."""
    from rstream.client import Addr, ClientPool

    where = StreamUrl.parse(url)
    pool = ClientPool(where.host, where.port, username=where.user, password=where.password, vhost=where.vhost,
                      frame_max=1024 * 1024, heartbeat=60, load_balancer_mode=False, max_retries=1)
    return await asyncio.wait_for(pool.new(connection_name=name, addr=Addr(where.host, where.port)),
                                  CONNECT_TIMEOUT_S)


async def rabbitmq_close(client: Any) -> None:
    try:
        await asyncio.wait_for(client.close(), 10)
    except Exception:  # noqa: BLE001 - closing must not fail
        pass


class Loop:
    """A private event loop with one client on it, made again when its connection drops."""

    def __init__(self, url: str, name: str) -> None:
        self.url, self.name = url, name
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client: Any = None

    def run(self, work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        return self.loop.run_until_complete(self._run(work))

    async def _run(self, work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        if self.client is None or not self.client.is_connection_alive():
            self.client = await rabbitmq_connect(self.url, self.name)
        try:
            return await work(self.client)
        except BaseException:
            client, self.client = self.client, None
            await rabbitmq_close(client)
            raise

    def close(self) -> None:
        if self.loop is None:
            return
        if self.client is not None:
            self.loop.run_until_complete(rabbitmq_close(self.client))
        left = asyncio.all_tasks(self.loop)  # the client's reader and heartbeat, when its close did not end them
        for task in left:
            task.cancel()
        if left:
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self.loop.close()
        self.loop, self.client = None, None


class Subscription:
    """One subscription's Deliver frames, in a queue of their own."""

    def __init__(self, client: Any, subscription_id: int) -> None:
        from rstream import schema

        self.client, self.id = client, subscription_id
        self.frames: asyncio.Queue[Any] = asyncio.Queue()
        client.add_handler(schema.Deliver, self.frames.put_nowait, name=str(subscription_id))

    async def start(self, stream: str, offset_type: Any, offset: int | None) -> None:
        from rstream import schema

        await self.client.run_queue_listener_task(self.id, self.frames.put_nowait)
        await self.client.subscribe(stream, self.id, schema.OffsetSpec.from_params(offset_type, offset),
                                    initial_credit=CREDIT)

    async def next_chunk(self, timeout: float) -> Any:
        frame = await asyncio.wait_for(self.frames.get(), timeout)
        await self.client.credit(self.id, 1)
        return frame

    async def stop(self) -> None:
        from rstream import schema

        try:
            await asyncio.wait_for(self.client.unsubscribe(self.id), 10)
        finally:
            self.client.remove_handler(schema.Deliver, name=str(self.id))
            await self.client.stop_queue_listener_task(self.id)


async def last_chunk(client: Any, stream: str, wait_s: float = LAST_CHUNK_WAIT_S) -> tuple[int, int] | None:
    """(first offset, last offset) of the stream's last committed chunk, or None when the stream is
    empty (no chunk within ``wait_s``)."""
    from rstream.constants import OffsetType

    subscription = Subscription(client, 1)
    await subscription.start(stream, OffsetType.LAST, None)
    try:
        frame = await subscription.next_chunk(wait_s)
    except TimeoutError:
        return None
    finally:
        await subscription.stop()
    return int(frame.chunk_first_offset), int(frame.chunk_first_offset) + int(frame.num_records) - 1


# ----------------------------------------------------------------------------------------
# Messages to Arrow record batches.

def payload(message: bytes) -> bytes:
    """The application payload of a stored message: the data (or value) section of an AMQP 1.0
    encoded message, any other bytes as they are.

    >>> payload(b'\\x00Su\\xa0\\x07{"a":1}'), payload(b'{"a":1}')
    (b'{"a":1}', b'{"a":1}')
    """
    if message[:4] == b"\x00Su\xa0":  # one data section, vbin8: what this module's sink writes
        end = 5 + message[4]
        if len(message) == end:
            return message[5:end]
    if message[:2] != b"\x00S":
        return message
    from rstream.amqp import amqp_decoder

    decoded = amqp_decoder(message)
    body = decoded.body if decoded.body is not None else decoded.value
    if isinstance(body, list):
        body = b"".join(part if isinstance(part, bytes) else bytes(part) for part in body)
    if isinstance(body, str):
        return body.encode()
    return bytes(body) if body is not None else b""


class Positions(Sequence[str]):
    """``<stream>@<offset>`` of each row, made only for the rows asked for (the dead letters).

    >>> Positions("orders", [7, 8])[1], len(Positions("orders", [7, 8]))
    ('orders@8', 2)
    """

    def __init__(self, stream: str, offsets: list[int]) -> None:
        self.stream, self.offsets = stream, offsets

    def __len__(self) -> int:
        return len(self.offsets)

    @overload
    def __getitem__(self, row: int) -> str: ...

    @overload
    def __getitem__(self, row: slice) -> Sequence[str]: ...

    def __getitem__(self, row: int | slice) -> str | Sequence[str]:
        if isinstance(row, slice):
            return [f"{self.stream}@{o}" for o in self.offsets[row]]
        return f"{self.stream}@{self.offsets[row]}"


class MessageDecoder:
    """Turns messages (payload, offset, chunk time in ms) into record batches of the source's Arrow
    schema: good rows first, then dead letters (``headrace/connectors/payloads.py``)."""

    def __init__(self, options: dict[str, str], schema: Schema, stream: str) -> None:
        self.stream = stream
        self.payloads = PayloadDecoder(schema, options.get("format", "json"))
        self.arrow = batch_schema((*schema, *METADATA), dead_letters=True)

    def batches(self, messages: list[bytes], offsets: list[int], times: list[int]) -> Iterator[pa.RecordBatch]:
        dead: Dead = {}
        bodies = messages  # as they are, but for AMQP 1.0 messages
        if any(map(bytes.startswith, messages, repeat(b"\x00S"))):  # (no Python code per message)
            bodies = list(messages)
            for row in (row for row, message in enumerate(messages) if message[:2] == b"\x00S"):
                try:
                    bodies[row] = payload(messages[row])
                except Exception as exc:  # noqa: BLE001 - the AMQP decoder's errors, named in the record
                    dead[row] = (text(messages[row]), f"invalid AMQP 1.0 message ({reason(exc)})")
                    bodies[row] = b"{}"
        columns = self.payloads.columns(bodies, dead)
        metadata = [pa.array(offsets, pa.int64()),
                    pc.multiply(pa.array(times, pa.int64()), 1000).cast(self.arrow.field("rabbitmq_time").type)]
        yield from record_batches(self.arrow, columns, metadata, dead, Positions(self.stream, offsets))


def source_failed(source: str, url: str, doing: str, exc: BaseException) -> SourceError:
    return SourceError(f"source {source!r}: RabbitMQ at {redact_dsn(url)}: {doing}: {reason(exc)}")


def _check_stream(where: str, stream: Any) -> str:
    if not isinstance(stream, str) or not stream.strip():
        raise PlanError(f"{where}: stream must be a stream name, got {stream!r}")
    if len(stream.encode()) > 255:
        raise PlanError(f"{where}: a stream name has at most 255 bytes, got {len(stream.encode())}")
    return stream


@dataclass(frozen=True, init=False)
class RabbitMQ(broker.Source, metadata=METADATA, spark_reader="rabbitmq_streams:RabbitMQDataSource"):
    """The messages of the RabbitMQ stream ``stream``, read over the stream protocol from ``url``.

    ``format``: "json" (the payload is a JSON object) or "raw" (the payload is the schema's one
    column, string or binary). ``schema``: the record's fields (any form ``schema_of`` accepts);
    the source adds ``rabbitmq_offset`` and ``rabbitmq_time``. ``start``: where a new pipeline
    starts: "first" (every message kept), "last" (the stream's last chunk on) or "next" (only
    messages published after it starts); a restarted one continues from its checkpoint.
    ``max_records_per_batch``: messages per micro-batch (None: all there are).
    ``partition_records``: offsets per Spark partition at most. Exactly-once while the messages
    are kept (see the module's docstring).
    """

    stream: str
    data_schema: Schema
    url: str
    format: str
    start: str
    max_records_per_batch: int | None
    partition_records: int

    def __init__(self, stream: str, *, schema: Any, url: str = DEFAULT_URL, format: str = "json",
                 start: str = "first", max_records_per_batch: int | None = DEFAULT_MAX_RECORDS,
                 partition_records: int = PARTITION_RECORDS) -> None:
        _check_stream("RabbitMQ()", stream)
        where = f"RabbitMQ({stream})"
        broker.check_reading(where, format, FORMATS, schema, start, STARTS)
        _check_url(where, url)
        broker.check_batch_sizes(where, max_records_per_batch, partition_records)
        data_schema = broker.payload_schema(where, schema, METADATA, format,
                                            "string or binary column, e.g. schema='body string'")
        self._assign(stream=stream, data_schema=data_schema, url=url, format=format, start=start,
                     max_records_per_batch=max_records_per_batch, partition_records=partition_records)

    def offset_identity(self) -> dict[str, Any]:
        """An offset is a position in one stream: the stream and how a message becomes a record
        fix what it means; the URL, where a new pipeline starts and batch sizes do not."""
        return {"stream": self.stream, "format": self.format, "schema": to_ddl(self.data_schema)}

    def describe(self) -> dict[str, Any]:
        return {"type": "RabbitMQ", "stream": self.stream, "url": redact_dsn(self.url), "format": self.format,
                "schema": to_ddl(self.data_schema), "start": self.start,
                "max_records_per_batch": self.max_records_per_batch, "partition_records": self.partition_records,
                "guarantee": self.guarantee.value, "dead_letters": True}

    def prepare(self, context: SourceContext) -> None:
        """Fail before Spark starts when the broker cannot be reached or the stream is missing."""
        rstream_module()
        asyncio.run(self._check(context.source_name))

    async def _check(self, source: str) -> None:
        try:
            client = await rabbitmq_connect(self.url, f"headrace-{source}")
        except Exception as exc:  # noqa: BLE001
            raise source_failed(source, self.url, "cannot connect", exc) from None
        try:
            exists = await client.stream_exists(self.stream)
        except Exception as exc:  # noqa: BLE001
            raise source_failed(source, self.url, f"cannot look up the stream {self.stream!r}", exc) from None
        finally:
            await rabbitmq_close(client)
        if not exists:
            raise SourceError(f"source {source!r}: RabbitMQ at {redact_dsn(self.url)}: no stream named "
                              f"{self.stream!r}; create it first (rabbitmq-streams add_stream {self.stream})")


# ----------------------------------------------------------------------------------------
# Sink.

def publishing_ids(batch_id: int, rows: int) -> range:
    """The publishing ids of a batch's rows: the top of the batch's block, so the last row's id
    says the batch is complete.

    >>> ids = publishing_ids(3, 2); (ids[0] - 3 * BLOCK, ids[-1] == 4 * BLOCK - 1)
    (1048574, True)
    """
    top = (batch_id + 1) * BLOCK
    return range(top - rows, top)


def publisher_reference(identity: str) -> str:
    """The publisher reference of a sink identity (at most 256 bytes, as the protocol allows).

    >>> publisher_reference("out/orders@3274e357")
    'headrace/out/orders@3274e357'
    """
    import hashlib

    reference = f"headrace/{identity}"
    if len(reference.encode()) <= 256:
        return reference
    return f"headrace/{hashlib.sha256(identity.encode()).hexdigest()}"


class RabbitMQSink(broker.Sink):
    """Publish each row as a JSON object to the RabbitMQ stream ``stream`` at ``url``, exactly once
    through the broker's de-duplication (see the module's docstring for when that holds).

    ``key``: a column whose value (as text) goes with each message as the AMQP application
    property ``key``; None: no key. ``name``: the identity the publisher reference derives from when
    the sink is not bound to a pipeline's step.
    """

    guarantee = Guarantee.EXACTLY_ONCE

    def __init__(self, stream: str, *, url: str = DEFAULT_URL, key: str | None = None,
                 name: str | None = None) -> None:
        _check_stream("RabbitMQ sink", stream)
        where = f"RabbitMQ sink for stream {stream!r}"
        _check_url(where, url)
        broker.check_key(where, key)
        super().__init__(name)
        self.stream, self.url, self.key = stream, url, key

    @property
    def name(self) -> str:
        return self._name or self.stream

    @property
    def reference(self) -> str:
        return publisher_reference(self.name)

    def describe(self) -> dict[str, Any]:
        return {"type": "RabbitMQ", "stream": self.stream, "url": redact_dsn(self.url), "key": self.key,
                "guarantee": self.guarantee.value}

    def __repr__(self) -> str:
        return f"RabbitMQ({self.stream!r}, url={redact_dsn(self.url)!r}, key={self.key!r})"

    def _run(self, doing: str, work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        if self._connection is None:
            rstream_module()
            self._connection = Loop(self.url, "headrace-sink")
        try:
            return self._connection.run(work)
        except SinkError:
            raise
        except Exception as exc:  # noqa: BLE001 - rstream's errors, named in the message
            raise SinkError(f"{self._where()}: RabbitMQ at {redact_dsn(self.url)}: {doing}: {reason(exc)}") from None

    def prepare(self, run_dir: str) -> None:
        """Fail before the query starts when the broker cannot be reached or the stream is missing."""
        exists = self._run("cannot connect", lambda client: client.stream_exists(self.stream))
        if not exists:
            raise SinkError(f"{self._where()}: RabbitMQ at {redact_dsn(self.url)}: no stream named {self.stream!r}; "
                            f"create it first (rabbitmq-streams add_stream {self.stream})")

    def last_publishing_id(self) -> int:
        """The last publishing id the broker wrote for this sink's reference (0: none)."""
        return self._run("cannot query the publisher sequence",
                         lambda client: client.query_publisher_sequence(self.stream, self.reference))

    def committed(self, batch_id: int) -> bool:
        return self.last_publishing_id() >= publishing_ids(batch_id, 0).stop - 1

    def write_batch(self, df: Any, batch_id: int) -> None:
        # toArrow reads the whole batch, so its stateful operators commit
        table = broker.keyed_json(df, self.key, self._where()).toArrow()
        if table.num_rows > BLOCK:
            raise SinkError(f"{self._where()}: batch {batch_id} has {table.num_rows} rows; a RabbitMQ sink publishes "
                            f"at most {BLOCK} rows per batch (its publishing ids): lower the source's "
                            f"max_records_per_batch")
        if not table.num_rows:
            return
        order = [("value", "ascending")] + ([("key", "ascending")] if self.key else [])
        table = table.take(pc.sort_indices(table, sort_keys=order))  # the same order in a replay
        self.publish(batch_id, table.column("value").to_pylist(),
                     table.column("key").to_pylist() if self.key else None)

    def publish(self, batch_id: int, values: list[str], keys: list[str | None] | None = None,
                count: int | None = None) -> None:
        """Publish the first ``count`` (default: all) of a batch's rows, in the order given, with
        their publishing ids; ``write_batch`` gives them sorted."""
        ids = publishing_ids(batch_id, len(values))
        upto = len(values) if count is None else count
        self._run(f"cannot publish batch {batch_id}",
                  lambda client: self._publish(client, batch_id, values[:upto], None if keys is None else keys[:upto],
                                               ids[:upto]))

    async def _publish(self, client: Any, batch_id: int, values: list[str], keys: list[str | None] | None,
                       ids: range) -> None:
        from rstream import schema
        from rstream.amqp import AMQPMessage

        if not values:
            return
        confirmed: set[int] = set()
        errors: list[str] = []
        done = asyncio.Event()

        def on_confirm(frame: Any) -> None:
            confirmed.update(frame.publishing_ids)
            if len(confirmed) >= len(values):
                done.set()

        def on_error(frame: Any) -> None:
            errors.extend(f"publishing id {e.publishing_id}: code {e.response_code}" for e in frame.errors)
            done.set()

        publisher = 1
        client.add_handler(schema.PublishConfirm, on_confirm, name="headrace-confirm")
        client.add_handler(schema.PublishError, on_error, name="headrace-error")
        await client.declare_publisher(self.stream, self.reference, publisher)
        try:
            frame: list[Any] = []
            size = 0
            for k, value in enumerate(values):
                properties = None if keys is None or keys[k] is None else {"key": keys[k]}
                body = bytes(AMQPMessage(body=value.encode(), application_properties=properties))
                frame.append(schema.Message(publishing_id=ids[k], data=body, filter_value=None))
                size += len(body) + 12
                if size >= FRAME_BYTES:
                    await client.publish(frame, publisher)
                    frame, size = [], 0
            if frame:
                await client.publish(frame, publisher)
            try:
                await asyncio.wait_for(done.wait(), CONFIRM_TIMEOUT_S)
            except TimeoutError:
                raise SinkError(f"{self._where()}: RabbitMQ at {redact_dsn(self.url)}: batch {batch_id}: "
                                f"{len(values) - len(confirmed)} of {len(values)} messages not confirmed within "
                                f"{CONFIRM_TIMEOUT_S:g} s") from None
            if errors:
                raise SinkError(f"{self._where()}: RabbitMQ at {redact_dsn(self.url)}: batch {batch_id}: the stream "
                                f"{self.stream!r} refused messages ({'; '.join(errors[:3])})")
        finally:
            client.remove_handler(schema.PublishConfirm, name="headrace-confirm")
            client.remove_handler(schema.PublishError, name="headrace-error")
            await client.delete_publisher(publisher)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
