"""Files: a source that reads JSON-lines, CSV or Parquet files from a directory.

Two readers. By default Spark's own streaming file source reads the files, with headrace's
timestamps, dead letters and, for a bounded source, an end (``files_native.py``). With
``reader="python"``, headrace's Python data source (``spark_readers/files.py``) reads them:

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
from dataclasses import dataclass
from typing import Any

from headrace.connectors import files_native
from headrace.connectors.file_formats import FORMATS
from headrace.connectors.file_formats.parquet import parquet_schema
from headrace.connectors.files_native import list_files
from headrace.contract import (
    Guarantee,
    SourceConnector,
    SourceContext,
)
from headrace.errors import PlanError, SourceError
from headrace.schema import Schema, schema_of, to_ddl

READER_KINDS = ("spark", "python")


@dataclass(frozen=True, init=False)
class FileSource(SourceConnector):
    """Records from the files of a directory: ``format`` "jsonl", "csv" or "parquet".

    ``schema`` (any form ``schema_of`` accepts) is required for jsonl and csv; for
    parquet it defaults to the schema of the first file. ``bounded`` reads the files
    present at start and ends; otherwise new files are picked up at every trigger.
    ``fail_fast`` raises on the first bad record instead of dead-lettering it. ``reader``: "spark"
    (Spark's file source, the default) or "python" (headrace's; docs/connectors.md compares them).
    ``csv_header``: the first CSV row names the columns. ``max_files_per_batch``: at
    most this many files per micro-batch (default: all new files; a bounded
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
    spark_data_source = "headrace.connectors.spark_readers.files:FileDataSource"

    def __init__(self, path: str, format: str = "jsonl", schema: Any = None, *, bounded: bool = False,
                 fail_fast: bool = False, csv_header: bool = True, max_files_per_batch: int | None = None,
                 reader: str = "spark") -> None:
        where = f"FileSource({path!r})"
        if reader not in READER_KINDS:
            raise PlanError(f"{where}: unknown reader {reader!r}; use one of {', '.join(READER_KINDS)}")
        if reader == "spark" and set(os.fspath(path)) & set(files_native.PATTERN_CHARACTERS):
            raise PlanError(f"{where}: Spark's file source reads a path that holds any of "
                            f"{' '.join(files_native.PATTERN_CHARACTERS)} as a pattern; rename the directory, "
                            "or read it with reader='python'")
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
        return files_native.read_stream(spark, context, self.path, self.format, self.schema(),
                                        csv_header=self.csv_header, max_files=self.max_files_per_batch,
                                        bounded=self.bounded, fail_fast=self.fail_fast)

    def between_batches(self, context: SourceContext) -> None:
        if self.reader == "spark" and self.bounded:
            files_native.end_bounded(context, self.path, self.format, self.schema(), self.csv_header)

    def checked_fields(self) -> tuple[str, ...]:
        if self.reader == "python" or self.format == "parquet":
            return ()
        return tuple(name for name, kind in self.schema() if kind in files_native.TEMPORAL)

    @property
    def emits_dead_letters(self) -> bool:  # type: ignore[override]
        return self.format != "parquet"

    @property
    def reads_strictly(self) -> bool:  # type: ignore[override]
        return self.reader == "spark" and files_native.reads_strictly(self.format, self.fail_fast)

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

