"""Redis Streams' Spark data source (``headrace_redis``): batches of entry ids planned on the server,
each stream's range read in chunks and decoded (how it works:
``headrace/connectors/redis_streams.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from headrace.connectors.payloads import text
from headrace.connectors.redis_streams import (
    CHUNK_ENTRIES,
    DEFAULT_URL,
    FIRST_ID,
    METADATA,
    PARTITION_RECORDS,
    PLAN_SCRIPT,
    EntryDecoder,
    entry_key,
    failed,
    redis_client,
)
from headrace.connectors.spark_readers import broker as spark_broker

# ----------------------------------------------------------------------------------------
# Spark Python data source.

class StreamRange(InputPartition):
    """The entries of ``stream`` after ``after`` up to ``upto`` (an entry id, inclusive)."""

    def __init__(self, stream: str, after: str, upto: str) -> None:
        super().__init__((stream, after, upto))
        self.stream, self.after, self.upto = stream, after, upto


class RedisStreamReader(spark_broker.Reader, default_name="redis"):
    adaptive = True

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.streams: list[str] = json.loads(options.get("streams", "[]"))
        self.url = options.get("url", DEFAULT_URL)
        self.start = options.get("start", "earliest")
        self.partition_records = int(options.get("partition_records", PARTITION_RECORDS))
        self._redis: Any = None
        self._script: Any = None
        self._initial: dict[str, str] | None = None
        self._splits: dict[tuple[str, str, str], list[str]] = {}  # split ids found by latestOffset

    def _connect(self) -> Any:
        if self._redis is None:
            self._redis = redis_client(self.url)
            self._script = self._redis.register_script(PLAN_SCRIPT)
        return self._redis

    def _walk(self, stream: str, after: str, cap: int, upto: str, before: int) -> tuple[int, str, list[str]]:
        """(entries walked, last id, split ids) of ``stream`` after ``after`` (see PLAN_SCRIPT)."""
        self._connect()
        try:
            reply = self._script(keys=[stream], args=[after, cap, self.partition_records, upto, before])
        except Exception as exc:  # noqa: BLE001 - redis-py's errors, named in the message
            raise failed(self.source, self.url, f"cannot read the stream {stream!r}", exc) from None
        return int(reply[0]), text(reply[1]), [text(i) for i in reply[2:]]

    def initialOffset(self) -> dict:
        # Spark calls this twice for a new query: "latest" must not move in between.
        if self._initial is None:
            self._initial = {stream: FIRST_ID for stream in self.streams}
            if self.start == "latest":
                client = self._connect()
                for stream in self.streams:
                    try:
                        self._initial[stream] = text(client.xinfo_stream(stream)["last-generated-id"])
                    except Exception as exc:  # noqa: BLE001
                        if "no such key" not in str(exc).lower():
                            raise failed(self.source, self.url, f"cannot read the stream {stream!r}", exc) from None
        return dict(self._initial)

    def end_offset(self, start: dict, cap: int | None) -> dict:
        self._splits.clear()  # Spark planned the batches of the offsets returned before
        budget = cap
        first = {stream: str(start.get(stream, FIRST_ID)) for stream in self.streams}
        last, walked = dict(first), dict.fromkeys(self.streams, 0)
        splits: dict[str, list[str]] = {stream: [] for stream in self.streams}
        open_streams = list(self.streams)
        while open_streams and (budget is None or budget > 0):
            share = 0 if budget is None else max(1, budget // len(open_streams))
            still_open = []
            for stream in open_streams:
                if budget is not None and budget <= 0:
                    break
                count, last[stream], found = self._walk(stream, last[stream], share, "+", walked[stream])
                walked[stream] += count
                splits[stream].extend(found)
                if budget is not None:
                    budget -= count
                if share and count == share:
                    still_open.append(stream)  # it may have more
            open_streams = still_open
        for stream in self.streams:
            if walked[stream]:
                self._splits[(stream, first[stream], last[stream])] = splits[stream]
        return {**start, **last}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        parts: list[InputPartition] = []
        for stream in self.streams:
            after = str(start.get(stream, FIRST_ID))
            upto = str(end.get(stream, after))
            if entry_key(upto) <= entry_key(after):
                continue
            splits = self._splits.pop((stream, after, upto), None)
            if splits is None:  # a batch planned by another process (a restart): walk it again
                splits = self._walk(stream, after, 0, upto, 0)[2]
            bounds = [after, *(s for s in splits if s != upto), upto]
            parts.extend(StreamRange(stream, lo, hi) for lo, hi in zip(bounds, bounds[1:]))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, StreamRange)
        client = redis_client(self.url)
        decoder = EntryDecoder(self.options, self.schema, partition.stream)
        after, upto = partition.after, partition.upto
        try:
            while entry_key(after) < entry_key(upto):
                try:
                    entries = client.xrange(partition.stream, f"({after}", upto, count=CHUNK_ENTRIES)
                except Exception as exc:  # noqa: BLE001
                    raise failed(self.source, self.url, f"cannot read the stream {partition.stream!r}",
                                  exc) from None
                if not entries:
                    break  # trimmed or deleted since the batch was planned
                yield from decoder.batches(entries)
                after = text(entries[-1][0])
                if len(entries) < CHUNK_ENTRIES:
                    break
        finally:
            client.close()

    def stop(self) -> None:
        if self._redis is not None:
            self._redis.close()


class RedisDataSource(spark_broker.DataSource, short_name="headrace_redis", reader=RedisStreamReader,
                      metadata=METADATA):
    """Spark data source ``headrace_redis``; options as produced by ``Redis.options()``."""
