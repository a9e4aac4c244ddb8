"""NATS JetStream's Spark data source (``headrace_nats``): batches of stream sequence numbers, each
range read by an ordered consumer (how it works: ``headrace/connectors/nats_jetstream.py``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from headrace.connectors import nats_jetstream as nats
from headrace.connectors.base import redact_dsn
from headrace.connectors.spark_readers import broker as spark_broker
from headrace.errors import SourceError

# ----------------------------------------------------------------------------------------
# Spark Python data source.

class NatsStreamReader(spark_broker.Reader, default_name="nats"):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.stream = options.get("stream", "")
        self.subjects: tuple[str, ...] = tuple(json.loads(options.get("subjects", "[]")))
        self.url = options.get("url", nats.DEFAULT_URL)
        self.start = options.get("start", "earliest")
        self.partition_records = int(options.get("partition_records", nats.PARTITION_RECORDS))
        self._initial: dict[str, int] | None = None

    def _failed(self, doing: str, exc: BaseException) -> SourceError:
        return SourceError(f"source {self.source!r}: NATS at {redact_dsn(self.url)}: {doing}: {nats.reason(exc)}")

    def _state(self) -> Any:
        """The stream's state (first and last sequence)."""
        return nats.stream_state(self.url, self.source, self.stream)

    def initialOffset(self) -> dict:
        # Spark calls this twice for a new query: "latest" must not move in between.
        if self._initial is None:
            state = self._state()
            self._initial = {"seq": int(state.last_seq if self.start == "latest" else max(state.first_seq - 1, 0))}
        return dict(self._initial)

    def end_offset(self, start: dict, cap: int | None) -> dict:
        state = self._state()
        after = max(int(start["seq"]), int(state.first_seq) - 1)  # skip what the stream no longer has
        end = int(state.last_seq) if cap is None else min(int(state.last_seq), after + cap)
        return {"seq": max(end, int(start["seq"]))}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        spans = spark_broker.split_range(int(start["seq"]), int(end["seq"]), self.partition_records)
        return [spark_broker.PositionRange(after, upto) for after, upto in spans]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, spark_broker.PositionRange)
        decoder = nats.MessageDecoder(self.options, self.schema, self.stream)
        reader = nats.RangeReader(self.url, self.stream, self.subjects, partition.after, partition.upto, self.source)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(reader.open())
            while not reader.done:
                messages = loop.run_until_complete(reader.next_chunk())
                if messages:
                    metas = [m.metadata for m in messages]
                    yield from decoder.batches([m.data for m in messages], [m.subject for m in messages],
                                               [meta.sequence.stream for meta in metas],
                                               [nats.micros(meta.timestamp) for meta in metas])
        finally:
            loop.run_until_complete(reader.close())
            loop.close()


class NatsDataSource(spark_broker.DataSource, short_name="headrace_nats", reader=NatsStreamReader,
                     metadata=nats.METADATA):
    """Spark data source ``headrace_nats``; options as produced by ``Nats.options()``."""
