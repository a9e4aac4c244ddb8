"""headrace's Python sources against each system's own Python client, reading the same records.

    .venv/bin/python benchmarks/connectors.py                   # every source (about 20 minutes)
    .venv/bin/python benchmarks/connectors.py --only redis,files --runs 5
    .venv/bin/python benchmarks/connectors.py --quick           # a smoke run on small data

Everything runs in one process, on headrace's Spark session (``get_session``). For each source
the benchmark puts ``--records`` JSON objects ``{"id", "user", "kind", "amount"}`` into the system
once (MQTT: before every reading, see below), then reads them back two ways:

* **client**: the system's own Python client in a plain loop, decoding every record's JSON:
  redis: redis-py ``XRANGE`` in chunks of 10,000 entries; postgres-cdc: psycopg reading
  ``pg_logical_slot_peek_changes`` (wal2json, the plugin options headrace uses) through a
  server-side cursor; mqtt: a paho subscriber (MQTT 5, QoS 1, receive maximum 65,535, the
  library's own acknowledgements); nats: nats-py, an ephemeral pull consumer (no acks, in
  memory) fetching 2,000 messages at a time; rabbitmq: rstream's ``Consumer`` (the client headrace's
  connector uses) subscribed at the stream's first offset with its default credit (10 chunks),
  decoding each message in its callback; files: Spark's own ``spark.readStream.schema(...)
  .json(...)`` into the ``noop`` sink (Spark is the reference there, not a Python loop).
* **headrace**: the pipeline ``source -> hr.sinks.Null()`` with the connector's defaults and the
  records' schema, run until it has read every record. Files three ways: ``files``, the default
  reader (Spark's file source under headrace's), unbounded; ``files-bounded``, the same reader
  bounded, run to its end; ``files-python``, headrace's Python reader (``reader="python"``), bounded.

**What is timed.** The client: from its first request (connection included) to the last record
decoded. headrace and ``spark.readStream``: from the start of the first micro-batch to the end of
the last one that read input, from Spark's progress reports (``benchmarks/common.py``), so the
session, the query's start and the connector's ``prepare`` are not timed. Setting the data up is
never timed. Each reader must read exactly ``--records`` records, else the benchmark fails.

**MQTT** cannot replay, so every reading gets its own data: a persistent session (clean start off,
session expiry) subscribed at QoS 1 to a topic of its own is created, ``--records`` QoS 1 messages
are published to that topic while nobody is connected (the broker queues them for the session),
then the reader connects to that session and reads them. Both readers therefore read the same
number of messages queued by the broker for a persistent session; headrace's source (started on
the session before its first micro-batch) may receive up to one receive window (65,535 messages)
before the timed interval opens, which is at most 6.5 % of 1 M.

**PostgreSQL** change data capture reads a logical replication slot that headrace advances as it
commits: a base slot is created before the rows are inserted (1,000 rows per transaction), the
client peeks at it (consuming nothing) and each headrace run reads a copy of it
(``pg_copy_logical_replication_slot``), dropped afterwards.

**RabbitMQ** gets the records once, into a new stream, as bare JSON payloads (no AMQP 1.0
envelope: the client's cheapest case) published with rstream's ``Producer.send_batch``, 5,000
messages per publish frame, so the broker stores them in chunks of up to that many; both readers
read those same chunks. headrace's source uses its defaults (100,000 offsets per micro-batch, Spark
partitions of 50,000).

After one unmeasured warm-up reading of each (not with ``--quick``), ``--runs`` readings of each
alternate (client first, then headrace first, ...). Each source prints both medians in records/s
and the ratio of each pair of readings made one after the other, then the closing line
``<name> ratio=<headrace / client>`` (the median of the pair ratios); the target is 0.8 for the
message systems and 0.95 for files (``files ratio=<x>``). A source whose service cannot be
reached prints ``<name> skipped: <why>`` and the benchmark goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import Print, alternating, fresh_dir, processing_seconds  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = "id long, user string, kind string, amount long"
KINDS = ("view", "click", "view", "buy", "view")
NAMES = ("redis", "postgres-cdc", "mqtt", "nats", "rabbitmq", "files", "files-bounded", "files-python")
TARGETS = {"files": 0.95, "files-bounded": 0.95, "files-python": 0.95}  # the others: TARGET
TARGET = 0.8
READERS = ("client", "headrace")
REDIS_URL = "redis://127.0.0.1:6379/0"
PG_DSN = os.environ.get("HEADRACE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
MQTT_URL = "mqtt://127.0.0.1:1883"
NATS_URL = "nats://127.0.0.1:4222"
RABBITMQ_URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f"
RABBITMQ_PUBLISH_BATCH = 5_000  # messages per publish frame when loading (about 300 KB: under the 1 MiB frame)
PG_TRANSACTION_ROWS = 1_000
CHUNK = 10_000
SETTLE_TIMEOUT_S = 900.0


def record(i: int) -> bytes:
    return b'{"id":%d,"user":"u%d","kind":"%s","amount":%d}' % (i, i % 1000, KINDS[i % 5].encode(), i % 100)


def reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def start_service(script: str, port: int) -> str | None:
    """None when the service answers on ``port`` (started with ``scripts/<script> start`` if need be),
    else why not."""
    if reachable(port):
        return None
    try:
        done = subprocess.run(["bash", os.path.join(ROOT, "scripts", script), "start"], capture_output=True,
                              text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"scripts/{script} start: {exc}"
    if reachable(port):
        return None
    return (done.stderr.strip()[-300:] or f"scripts/{script} start exited {done.returncode}").replace("\n", " ")


@dataclass
class Reading:
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def timed_client(count_records: Callable[[], int]) -> Reading:
    started = time.perf_counter()
    records = count_records()
    return Reading(records, time.perf_counter() - started)


def run_headrace(pipeline: Any, workdir: str, records: int, bounded: bool = False) -> Reading:
    """Run ``pipeline`` until it has read ``records`` records (to its end when bounded); the time
    from Spark's progress reports."""
    from headrace.runtime.runner import PipelineRun

    run = PipelineRun(pipeline, state_dir=fresh_dir(workdir, "headrace"), progress="quiet").start()
    if bounded:
        return reading_of(run.wait().progress)
    deadline = time.time() + SETTLE_TIMEOUT_S
    try:
        while sum(p.get("numInputRows") or 0 for p in run.progress_log) < records:
            if time.time() > deadline:
                raise RuntimeError(f"headrace did not read {records:,} records within {SETTLE_TIMEOUT_S:.0f} s")
            run.settle()
            time.sleep(0.05)
    finally:
        run.request_stop("benchmark done")
    return reading_of(run.wait(until_exhausted=False).progress)


