"""MQTT: a source (at-least-once, through a persistent session) and a sink (at-least-once).

MQTT cannot replay: a broker hands each message of a subscription out once and forgets it
when the client acknowledges it (``PUBACK``). So the source keeps what it hands to Spark.

**Source, the subscriber.** The reader's methods (``latestOffset``, ``partitions``,
``commit``) run in one long-lived Python process on the driver for the life of the query;
there the reader starts a paho-mqtt client whose network thread receives the messages. It
connects with MQTT 5, ``clean_start=False`` and a session expiry (``session_expiry``, 7 days
by default), subscribes to ``topics`` at QoS 1 and acknowledges by hand (``manual_ack``):
the broker keeps the session, its subscriptions and every QoS 1 message it has not
acknowledged, also while the pipeline is stopped. The network thread only appends each
message (topic, payload, arrival time, packet id) to an in-memory list under a lock.

**Source, the spool and offsets.** ``latestOffset`` moves up to ``max_records_per_batch``
received messages into a spool file ``<run dir>/mqtt/<source>/<first>-<last>.jsonl``
(written, fsynced, renamed), numbering them on; the offset is ``{"seq": <last number>}``.
Spark logs that offset before the batch runs, and ``partitions(start, end)`` reads the
numbers after ``start`` up to ``end`` from the spool, so a replayed batch reads the same
messages. The messages travel to the executors inside the partitions (no file is read
there). ``commit(end)``, once Spark committed the batch, acknowledges its messages
(``PUBACK``, in the order they arrived) and deletes their spool files: a message leaves
the broker only after the batch that carried it has committed.

**What is guaranteed.** Every QoS 1 message published to a subscribed topic after the
session was first created is delivered to the pipeline at least once, while the session
has not expired and the broker kept it (mosquitto: ``persistence true``, and a
``max_queued_messages`` large enough for what arrives while the pipeline is away; beyond it
the broker drops messages). A graceful stop delivers each message once: received messages
not yet spooled are not acknowledged and come again after the restart. A message can be
delivered twice when the driver dies (SIGKILL, a lost machine) after its batch committed
and before its ``PUBACK`` reached the broker, or when the run dir (the spool) is lost with
a batch in flight: the broker sends it again (``DUP``) on the next connection. The source
recognises a resent message whose packet id, topic and payload match a spooled message not
yet acknowledged and drops it, so a crash between spooling and commit does not duplicate;
a resend that arrives after the spooled copy was acknowledged is delivered again. QoS 0
messages (published at QoS 0) can be lost. The source declares at-least-once, and
``Pipeline(..., guarantee="exactly-once")`` with it fails when built.

**Limits.** The broker sends at most the client's receive maximum (65 535) messages it has
not seen acknowledged, so a batch holds at most that many (``max_records_per_batch``).
The spool lives on the driver's local disk, beside the checkpoint's run files.

**Records.** ``format="json"``: the payload is a JSON object read against ``schema``;
``format="raw"``: the record is the payload's bytes, ``payload``. Every record also has
``mqtt_topic`` and ``mqtt_time`` (the arrival time at the subscriber, a timestamp). A payload
that does not fit goes to the dead letters with ``<topic>#<seq>`` as its position.

**Sink.** Each row is published as its JSON object (Spark's ``to_json``) to ``topic``, whose
``{column}`` placeholders take the row's values, at QoS 1; the batch ends when the broker
acknowledged every message. A replayed batch is published again: at-least-once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from headrace.connectors import broker
from headrace.connectors.base import redact_dsn
from headrace.connectors.file_formats.reader import batch_schema
from headrace.connectors.payloads import Dead, PayloadDecoder, message_schema, record_batches
from headrace.contract import Guarantee, SourceContext
from headrace.errors import PlanError, SinkError, SourceError
from headrace.schema import Schema, to_ddl
from headrace.sink_step import SinkStep

DEFAULT_URL = "mqtt://127.0.0.1:1883"
FORMATS = ("json", "raw")
METADATA: Schema = (("mqtt_topic", "string"), ("mqtt_time", "timestamp"))
RAW_SCHEMA: Schema = (("payload", "binary"),)
DEFAULT_MAX_RECORDS = 50_000
RECEIVE_MAXIMUM = 65_535  # unacknowledged messages the broker may send us (MQTT 5's most)
SESSION_EXPIRY_S = 7 * 24 * 3600
PARTITION_MESSAGES = 20_000
CONNECT_TIMEOUT_S = 10.0
PUBLISH_TIMEOUT_S = 60.0
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def _paho() -> Any:
    return broker.client_library("paho.mqtt.client", "the MQTT connectors need", "mqtt", "paho-mqtt>=2")


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 1883


def _check_url(url: Any, where: str) -> None:
    if not isinstance(url, str) or urlsplit(url).scheme != "mqtt" or not urlsplit(url).hostname:
        raise PlanError(f"{where}: url {redact_dsn(str(url))!r} is not an mqtt://host:port URL")


def _answer(client: Any, callback: str) -> tuple[threading.Event, list[Any]]:
    """An event set when ``client`` calls its ``callback`` (``on_connect``, ``on_subscribe``), and a
    list that then holds the broker's answer: the callback's reason code, or list of them."""
    answered = threading.Event()
    answer: list[Any] = []

    def record(_client: Any, _userdata: Any, _flags_or_mid: Any, reason: Any, _properties: Any) -> None:
        answer.append(reason)
        answered.set()

    setattr(client, callback, record)
    return answered, answer


def _connect(client: Any, url: str, properties: Any = None, clean_start: Any = True) -> None:
    """Connect ``client`` and wait for the broker's CONNACK; raises ConnectionError saying why."""
    connected, outcome = _answer(client, "on_connect")
    parts = urlsplit(url)
    if parts.username:
        client.username_pw_set(parts.username, parts.password)
    host, port = _address(url)
    client.connect(host, port, keepalive=30, clean_start=clean_start, properties=properties)
    client.loop_start()
    if not connected.wait(CONNECT_TIMEOUT_S):
        client.loop_stop()
        raise ConnectionError(f"no answer (CONNACK) within {CONNECT_TIMEOUT_S:.0f} s")
    if outcome[0].is_failure:
        client.loop_stop()
        raise ConnectionError(f"the broker refused the connection: {outcome[0]}")


