"""Read a Kafka topic to its end, as a check of a pipeline's output sees it (needs confluent-kafka).

The partitions are assigned, not subscribed (no consumer group to join or rebalance), and read
from the beginning up to the end offsets they had when the read began; ``committed_only`` reads
as ``isolation.level=read_committed`` consumers do, so records of open or aborted transactions
are not returned (their offsets, and those of transaction markers, are passed over).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TopicRecord:
    key: str | None
    value: bytes | None
    timestamp_ms: int  # the record's timestamp: the producer's, or the broker's (LogAppendTime)
    partition: int
    offset: int

    def json(self) -> Any:
        """The value, parsed as JSON."""
        return json.loads(self.value) if self.value is not None else None


def read_topic(servers: str, topic: str, *, committed_only: bool = True, timeout_s: float = 60.0) -> list[TopicRecord]:
    """Every record of ``topic`` up to its current end; TimeoutError when that end is not
    reached within ``timeout_s`` (a transaction left open holds read_committed readers back)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": servers, "group.id": uuid.uuid4().hex, "enable.auto.commit": False,
                         "isolation.level": "read_committed" if committed_only else "read_uncommitted"})
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        assigned = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in assigned}
        consumer.assign(assigned)
        found: list[TopicRecord] = []
        deadline = time.time() + timeout_s
        while True:
            positions = {tp.partition: tp.offset for tp in consumer.position(assigned)}
            if all(end == 0 or positions[p] >= end for p, end in ends.items()):
                return found
            if time.time() > deadline:
                raise TimeoutError(f"could not read topic {topic} to its end offsets {ends} in {timeout_s:.0f} s "
                                   f"(at {positions}; a transaction left open?)")
            for message in consumer.consume(10_000, timeout=0.2):
                if not message.error():
                    key = message.key()
                    found.append(TopicRecord(key.decode() if key is not None else None, message.value(),
                                             message.timestamp()[1], int(message.partition() or 0),
                                             int(message.offset() or 0)))
    finally:
        consumer.close()