def reading_of(progress: list[dict[str, Any]]) -> Reading:
    data_rows = sum(p.get("numInputRows") or 0 for p in progress)
    return Reading(data_rows, processing_seconds(progress))


def pipeline_of(name: str, source: Any) -> Any:
    import headrace as hr

    p = hr.Pipeline(f"bench_{name.replace('-', '_')}")
    p.source("records", source).sink("out", hr.sinks.Null())
    return p


# ----------------------------------------------------------------------------------------------
# The sources: each puts the records in once (``load``), reads them with its client or with
# headrace, and cleans up. ``unavailable`` says why it cannot run, or None.

@dataclass
class Bench:
    records: int
    workdir: str
    name: str = ""
    control_rows: int = 0  # rows headrace reads besides the records (a bounded source's flush row)

    def unavailable(self) -> str | None:
        return None

    def load(self) -> None:
        pass

    def before(self, reader: str) -> None:
        """Ready the data for one reading (MQTT: publish it)."""

    def client(self) -> Reading:
        raise NotImplementedError

    def headrace(self) -> Reading:
        raise NotImplementedError

    def cleanup(self) -> None:
        pass


@dataclass
class RedisBench(Bench):
    name: str = "redis"
    stream: str = field(default_factory=lambda: f"hr_bench_{uuid.uuid4().hex[:10]}")

    def unavailable(self) -> str | None:
        return start_service("redis.sh", 6379)

    def _redis(self) -> Any:
        import redis

        return redis.Redis.from_url(REDIS_URL, socket_timeout=60)

    def load(self) -> None:
        client = self._redis()
        for first in range(0, self.records, CHUNK):
            pipe = client.pipeline(transaction=False)
            for i in range(first, min(self.records, first + CHUNK)):
                pipe.xadd(self.stream, {"data": record(i)})
            pipe.execute()
        client.close()

    def client(self) -> Reading:
        def read() -> int:
            client, after, count = self._redis(), "-", 0
            while True:
                entries = client.xrange(self.stream, after, "+", count=CHUNK)
                for _, fields in entries:
                    json.loads(fields[b"data"])
                count += len(entries)
                if len(entries) < CHUNK:
                    break
                after = "(" + entries[-1][0].decode()
            client.close()
            return count
        return timed_client(read)

    def headrace(self) -> Reading:
        import headrace as hr

        return run_headrace(pipeline_of(self.name, hr.sources.Redis(self.stream, schema=SCHEMA, url=REDIS_URL)),
                            self.workdir, self.records)

    def cleanup(self) -> None:
        client = self._redis()
        client.delete(self.stream)
        client.close()


