"""Files: a source that reads JSON-lines, CSV or Parquet files from a directory.

The directory is listed at every trigger. Files are taken in name order and
are treated as immutable once seen (write them elsewhere, or under a hidden
name starting with ``.`` or ``_``, and rename them into place when complete:
hidden files are ignored). The offset is the sorted list of file names seen so
far, ``{"files": ["a.jsonl", "b.jsonl"]}``, plus ``"flushed": true`` once a
bounded source has emitted its flush row; a micro-batch reads the files in its
end offset that are not in its start offset, one Spark partition per file.
Re-reading the same offsets reads the same files, so the source is
exactly-once while the files are kept.

``bounded=True`` reads only the files present when the query first lists the
directory, then ends with a flush control row and writes the exhausted marker;
``bounded=False`` (the default) picks up files added while the query runs and
never ends.

How a file of each format becomes records is in ``headrace/connectors/file_formats/``
(one module per format). In short: JSON lines and CSV take timestamps as ISO-8601 text
(no zone means UTC) or epoch milliseconds, dates as ISO-8601 text and binary as base64
text; a line that does not parse, or a value that does not fit its field's type, becomes
a dead-letter row (``_hr_dead_raw``, ``_hr_dead_error``, ``_hr_dead_position``
``<file>:<line>``), or raises ``SourceError`` with ``fail_fast=True``. Parquet is cast to
the schema (a column that cannot be cast raises ``SourceError``); without an explicit
schema the schema of the first file (by name) is used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.connectors import files_native
from headrace.connectors.base import mark_exhausted, spark_schema, stop_requested
from headrace.connectors.file_formats import FORMATS, READERS
from headrace.connectors.file_formats.parquet import parquet_schema
from headrace.connectors.file_formats.reader import batch_schema
from headrace.contract import (
    CONTROL_COLUMN,
    FLUSH_TIME_MS,
    FLUSHED,
    Guarantee,
    SourceConnector,
    SourceContext,
)
from headrace.errors import PlanError, SourceError
from headrace.runtime.admission import backlog
from headrace.schema import Schema, schema_of, to_ddl

READER_KINDS = ("python", "spark")


def flush_batch(schema: pa.Schema) -> pa.RecordBatch:
    """One control row: every other column null, ``_hr_ctl`` = FLUSH_TIME_MS."""
    arrays = [
        pa.array([FLUSH_TIME_MS], pa.int64()) if field.name == CONTROL_COLUMN else pa.nulls(1, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def list_files(path: str) -> list[str]:
    """The names of the regular, non-hidden files in ``path``, sorted."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries
                      if not e.name.startswith((".", "_")) and e.is_file())


# ----------------------------------------------------------------------------------------
# Spark Python data source.

class FilePartition(InputPartition):
    """One file to read (``path`` set) or the flush row (``path`` None)."""

    def __init__(self, path: str | None) -> None:
        super().__init__(path)
        self.path = path


def _options_schema(options: dict[str, str]) -> Schema:
    text = options.get("schema")
    if not text:
        raise SourceError("headrace_files: the option 'schema' is required")
    if text.lstrip().startswith("["):
        return schema_of([tuple(pair) for pair in json.loads(text)])
    return schema_of(text)


class FileStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.path = options.get("path", "")
        self.format = options.get("format", "jsonl")
        self.bounded = options.get("bounded", "false").lower() == "true"
        self.schema = _options_schema(options)
        self.dead_letters = self.format != "parquet"
        self.max_files = int(options["max_files_per_batch"]) if options.get("max_files_per_batch") else None
        self._marked = False
        self._backlog: int | None = None

    def initialOffset(self) -> dict:
        return {"files": []}

    def _exhausted(self) -> None:
        if not self._marked:
            mark_exhausted(self.options)
            self._marked = True

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        if start.get(FLUSHED):
            self._exhausted()
            return start
        if stop_requested(self.options):
            return start
        try:
            names = list_files(self.path)
        except OSError as exc:
            raise SourceError(f"source {self.options.get('hr_source', 'files')!r}: cannot list the "
                              f"directory {self.path!r}: {exc}") from None
        seen = list(start["files"])
        # A bounded source takes the files of its first listing ("pending" until taken).
        waiting = start.get("pending") if self.bounded else None
        if waiting is None:
            waiting = sorted(set(names) - set(seen))
        taken, rest = (waiting, []) if self.max_files is None else (waiting[:self.max_files], waiting[self.max_files:])
        self._backlog = len(rest)
        if self.bounded:
            if rest:
                return {"files": sorted(seen + taken), "pending": rest}
            self._exhausted()
            return {"files": sorted(seen + taken), FLUSHED: True}
        if not taken:
            return start
        return {"files": sorted(seen + taken)}

    def reportLatestOffset(self) -> dict | None:
        return None if self._backlog is None else backlog(self._backlog, "files")

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        seen = set(start["files"])
        parts: list[InputPartition] = [
            FilePartition(os.path.join(self.path, name)) for name in end["files"] if name not in seen
        ]
        if end.get(FLUSHED) and not start.get(FLUSHED):
            parts.append(FilePartition(None))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        if partition.path is None:
            yield flush_batch(batch_schema(self.schema, self.dead_letters))
            return
        yield from READERS[self.format](self.options, self.schema, partition.path).read()

    def commit(self, end: dict) -> None:
        pass


class FileDataSource(DataSource):
    """Spark data source ``headrace_files``; options as produced by ``FileSource.options()``."""

    @classmethod
    def name(cls) -> str:
        return "headrace_files"

    def schema(self) -> str:
        options = dict(self.options)
        return spark_schema(_options_schema(options), options.get("format", "jsonl") != "parquet")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return FileStreamReader(dict(self.options))


