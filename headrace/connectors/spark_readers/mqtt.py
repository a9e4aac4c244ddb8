"""MQTT's Spark data source (``headrace_mqtt``): the messages the driver's session spooled, read back
by range (how it works: ``headrace/connectors/mqtt.py``)."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from headrace.connectors.base import redact_dsn
from headrace.connectors.mqtt import (
    DEFAULT_URL,
    METADATA,
    PARTITION_MESSAGES,
    RECEIVE_MAXIMUM,
    SESSION_EXPIRY_S,
    Spool,
    decode,
    session,
    session_id,
)
from headrace.connectors.spark_readers import broker as spark_broker
from headrace.errors import SourceError

# ----------------------------------------------------------------------------------------
# Spark Python data source.

class SpooledMessages(InputPartition):
    """The messages of a batch (or of a part of it), carried to the executor that reads them."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        super().__init__(len(messages))
        self.messages = messages


class MqttStreamReader(spark_broker.Reader, default_name="mqtt"):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.url = options.get("url", DEFAULT_URL)
        self.topics: list[str] = json.loads(options.get("topics", "[]"))
        self.max_records = RECEIVE_MAXIMUM if self.max_records is None else min(self.max_records, RECEIVE_MAXIMUM)
        run_dir = options.get("hr_run_dir") or ""
        self.client_id = session_id(options.get("client_id"), run_dir, self.source)
        self.session_expiry = int(options.get("session_expiry", SESSION_EXPIRY_S))
        self.spool = Spool(os.path.join(run_dir or ".", "mqtt", self.source))
        self._started = False

    def __getstate__(self) -> dict[str, Any]:  # executors get the reader without its subscriber
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")} | {"_started": False}

    def _start(self) -> None:
        """Start the subscriber (once, on the driver): a persistent session, QoS 1, manual acks."""
        if self._started:
            return
        self._lock = threading.Lock()
        self._received: list[dict[str, Any]] = []
        # Spooled messages not yet acknowledged, by packet id: a resend of one is dropped.
        self._unacked = {m["mid"]: (m["topic"], m["payload"]) for m in self.spool.read(0, self.spool.last())}
        try:
            self._client = session(self.url, self.client_id, self.topics, self.session_expiry, self._on_message)
        except (OSError, ConnectionError) as exc:
            raise SourceError(f"source {self.source!r}: MQTT broker at {redact_dsn(self.url)}: cannot subscribe: "
                              f"{exc}") from None
        self._started = True

    def _on_message(self, _client: Any, _userdata: Any, message: Any) -> None:
        payload = base64.b64encode(message.payload).decode()
        with self._lock:
            if message.dup and self._unacked.get(message.mid) == (message.topic, payload):
                return  # a resend of a spooled message: acknowledged when its batch commits
            self._received.append({"topic": message.topic, "payload": payload, "time": int(time.time() * 1000),
                                   "mid": message.mid, "qos": message.qos})

    def initialOffset(self) -> dict:
        self._start()
        return {"seq": 0}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        self._start()
        return super().latestOffset(start, limit)

    def end_offset(self, start: dict, cap: int | None) -> dict:
        first = max(int(start.get("seq", 0)), self.spool.last()) + 1  # spooled before a crash: covered too
        cap = RECEIVE_MAXIMUM if cap is None else max(1, cap)
        with self._lock:
            taken, self._received = self._received[:cap], self._received[cap:]
        if taken:
            for number, message in enumerate(taken):
                message["seq"] = first + number
            self.spool.write(first, taken)
            with self._lock:
                self._unacked.update((m["mid"], (m["topic"], m["payload"])) for m in taken)
        return {"seq": first - 1 + len(taken)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        messages = self.spool.read(int(start.get("seq", 0)), int(end.get("seq", 0)))
        return [SpooledMessages(messages[i:i + PARTITION_MESSAGES])
                for i in range(0, len(messages), PARTITION_MESSAGES)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpooledMessages)
        if partition.messages:
            yield from decode(partition.messages, self.options, self.schema)

    def commit(self, end: dict) -> None:
        """The batch up to ``end`` committed: acknowledge its messages, in order, and drop them."""
        self._start()
        done = self.spool.drop(int(end.get("seq", 0)))
        with self._lock:
            for message in done:
                self._unacked.pop(message["mid"], None)
                if message.get("qos", 1):
                    self._client.ack(message["mid"], 1)

    def stop(self) -> None:
        if self._started:
            self._client.disconnect()
            self._client.loop_stop()
            self._started = False


class MqttDataSource(spark_broker.DataSource, short_name="headrace_mqtt", reader=MqttStreamReader,
                     metadata=METADATA):
    """Spark data source ``headrace_mqtt``; options as produced by ``Mqtt.options()``."""