@dataclass
class PostgresBench(Bench):
    name: str = "postgres-cdc"
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    copies: int = 0

    @property
    def table(self) -> str:
        return f"hr_bench_cdc_{self.tag}"

    @property
    def base_slot(self) -> str:
        return f"hr_bench_{self.tag}"

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)

    def unavailable(self) -> str | None:
        try:
            conn = self._connect()
        except Exception as exc:  # noqa: BLE001 - psycopg's errors, or no psycopg
            return f"PostgreSQL at {PG_DSN}: {' '.join(str(exc).split())}"
        with conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
        return None if level == "logical" else f"wal_level={level}: run scripts/postgres_logical.sh"

    def load(self) -> None:
        with self._connect() as conn:
            conn.execute(f"CREATE TABLE {self.table} (id bigint PRIMARY KEY, \"user\" text, kind text, amount bigint)")
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (self.base_slot,))
            for first in range(0, self.records, PG_TRANSACTION_ROWS):
                with conn.transaction(), conn.cursor().copy(f"COPY {self.table} FROM STDIN") as copy:
                    for i in range(first, min(self.records, first + PG_TRANSACTION_ROWS)):
                        copy.write_row((i, f"u{i % 1000}", KINDS[i % 5], i % 100))

    def client(self) -> Reading:
        from headrace.connectors.postgres_cdc import _plugin_options

        options = _plugin_options([f"public.{self.table}"])
        query = ("SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL, "
                 + ", ".join(["%s"] * len(options)) + ")")

        def read() -> int:
            import psycopg

            count = 0
            with psycopg.connect(PG_DSN, connect_timeout=5) as conn, conn.cursor(name="bench_changes") as cursor:
                cursor.itersize = CHUNK
                cursor.execute(query, (self.base_slot, *options))
                for _lsn, data in cursor:
                    change = json.loads(data)
                    if change["action"] in "IUD":
                        count += 1
            return count
        return timed_client(read)

    def headrace(self) -> Reading:
        import headrace as hr

        self.copies += 1
        slot = f"{self.base_slot}_{self.copies}"
        with self._connect() as conn:
            conn.execute("SELECT pg_copy_logical_replication_slot(%s, %s)", (self.base_slot, slot))
        try:
            source = hr.sources.PostgresChanges(self.table, dsn=PG_DSN, slot=slot, schema=SCHEMA)
            return run_headrace(pipeline_of(self.name, source), self.workdir, self.records)
        finally:
            drop_slot(self._connect, slot)

    def cleanup(self) -> None:
        drop_slot(self._connect, self.base_slot)
        with self._connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {self.table}")