@dataclass(frozen=True, init=False)
class FileSource(SourceConnector):
    """Records from the files of a directory: ``format`` "jsonl", "csv" or "parquet".

    ``schema`` (any form ``schema_of`` accepts) is required for jsonl and csv; for
    parquet it defaults to the schema of the first file. ``bounded`` reads the files
    present at start and ends; otherwise new files are picked up at every trigger.
    ``fail_fast`` raises on the first bad record instead of dead-lettering it.
    ``csv_header``: the first CSV row names the columns. ``max_files_per_batch``: at
    most this many files per micro-batch, in name order (default: all new files; a bounded
    source then reads everything in one batch). Exactly-once while the files are kept unchanged.
    """

    path: str
    format: str
    data_schema: Schema | None
    bounded_input: bool
    fail_fast: bool
    csv_header: bool
    max_files_per_batch: int | None
    reader: str

    guarantee = Guarantee.EXACTLY_ONCE

    def __init__(self, path: str, format: str = "jsonl", schema: Any = None, *, bounded: bool = False,
                 fail_fast: bool = False, csv_header: bool = True, max_files_per_batch: int | None = None,
                 reader: str = "python") -> None:
        where = f"FileSource({path!r})"
        if reader not in READER_KINDS:
            raise PlanError(f"{where}: unknown reader {reader!r}; use one of {', '.join(READER_KINDS)}")
        if reader == "spark" and (bounded or fail_fast):
            raise PlanError(f"{where}: reader='spark' reads an unbounded directory and sends bad records to the "
                            "dead letters; bounded=True and fail_fast=True need reader='python'")
        if max_files_per_batch is not None and (not isinstance(max_files_per_batch, int) or max_files_per_batch < 1):
            raise PlanError(f"{where}: max_files_per_batch must be a whole number of at least 1, "
                            f"got {max_files_per_batch!r}")
        if format not in FORMATS:
            raise PlanError(f"{where}: unknown format {format!r}; use one of {', '.join(FORMATS)}")
        if schema is None and format != "parquet":
            raise PlanError(f"{where}: a {format} source needs schema=, e.g. schema='name string, n long'")
        set_field = object.__setattr__
        set_field(self, "path", os.path.abspath(os.fspath(path)))
        set_field(self, "format", format)
        set_field(self, "data_schema", None if schema is None else schema_of(schema, where))
        set_field(self, "bounded_input", bool(bounded))
        set_field(self, "fail_fast", bool(fail_fast))
        set_field(self, "csv_header", bool(csv_header))
        set_field(self, "max_files_per_batch", max_files_per_batch)
        set_field(self, "reader", reader)

    @property
    def bounded(self) -> bool:
        return self.bounded_input

    @property
    def drains_on_stop(self) -> bool:  # type: ignore[override]
        return self.reader == "python"  # Spark's file source plans every batch up to the files present

    @property
    def lowered_as(self) -> str:  # type: ignore[override]
        return "Spark's own file source" if self.reader == "spark" else "Python data source"

    def read_stream(self, spark: Any, context: SourceContext) -> Any:
        if self.reader == "python":
            return super().read_stream(spark, context)
        return files_native.read_stream(spark, context.source_name, self.path, self.format, self.schema(),
                                        csv_header=self.csv_header, max_files=self.max_files_per_batch)

    @property
    def emits_dead_letters(self) -> bool:  # type: ignore[override]
        return self.format != "parquet"

    @property
    def counts_dead_letters(self) -> bool:  # type: ignore[override]
        return self.reader == "spark"  # files_native.read_stream counts them on the scan's rows

    def schema(self) -> Schema:
        if self.data_schema is not None:
            return self.data_schema
        cached = self.__dict__.get("_inferred")
        if cached is None:
            cached = self._infer_parquet_schema()
            object.__setattr__(self, "_inferred", cached)
        return cached

    def _infer_parquet_schema(self) -> Schema:
        where = f"FileSource({self.path!r})"
        try:
            names = [n for n in list_files(self.path) if n.endswith(".parquet")] or list_files(self.path)
        except OSError as exc:
            raise PlanError(f"{where}: cannot list the directory to read a Parquet schema ({exc}); "
                            "create it or pass schema=") from None
        if not names:
            raise PlanError(f"{where}: no file to read a Parquet schema from; pass schema=")
        return parquet_schema(os.path.join(self.path, names[0]), where)

    def data_source(self) -> type:
        return FileDataSource

    def options(self) -> dict[str, str]:
        return {
            "path": self.path,
            "format": self.format,
            "schema": json.dumps([list(pair) for pair in self.schema()]),
            "bounded": str(self.bounded).lower(),
            "fail_fast": str(self.fail_fast).lower(),
            "csv_header": str(self.csv_header).lower(),
            "max_files_per_batch": str(self.max_files_per_batch or ""),
        }

    def offset_identity(self) -> dict[str, Any]:
        """The offset lists file names: the directory, and how a file becomes records (format,
        schema, CSV header) and the reader (Spark's offsets are its own) fix what it means.
        ``fail_fast`` and ``max_files_per_batch`` do not."""
        return {"path": self.path, "format": self.format, "schema": ", ".join(f"{n} {t}" for n, t in self.schema()),
                "csv_header": self.csv_header, **({"reader": "spark"} if self.reader == "spark" else {})}

    def describe(self) -> dict[str, Any]:
        return {
            "type": "FileSource", "path": self.path, "format": self.format,
            "schema": to_ddl(self.data_schema) if self.data_schema else None,
            "bounded": self.bounded, "fail_fast": self.fail_fast, "csv_header": self.csv_header,
            "max_files_per_batch": self.max_files_per_batch, "reader": self.reader,
            "guarantee": self.guarantee.value, "dead_letters": self.emits_dead_letters,
        }

    def prepare(self, context: SourceContext) -> None:
        if not os.path.isdir(self.path):
            raise SourceError(f"source {context.source_name!r}: the directory "
                              f"{self.path!r} does not exist; create it before starting the pipeline")

