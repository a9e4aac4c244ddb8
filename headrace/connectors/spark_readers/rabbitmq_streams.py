"""RabbitMQ Streams' Spark data source (``headrace_rabbitmq``): batches of stream offsets, each range
read by a subscription (how it works: ``headrace/connectors/rabbitmq_streams.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from headrace.connectors.base import redact_dsn
from headrace.connectors.rabbitmq_streams import (
    DEFAULT_URL,
    METADATA,
    PARTITION_RECORDS,
    READ_IDLE_S,
    ROWS_PER_BATCH,
    Loop,
    MessageDecoder,
    Subscription,
    T,
    last_chunk,
    rabbitmq_close,
    rabbitmq_connect,
    rstream_module,
    source_failed,
)
from headrace.connectors.spark_readers import broker as spark_broker
from headrace.environment.admission import backlog
from headrace.errors import SourceError

# ----------------------------------------------------------------------------------------
# Spark Python data source.

class RabbitMQStreamReader(spark_broker.Reader, default_name="rabbitmq"):
    adaptive = True

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.stream = options.get("stream", "")
        self.url = options.get("url", DEFAULT_URL)
        self.start = options.get("start", "first")
        self.partition_records = int(options.get("partition_records", PARTITION_RECORDS))
        self._driver: Loop | None = None
        self._initial: dict | None = None
        self._backlog: int | None = None

    def _last_chunk(self) -> tuple[int, int] | None:
        if self._driver is None:
            rstream_module()
            self._driver = Loop(self.url, f"headrace-{self.source}")
        try:
            return self._driver.run(lambda client: last_chunk(client, self.stream))
        except Exception as exc:  # noqa: BLE001 - rstream's errors, named in the message
            raise source_failed(self.source, self.url, f"cannot read the stream {self.stream!r}", exc) from None

    def initialOffset(self) -> dict:
        # Spark calls this twice for a new query: "last" and "next" must not move in between.
        if self._initial is None:
            offset = -1
            if self.start != "first":
                found = self._last_chunk()
                if found is not None:
                    offset = found[0] - 1 if self.start == "last" else found[1]
            self._initial = {"offset": offset}
        return dict(self._initial)

    def end_offset(self, start: dict, cap: int | None) -> dict:
        first = int(start.get("offset", -1))
        found = self._last_chunk()
        if found is None or found[1] <= first:
            self._backlog = 0
            return start
        end = found[1] if cap is None else min(found[1], first + cap)
        self._backlog = found[1] - end
        return {"offset": end}

    def reportLatestOffset(self) -> dict | None:
        return None if self._backlog is None else backlog(self._backlog)

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        first, last = int(start.get("offset", -1)), int(end.get("offset", -1))
        spans = spark_broker.split_range(first, last, self.partition_records)
        return [spark_broker.PositionRange(after, upto) for after, upto in spans]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, spark_broker.PositionRange)
        rstream_module()
        loop = asyncio.new_event_loop()
        decoder = MessageDecoder(self.options, self.schema, self.stream)
        try:
            client = loop.run_until_complete(self._run(rabbitmq_connect(self.url, f"headrace-{self.source}-reader"),
                                                       "cannot connect"))
            try:
                subscription = Subscription(client, 1)
                from rstream.constants import OffsetType

                loop.run_until_complete(self._run(subscription.start(self.stream, OffsetType.OFFSET,
                                                                     partition.after + 1),
                                                  f"cannot subscribe to the stream {self.stream!r}"))
                messages: list[bytes] = []
                offsets: list[int] = []
                times: list[int] = []
                last = partition.after
                while last < partition.upto:
                    frame = loop.run_until_complete(self._next(subscription, partition))
                    first, chunk = int(frame.chunk_first_offset), frame.get_messages()
                    keep = range(max(0, partition.after + 1 - first), min(len(chunk), partition.upto + 1 - first))
                    if keep:  # the chunk's messages within the partition's offsets, whole slices at once
                        messages.extend(chunk[keep.start:keep.stop])
                        offsets.extend(range(first + keep.start, first + keep.stop))
                        times.extend([int(frame.timestamp)] * len(keep))
                    last = max(last, first + len(chunk) - 1)
                    if len(messages) >= ROWS_PER_BATCH or last >= partition.upto:
                        yield from decoder.batches(messages, offsets, times)
                        messages, offsets, times = [], [], []
                loop.run_until_complete(subscription.stop())
            finally:
                loop.run_until_complete(rabbitmq_close(client))
        finally:
            loop.close()

    async def _run(self, work: Coroutine[Any, Any, T], doing: str) -> T:
        try:
            return await work
        except Exception as exc:  # noqa: BLE001
            raise source_failed(self.source, self.url, doing, exc) from None

    async def _next(self, subscription: Subscription, partition: spark_broker.PositionRange) -> Any:
        try:
            return await subscription.next_chunk(READ_IDLE_S)
        except TimeoutError:
            raise SourceError(f"source {self.source!r}: RabbitMQ at {redact_dsn(self.url)}: the stream "
                              f"{self.stream!r} sent nothing for {READ_IDLE_S:g} s while offsets "
                              f"{partition.after + 1}..{partition.upto} were read (removed by retention?)") from None

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None


class RabbitMQDataSource(spark_broker.DataSource, short_name="headrace_rabbitmq", reader=RabbitMQStreamReader,
                         metadata=METADATA):
    """Spark data source ``headrace_rabbitmq``; options as produced by ``RabbitMQ.options()``."""