def drop_slot(connect: Callable[[], Any], slot: str) -> None:
    """Drop ``slot``, waiting a little while the server process of a stopped reader still holds it."""
    for _ in range(60):
        with connect() as conn:
            row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
            if row is None:
                return
            if not row[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                return
        time.sleep(0.5)


@dataclass
class MqttBench(Bench):
    name: str = "mqtt"
    session: str = ""
    topic: str = ""

    def unavailable(self) -> str | None:
        try:
            import paho.mqtt.client  # noqa: F401
        except ImportError:
            return "paho-mqtt is not installed (pip install 'headrace[mqtt]')"
        return start_service("mosquitto.sh", 1883)

    def before(self, reader: str) -> None:
        """A fresh persistent session subscribed to a fresh topic, and the records published to it."""
        tag = uuid.uuid4().hex[:10]
        self.session, self.topic = f"hr-bench-{reader}-{tag}", f"hr_bench/{tag}"
        mqtt_client(self.session, self.topic).disconnect_and_stop()
        publish_mqtt(self.topic, self.records)

    def client(self) -> Reading:
        def read() -> int:
            done, count = threading.Event(), [0]

            def on_message(_client: Any, _userdata: Any, message: Any) -> None:
                json.loads(message.payload)
                count[0] += 1
                if count[0] >= self.records:
                    done.set()

            subscriber = mqtt_client(self.session, self.topic, on_message)
            if not done.wait(SETTLE_TIMEOUT_S):
                raise RuntimeError(f"the MQTT client read {count[0]:,} of {self.records:,} messages")
            subscriber.disconnect_and_stop()
            return count[0]
        return timed_client(read)

    def headrace(self) -> Reading:
        import headrace as hr

        source = hr.sources.Mqtt(self.topic, schema=SCHEMA, url=MQTT_URL, client_id=self.session, session_expiry=60)
        return run_headrace(pipeline_of(self.name, source), self.workdir, self.records)


class MqttClient:
    """A paho client connected to a persistent session (MQTT 5) and subscribed at QoS 1."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def disconnect_and_stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def mqtt_client(session: str, topic: str, on_message: Any = None) -> MqttClient:
    import paho.mqtt.client as mqtt
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=session, protocol=mqtt.MQTTv5)
    subscribed = threading.Event()
    client.on_subscribe = lambda *_: subscribed.set()
    client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
    if on_message is not None:
        client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 300
    properties.ReceiveMaximum = 65_535
    client.connect("127.0.0.1", 1883, clean_start=False, properties=properties)
    client.loop_start()
    if not subscribed.wait(10):
        client.loop_stop()
        raise RuntimeError(f"cannot subscribe to {topic} on the MQTT broker")
    return MqttClient(client)


def publish_mqtt(topic: str, records: int) -> None:
    """``records`` QoS 1 messages to ``topic``, waiting for the broker's acknowledgement of each."""
    import paho.mqtt.client as mqtt

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"hr-bench-pub-{uuid.uuid4().hex[:8]}")
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(0)
    acknowledged, done = [0], threading.Event()

    def on_publish(*_: Any) -> None:
        acknowledged[0] += 1
        if acknowledged[0] >= records:
            done.set()

    client.on_publish = on_publish
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    for i in range(records):
        client.publish(topic, record(i), qos=1)
        if i % 2_000 == 1_999:
            while i + 1 - acknowledged[0] > 20_000:  # keep paho's outgoing queue short
                time.sleep(0.005)
    if not done.wait(SETTLE_TIMEOUT_S):
        raise RuntimeError(f"the broker acknowledged {acknowledged[0]:,} of {records:,} published messages")
    client.disconnect()
    client.loop_stop()


