"""The Spark side of the message-system sources (``headrace/connectors/broker.py``): the reader
base, which plans batches by position, and the data source base, which gives Spark the columns
(the data's, the source's own metadata, the control and dead-letter columns) and the reader."""

from __future__ import annotations

from typing import Any, ClassVar

from pyspark.sql import datasource

from headrace.connectors.base import spark_schema, stop_requested
from headrace.connectors.broker import options_schema
from headrace.environment.admission import adaptive_cap, combined_cap
from headrace.schema import Schema


class Reader(datasource.DataSourceStreamReader):
    """A message-system source's reader, made from the options its connector wrote; a subclass
    names the source when the options name none: ``class NatsStreamReader(Reader, default_name="nats")``.

    ``latestOffset`` is the start while the stop file exists (the run drains), else
    ``end_offset(start, cap)``. The offsets are positions the server keeps, so ``commit`` has
    nothing to do unless the source acknowledges what it read."""

    default_name: ClassVar[str]  # the source's name when the options give none
    adaptive: ClassVar[bool] = False  # the runtime's adaptive admission caps its batches

    def __init_subclass__(cls, *, default_name: str, **more: Any) -> None:
        super().__init_subclass__(**more)
        cls.default_name = default_name

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.source = options.get("hr_source", self.default_name)
        self.schema = options_schema(options)
        cap = options.get("max_records_per_batch") or ""
        self.max_records = int(cap) if cap.isdigit() else None

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        if stop_requested(self.options):
            return start
        return self.end_offset(start, self.cap(limit))

    def cap(self, limit: Any) -> int | None:
        """The most records the next batch may take (None: no cap): the smallest of
        ``max_records_per_batch``, adaptive admission's cap (``adaptive`` sources) and Spark's
        read ``limit``."""
        max_rows = getattr(limit, "max_rows", None)
        admitted = adaptive_cap(self.options) if self.adaptive else None
        return combined_cap(self.max_records, admitted, None if max_rows is None else int(max_rows))

    def end_offset(self, start: dict, cap: int | None) -> dict:
        """The offset where the batch after ``start`` ends, at most ``cap`` records on (``start``
        itself when there is nothing to read)."""
        raise NotImplementedError

    def commit(self, end: dict) -> None:
        pass


class PositionRange(datasource.InputPartition):
    """The positions after ``after`` up to ``upto`` (inclusive): what one Spark task reads (NATS
    stream sequences, RabbitMQ stream offsets, the commit LSNs of a PostgreSQL slot)."""

    def __init__(self, after: Any, upto: Any) -> None:
        super().__init__((after, upto))
        self.after, self.upto = after, upto


def split_range(after: int, upto: int, size: int) -> list[tuple[int, int]]:
    """The positions after ``after`` up to ``upto`` in pieces of at most ``size``, as (after, upto).

    >>> split_range(0, 5, 2), split_range(7, 7, 2)
    ([(0, 2), (2, 4), (4, 5)], [])
    """
    bounds = [*range(after, upto, size), upto]
    return list(zip(bounds, bounds[1:]))


class DataSource(datasource.DataSource):
    """A message-system source's Spark data source: its schema and its reader, from the options its
    connector wrote. A subclass names what Spark registers it as, its reader and the columns the
    source adds to each record: ``class NatsDataSource(broker.DataSource, short_name="headrace_nats",
    reader=NatsStreamReader, metadata=METADATA)``."""

    short_name: ClassVar[str]
    reader_class: ClassVar[type[Reader]]
    metadata: ClassVar[Schema]

    def __init_subclass__(cls, *, short_name: str, reader: type[Reader], metadata: Schema, **more: Any) -> None:
        super().__init_subclass__(**more)
        cls.short_name, cls.reader_class, cls.metadata = short_name, reader, metadata

    @classmethod
    def name(cls) -> str:
        return cls.short_name

    def schema(self) -> str:
        return spark_schema((*options_schema(dict(self.options)), *self.metadata), dead_letters=True)

    def streamReader(self, schema: Any) -> datasource.DataSourceStreamReader:
        return self.reader_class(dict(self.options))