def probe(url: str) -> None:
    """Connect to the broker with a throwaway clean session; raises ConnectionError or OSError."""
    mqtt = _paho()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"hr-probe-{uuid.uuid4().hex[:12]}",
                         protocol=mqtt.MQTTv5)
    try:
        _connect(client, url)
    finally:
        client.disconnect()
        client.loop_stop()


def session_id(client_id: str | None, run_dir: str, source: str) -> str:
    """The persistent session's client id: ``client_id``, else one derived from the run dir (one
    per pipeline state dir, the same after a restart) and the source's name."""
    digest = hashlib.sha1(f"{os.path.abspath(run_dir)}\0{source}".encode()).hexdigest()[:20]
    return client_id or "hr-" + digest


def session(url: str, client_id: str, topics: Sequence[str], expiry: int, on_message: Any) -> Any:
    """A client connected to the persistent session ``client_id`` (MQTT 5, clean_start False,
    session expiry ``expiry`` s, receive maximum 65 535), subscribed to ``topics`` at QoS 1,
    acknowledging by hand: what it does not acknowledge the broker sends again."""
    mqtt = _paho()
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
                         manual_ack=True)
    if on_message is not None:
        client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = expiry
    properties.ReceiveMaximum = RECEIVE_MAXIMUM
    _connect(client, url, properties, clean_start=False)
    subscribed, granted = _answer(client, "on_subscribe")
    result, _ = client.subscribe([(topic, 1) for topic in topics])
    if result != mqtt.MQTT_ERR_SUCCESS or not subscribed.wait(CONNECT_TIMEOUT_S):
        client.loop_stop()
        raise ConnectionError(f"cannot subscribe to {', '.join(topics)} ({result})")
    refused = [f"{topic} ({reason})" for topic, reason in zip(topics, granted[0]) if reason.is_failure]
    if refused:
        client.disconnect()
        client.loop_stop()
        raise ConnectionError(f"the broker refused the subscription to {', '.join(refused)}")
    return client