@dataclass
class NatsBench(Bench):
    name: str = "nats"
    stream: str = field(default_factory=lambda: f"HR_BENCH_{uuid.uuid4().hex[:10]}")

    def unavailable(self) -> str | None:
        try:
            import nats  # noqa: F401

            import headrace.connectors.nats_jetstream  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - the connector is being written: say why it cannot run
            return f"headrace.connectors.nats_jetstream cannot be imported: {type(exc).__name__}: {exc}"
        return start_service("nats.sh", 4222)

    def load(self) -> None:
        asyncio.run(self._load())

    async def _load(self) -> None:
        import nats

        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        await js.add_stream(name=self.stream, subjects=[f"{self.stream.lower()}.>"])
        subject = f"{self.stream.lower()}.records"
        for first in range(0, self.records, CHUNK):
            for i in range(first, min(self.records, first + CHUNK)):
                await nc.publish(subject, record(i))
            await nc.flush()
        deadline = time.time() + 120
        while (await js.stream_info(self.stream)).state.messages < self.records:
            if time.time() > deadline:
                raise RuntimeError(f"the stream {self.stream} did not receive the {self.records:,} messages")
            await asyncio.sleep(0.1)
        await nc.close()

    def client(self) -> Reading:
        return timed_client(lambda: asyncio.run(self._read()))

    async def _read(self) -> int:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc = await nats.connect(NATS_URL)
        js = nc.jetstream()
        name = f"hr_bench_{uuid.uuid4().hex[:8]}"
        await js.add_consumer(self.stream, ConsumerConfig(name=name, deliver_policy=DeliverPolicy.ALL,
                                                          ack_policy=AckPolicy.NONE, mem_storage=True,
                                                          inactive_threshold=120.0))
        subscription = await js.pull_subscribe_bind(consumer=name, stream=self.stream)
        count = 0
        while count < self.records:
            for message in await subscription.fetch(2_000, timeout=30):
                json.loads(message.data)
                count += 1
        await js.delete_consumer(self.stream, name)
        await nc.close()
        return count

    def headrace(self) -> Reading:
        import headrace as hr

        source = hr.sources.Nats(self.stream, schema=SCHEMA, url=NATS_URL)
        return run_headrace(pipeline_of(self.name, source), self.workdir, self.records)

    def cleanup(self) -> None:
        async def delete() -> None:
            import nats

            nc = await nats.connect(NATS_URL)
            await nc.jetstream().delete_stream(self.stream)
            await nc.close()
        asyncio.run(delete())


@dataclass
class RabbitMQBench(Bench):
    name: str = "rabbitmq"
    stream: str = field(default_factory=lambda: f"hr_bench_{uuid.uuid4().hex[:10]}")

    def unavailable(self) -> str | None:
        try:
            import rstream  # noqa: F401

            import headrace.connectors.rabbitmq_streams  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - rstream missing: say why it cannot run
            return f"the RabbitMQ Streams connector cannot be imported ({type(exc).__name__}: {exc}): " \
                   f"pip install 'headrace[rabbitmq]'"
        return start_service("rabbitmq.sh", 5552)

    def _where(self) -> dict[str, Any]:
        from headrace.connectors.rabbitmq_streams import StreamUrl

        url = StreamUrl.parse(RABBITMQ_URL)
        return {"host": url.host, "port": url.port, "username": url.user, "password": url.password,
                "vhost": url.vhost}

    def load(self) -> None:
        asyncio.run(self._load())

    async def _load(self) -> None:
        """The records as bare JSON payloads, ``RABBITMQ_PUBLISH_BATCH`` per publish frame, then a
        wait for the broker's confirmation of every one."""
        from rstream import Producer

        confirmed, refused, done = [0], [0], asyncio.Event()

        def on_confirm(status: Any) -> None:
            (confirmed if status.is_confirmed else refused)[0] += 1
            if confirmed[0] + refused[0] >= self.records:
                done.set()

        async with Producer(**self._where(), connection_name="hr-bench-load") as producer:
            await producer.create_stream(self.stream)
            for first in range(0, self.records, RABBITMQ_PUBLISH_BATCH):
                batch = [record(i) for i in range(first, min(self.records, first + RABBITMQ_PUBLISH_BATCH))]
                await producer.send_batch(self.stream, batch, on_publish_confirm=on_confirm)
            try:
                await asyncio.wait_for(done.wait(), SETTLE_TIMEOUT_S)
            except TimeoutError:
                raise RuntimeError(f"RabbitMQ confirmed {confirmed[0]:,} of {self.records:,} messages") from None
        if refused[0]:
            raise RuntimeError(f"RabbitMQ refused {refused[0]:,} of {self.records:,} messages")

    def client(self) -> Reading:
        return timed_client(lambda: asyncio.run(self._read()))

    async def _read(self) -> int:
        """rstream's consumer from the first offset (its default credit of 10 chunks), decoding
        each message's JSON in the callback, until every record is read."""
        from rstream import Consumer, ConsumerOffsetSpecification, OffsetType

        count, done = [0], asyncio.Event()

        def on_message(message: bytes, _context: Any) -> None:
            json.loads(message)
            count[0] += 1
            if count[0] >= self.records:
                done.set()

        async with Consumer(**self._where(), connection_name="hr-bench-client") as consumer:
            await consumer.subscribe(self.stream, on_message,
                                     offset_specification=ConsumerOffsetSpecification(OffsetType.FIRST, None))
            try:
                await asyncio.wait_for(done.wait(), SETTLE_TIMEOUT_S)
            except TimeoutError:
                raise RuntimeError(f"the RabbitMQ client read {count[0]:,} of {self.records:,} messages") from None
        return count[0]

    def headrace(self) -> Reading:
        import headrace as hr

        source = hr.sources.RabbitMQ(self.stream, schema=SCHEMA, url=RABBITMQ_URL)
        return run_headrace(pipeline_of(self.name, source), self.workdir, self.records)

    def cleanup(self) -> None:
        async def delete() -> None:
            from rstream import Producer

            async with Producer(**self._where(), connection_name="hr-bench-cleanup") as producer:
                await producer.delete_stream(self.stream, missing_ok=True)
        asyncio.run(delete())


@dataclass
class FilesBench(Bench):
    name: str = "files"
    control_rows: int = 0
    files: int = 20
    spark: Any = None

    @property
    def folder(self) -> str:
        return os.path.join(self.workdir, "input")

    def load(self) -> None:
        os.makedirs(self.folder, exist_ok=True)
        per_file = -(-self.records // self.files)
        for number, first in enumerate(range(0, self.records, per_file)):
            with open(os.path.join(self.folder, f"part-{number:05d}.jsonl"), "wb") as out:
                out.write(b"\n".join(record(i) for i in range(first, min(self.records, first + per_file))) + b"\n")

    def client(self) -> Reading:
        """Spark's own JSON file source into the noop sink, the way a PySpark user writes it."""
        frame = self.spark.readStream.schema(SCHEMA).json(self.folder)
        query = (frame.writeStream.format("noop").queryName("bench_files_spark")
                 .option("checkpointLocation", fresh_dir(self.workdir, "spark")).start())
        try:
            query.processAllAvailable()
            progress = [dict(p) for p in query.recentProgress]
        finally:
            query.stop()
        return reading_of(progress)

    def headrace(self) -> Reading:
        """The default ``Files`` reader (``reader="spark"``: Spark's own file source under
        headrace's source), unbounded."""
        import headrace as hr

        source = hr.sources.Files(self.folder, "jsonl", SCHEMA)
        return run_headrace(pipeline_of(self.name, source), self.workdir, self.records)


@dataclass
class BoundedFilesBench(FilesBench):
    """The default ``Files`` reader, bounded: it ends once it has read every file (no flush row:
    no step of the pipeline reads one)."""

    name: str = "files-bounded"
    reader: str = "spark"

    def headrace(self) -> Reading:
        import headrace as hr

        source = hr.sources.Files(self.folder, "jsonl", SCHEMA, bounded=True, reader=self.reader)
        return run_headrace(pipeline_of(self.name, source), self.workdir, self.records, bounded=True)


@dataclass
class PythonFilesBench(BoundedFilesBench):
    """headrace's Python reader (``reader="python"``: its Python data source), bounded; it ends
    with a flush row."""

    name: str = "files-python"
    control_rows: int = 1
    reader: str = "python"


BENCHES: dict[str, type[Bench]] = {"redis": RedisBench, "postgres-cdc": PostgresBench, "mqtt": MqttBench,
                                   "nats": NatsBench, "rabbitmq": RabbitMQBench, "files": FilesBench,
                                   "files-bounded": BoundedFilesBench, "files-python": PythonFilesBench}


# ----------------------------------------------------------------------------------------------
# The benchmark.

def checked(bench: Bench, reader: str, reading: Reading) -> Reading:
    expected = bench.records + (bench.control_rows if reader == "headrace" else 0)
    if reading.records != expected:
        raise RuntimeError(f"{bench.name}: the {reader} read {reading.records:,} records, not {expected:,}")
    return Reading(bench.records, reading.seconds)


def read_once(bench: Bench, reader: str) -> Reading:
    bench.before(reader)
    return checked(bench, reader, bench.client() if reader == "client" else bench.headrace())


def measure(bench: Bench, runs: int, warm_up: bool, say: Print) -> float:
    """Warm up, read alternately, print the table; the median of the pair ratios."""
    started = time.time()
    bench.load()
    say(f"{bench.name}: {bench.records:,} records loaded in {time.time() - started:.1f} s")
    for reader in READERS if warm_up else ():
        read_once(bench, reader)
    readings: dict[str, list[Reading]] = {reader: [] for reader in READERS}
    ratios = []
    for number, order in enumerate(alternating(READERS, runs), start=1):
        for reader in order:
            reading = read_once(bench, reader)
            readings[reader].append(reading)
            say(f"  run {number}  {reader:9} {reading.rate:>11,.0f} records/s  {reading.seconds:7.2f} s  "
                f"load {os.getloadavg()[0]:.1f}")
        ratios.append(readings["headrace"][-1].rate / readings["client"][-1].rate)
    for reader in READERS:
        say(f"  {reader:15} median {statistics.median(r.rate for r in readings[reader]):>11,.0f} records/s")
    ratio = statistics.median(ratios)
    target = TARGETS.get(bench.name, TARGET)
    say(f"  pair ratios: {' '.join(f'{r:.2f}' for r in ratios)}   target >= {target}: "
        f"{'met' if ratio >= target else 'MISSED'}")
    return ratio


def default_records(name: str, quick: bool) -> int:
    if quick:
        return 2_000
    return 2_000_000 if name.startswith("files") else 1_000_000


def run_one(name: str, args: argparse.Namespace, spark: Any, say: Print) -> str:
    """Measure one source; its closing line."""
    workdir = tempfile.mkdtemp(prefix=f"headrace-connectors-{name}-")
    records = args.records or default_records(name, args.quick)
    bench = BENCHES[name](records=records, workdir=workdir)
    if isinstance(bench, FilesBench):
        bench.spark = spark
    try:
        why = bench.unavailable()
        if why:
            return f"{name} skipped: {why}"
        try:
            return f"{name} ratio={measure(bench, args.runs, not args.quick, say):.2f}"
        finally:
            bench.cleanup()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help=f"comma-separated sources among {', '.join(NAMES)} (default: all)")
    parser.add_argument("--records", type=int, help="records per reading (default 1,000,000; files 2,000,000)")
    parser.add_argument("--runs", type=int, help="measured readings of each (default 3; medians and pair ratios)")
    parser.add_argument("--quick", action="store_true", help="small data, one run, no warm-up: a smoke run")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",")] if args.only else list(NAMES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        parser.error(f"unknown source(s) {', '.join(unknown)}; choose among {', '.join(NAMES)}")
    args.runs = args.runs or (1 if args.quick else 3)
    if args.runs < 1 or (args.records is not None and args.records < 1):
        parser.error("--runs and --records must be positive")
    say: Print = lambda text: print(text, flush=True)  # noqa: E731
    from headrace.environment.session import get_session

    spark = get_session()
    say(f"Python sources against their systems' own clients: Spark {spark.version} {spark.sparkContext.master}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    closing = [run_one(name, args, spark, say) for name in names]
    say("")
    for line in closing:
        say(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