# ----------------------------------------------------------------------------------------
# Spool: the messages handed to Spark, until their batch commits.

def _spool_name(first: int, last: int) -> str:
    return f"{first:020d}-{last:020d}.jsonl"


def _spool_range(name: str) -> tuple[int, int] | None:
    match = re.fullmatch(r"(\d{20})-(\d{20})\.jsonl", name)
    return (int(match.group(1)), int(match.group(2))) if match else None


class Spool:
    """Spool files ``<first>-<last>.jsonl`` of numbered messages in one folder."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def files(self) -> list[tuple[int, int, str]]:
        if not os.path.isdir(self.folder):
            return []
        found = [(r[0], r[1], name) for name in os.listdir(self.folder) if (r := _spool_range(name))]
        return sorted(found)

    def last(self) -> int:
        files = self.files()
        return files[-1][1] if files else 0

    def write(self, first: int, messages: list[dict[str, Any]]) -> None:
        os.makedirs(self.folder, exist_ok=True)
        name = _spool_name(first, first + len(messages) - 1)
        temporary = os.path.join(self.folder, f".{name}.tmp")
        with open(temporary, "w") as out:
            for message in messages:
                out.write(json.dumps(message) + "\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, os.path.join(self.folder, name))
        descriptor = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)

    def read(self, after: int, upto: int) -> list[dict[str, Any]]:
        """The messages numbered after ``after`` up to ``upto``, in order."""
        messages: list[dict[str, Any]] = []
        for first, last, name in self.files():
            if last <= after or first > upto:
                continue
            with open(os.path.join(self.folder, name)) as spooled:
                messages.extend(m for line in spooled if after < (m := json.loads(line))["seq"] <= upto)
        return messages

    def drop(self, upto: int) -> list[dict[str, Any]]:
        """Delete the files of the messages numbered up to ``upto``; returns those messages."""
        done: list[dict[str, Any]] = []
        for _first, last, name in self.files():
            if last <= upto:
                path = os.path.join(self.folder, name)
                with open(path) as spooled:
                    done.extend(json.loads(line) for line in spooled)
                os.unlink(path)
        return done


# ----------------------------------------------------------------------------------------
# Messages to Arrow record batches.

def decode(messages: list[dict[str, Any]], options: dict[str, str], schema: Schema) -> Iterator[pa.RecordBatch]:
    """Spooled messages as record batches of the source's Arrow schema: good rows, then dead letters
    (``headrace/connectors/payloads.py``)."""
    arrow = batch_schema((*schema, *METADATA), dead_letters=True)
    dead: Dead = {}
    payloads = [base64.b64decode(m["payload"]) for m in messages]
    columns = PayloadDecoder(schema, options.get("format", "json")).columns(payloads, dead)
    metadata = [pa.array([m["topic"] for m in messages], pa.string()),
                pa.array([m["time"] * 1000 for m in messages], pa.int64()).cast(arrow.field("mqtt_time").type)]
    yield from record_batches(arrow, columns, metadata, dead, [f"{m['topic']}#{m['seq']}" for m in messages])


@dataclass(frozen=True, init=False)
class Mqtt(broker.Source, metadata=METADATA, spark_reader="mqtt:MqttDataSource"):
    """Messages of MQTT topics (filters with ``+`` and ``#`` allowed), at least once.

    ``schema``: the JSON object's fields (``format="json"``); ``format="raw"`` gives the
    payload's bytes as ``payload`` instead. ``url``: ``mqtt://[user:password@]host:port``.
    ``client_id``: the persistent session's client id (default: derived from the pipeline's
    state dir and the source's name, stable across restarts). ``session_expiry``: seconds the
    broker keeps the session while no pipeline is connected. ``max_records_per_batch``:
    messages per micro-batch, at most 65 535. See the module's docstring for the guarantee.
    """

    guarantee = Guarantee.AT_LEAST_ONCE

    topics: tuple[str, ...]
    data_schema: Schema
    url: str
    client_id: str | None
    format: str
    session_expiry: int
    max_records_per_batch: int

    def __init__(self, topics: str | Sequence[str], *, schema: Any = None, url: str = DEFAULT_URL,
                 client_id: str | None = None, format: str = "json", session_expiry: int = SESSION_EXPIRY_S,
                 max_records_per_batch: int = DEFAULT_MAX_RECORDS) -> None:
        names = broker.name_list(topics) if isinstance(topics, (str, list, tuple)) else ()
        where = f"Mqtt({', '.join(names)})"
        if not names:
            raise PlanError("Mqtt(): give at least one topic, e.g. Mqtt('sensors/+/temperature', schema=...)")
        broker.check_format(where, format, FORMATS, schema,
                            "needs schema=, e.g. schema='device string, celsius double'",
                            "format='raw' gives the payload's bytes as 'payload'")
        _check_url(url, where)
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise PlanError(f"{where}: client_id must be a non-empty string, got {client_id!r}")
        if not isinstance(session_expiry, int) or session_expiry < 1:
            raise PlanError(f"{where}: session_expiry must be a number of seconds, at least 1, got {session_expiry!r}")
        if not isinstance(max_records_per_batch, int) or not 1 <= max_records_per_batch <= RECEIVE_MAXIMUM:
            raise PlanError(f"{where}: max_records_per_batch must be between 1 and {RECEIVE_MAXIMUM}, got "
                            f"{max_records_per_batch!r}")
        data_schema = message_schema(RAW_SCHEMA if format == "raw" else schema, METADATA, where)
        self._assign(topics=names, data_schema=data_schema, url=url, client_id=client_id, format=format,
                     session_expiry=session_expiry, max_records_per_batch=max_records_per_batch)

    def offset_identity(self) -> dict[str, Any]:
        """An offset numbers the messages spooled by this source's session: its topics and
        client id fix what it means."""
        return {"topics": list(self.topics), "client_id": self.client_id}

    def describe(self) -> dict[str, Any]:
        return {"type": "Mqtt", "topics": list(self.topics), "url": redact_dsn(self.url), "format": self.format,
                "schema": to_ddl(self.data_schema), "client_id": self.client_id,
                "max_records_per_batch": self.max_records_per_batch, "guarantee": self.guarantee.value,
                "session": f"persistent (expires {self.session_expiry} s after the pipeline disconnects), QoS 1",
                "dead_letters": True}

    def prepare(self, context: SourceContext) -> None:
        """Before Spark starts: fail when the broker cannot be reached, and create the persistent
        session with its subscriptions, so that the broker keeps every message published from
        now on for the pipeline (this connection acknowledges nothing)."""
        try:
            client = session(self.url, session_id(self.client_id, context.run_dir, context.source_name), self.topics,
                             self.session_expiry, None)
        except (OSError, ConnectionError) as exc:
            raise SourceError(f"source {context.source_name!r}: MQTT broker at {redact_dsn(self.url)}: cannot "
                              f"connect: {exc}") from None
        client.disconnect()
        client.loop_stop()


# ----------------------------------------------------------------------------------------
# Sink.

class MqttSink(broker.Sink):
    """Publish each row as its JSON object to ``topic`` (``{column}`` placeholders take the
    row's values; ``key`` column(s) add their values as further topic levels), at QoS
    ``qos`` (1: the broker acknowledges each message, and the batch waits for every ack).
    At-least-once: a replayed batch is published again."""

    def __init__(self, topic: str, *, url: str = DEFAULT_URL, qos: int = 1, key: str | Sequence[str] | None = None,
                 retain: bool = False) -> None:
        if not isinstance(topic, str) or not topic or any(c in topic for c in "+#"):
            raise PlanError(f"Mqtt sink: topic must be a topic name without wildcards (+, #), got {topic!r}")
        where = f"Mqtt sink for topic {topic!r}"
        _check_url(url, where)
        if qos not in (0, 1):
            raise PlanError(f"{where}: qos must be 0 or 1 (at-least-once needs 1), got {qos!r}")
        keys = (key,) if isinstance(key, str) else tuple(key or ())
        if not all(isinstance(k, str) and k for k in keys):
            raise PlanError(f"{where}: key must be a column name or a list of column names, got {key!r}")
        super().__init__(None)
        self.topic, self.url, self.qos, self.key, self.retain = topic, url, qos, keys, bool(retain)
        self.placeholders = tuple(dict.fromkeys(_PLACEHOLDER.findall(topic)))

    @property
    def guarantee(self) -> Guarantee:  # type: ignore[override]
        return Guarantee.AT_LEAST_ONCE if self.qos == 1 else Guarantee.AT_MOST_ONCE

    def _where(self) -> str:
        return str(self._step or SinkStep(self.topic))

    def describe(self) -> dict[str, Any]:
        return {"type": "Mqtt", "topic": self.topic, "url": redact_dsn(self.url), "qos": self.qos,
                "key": list(self.key) or None, "guarantee": self.guarantee.value}

    def _connected(self) -> Any:
        if self._connection is None:
            mqtt = _paho()
            client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"hr-sink-{uuid.uuid4().hex[:12]}",
                                 protocol=mqtt.MQTTv5)
            client.max_queued_messages_set(0)
            client.max_inflight_messages_set(1000)
            try:
                _connect(client, self.url)
            except (OSError, ConnectionError) as exc:
                raise SinkError(f"{self._where()}: MQTT broker at {redact_dsn(self.url)}: cannot connect: {exc}") \
                    from None
            self._connection = client
        return self._connection

    def prepare(self, run_dir: str) -> None:
        self._connected()

    def close(self) -> None:
        client, self._connection = self._connection, None
        if client is not None:
            client.disconnect()
            client.loop_stop()

    def write_batch(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        columns = list(df.columns)
        missing = [c for c in (*self.placeholders, *self.key) if c not in columns]
        if missing:
            raise SinkError(f"{self._where()}: the topic's placeholders or key name column(s) {missing} that are "
                            f"not in the stream's columns {columns}")
        names = [*self.placeholders, *self.key]
        table = df.select(broker.json_value(df).alias("_hr_value"),
                          *[F.col(f"`{c}`").cast("string").alias(f"_hr_{n}") for n, c in enumerate(names)]).toArrow()
        values = table.column("_hr_value").to_pylist()
        parts = [table.column(f"_hr_{n}").to_pylist() for n in range(len(names))]
        client = self._connected()
        sent = []
        for row, value in enumerate(values):
            found = {name: parts[n][row] for n, name in enumerate(names)}
            topic = _PLACEHOLDER.sub(lambda m, found=found: str(found[m.group(1)]), self.topic)  # type: ignore[misc]
            topic = "/".join([topic, *(str(found[k]) for k in self.key)])
            sent.append(client.publish(topic, value, qos=self.qos, retain=self.retain))
        deadline = time.monotonic() + PUBLISH_TIMEOUT_S
        for info in sent:
            try:
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
            except (RuntimeError, ValueError) as exc:
                self.close()
                raise SinkError(f"{self._where()}: batch {batch_id}: cannot publish to MQTT broker at "
                                f"{redact_dsn(self.url)}: {exc}") from None
            if not info.is_published():
                self.close()
                raise SinkError(f"{self._where()}: batch {batch_id}: MQTT broker at {redact_dsn(self.url)} did not "
                                f"acknowledge {sum(not i.is_published() for i in sent)} of {len(sent)} messages within "
                                f"{PUBLISH_TIMEOUT_S:.0f} s")
