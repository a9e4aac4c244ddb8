"""``Files(..., reader="spark")``: an unbounded directory read by Spark's own file source.

Spark's streaming file source (``readStream.format("json" | "csv" | "parquet")``) keeps the
files it read in its own log, so a replay reads the same files. Records become rows as
headrace's reader makes them, with Spark's parsers:

* timestamps and dates are read as text and converted here, so that ISO-8601 text (no zone:
  UTC) and epoch milliseconds both work, as with headrace's reader;
* a line that is not a record of the schema (Spark's corrupt-record column), or a timestamp
  or date that converts to nothing, goes to the dead letters with the file's name as its
  position (Spark gives no line numbers). The name comes from ``input_file_name()``, evaluated
  only for such a line: selecting Spark's ``_metadata`` column instead made the scan carry it
  on every row, about 0.3 s per 2 M lines (``benchmarks/connectors.py --only files``);
* the dead letters are counted (``count_dead_letters``) on the rows as the scan gives them,
  before any column is computed: observed later, the count made Spark copy every row into
  the computed columns before counting, and left the rest of the query in a second piece of
  generated code.

What differs from headrace's reader (``files_source.py``), and is why this reader is chosen,
not the default: files are taken oldest first (by modification time), not by name; the
position of a dead letter is the file, not ``file:line``; a stop does not hold the source
(Spark plans every batch up to the files present); and there is no bounded mode (Spark's
source never ends, so no final flush closes the last windows).
"""

from __future__ import annotations

from typing import Any

from headrace.connectors.base import count_dead_letters
from headrace.contract import CONTROL_COLUMN, DEAD_COLUMNS
from headrace.schema import Schema, to_ddl

CORRUPT = "_hr_corrupt"
TEMPORAL = ("timestamp", "date")


def _read_schema(schema: Schema, with_corrupt: bool) -> str:
    """The schema Spark reads with: temporal columns as text (converted afterwards)."""
    columns = [(name, "string" if kind in TEMPORAL else kind) for name, kind in schema]
    return to_ddl((*columns, (CORRUPT, "string")) if with_corrupt else tuple(columns))


def _temporal(column: Any, kind: str) -> Any:
    """ISO-8601 text or epoch milliseconds as a timestamp (or a date)."""
    from pyspark.sql import functions as F

    millis = F.when(column.rlike(r"^-?\d+$"), F.timestamp_millis(column.cast("long")))
    moment = F.coalesce(millis, F.try_to_timestamp(column))
    return moment.cast("date") if kind == "date" else moment


def _file_name() -> Any:
    """The name of the file the current row came from (``input_file_name()`` is its URI)."""
    from pyspark.sql import functions as F

    return F.url_decode(F.substring_index(F.input_file_name(), "/", -1))


def read_stream(spark: Any, source: str, path: str, format: str, schema: Schema, *, csv_header: bool,
                max_files: int | None) -> Any:
    """The streaming DataFrame of source ``source``: data columns, the control column and (JSON
    lines and CSV) the dead-letter columns, counted by ``count_dead_letters``."""
    from pyspark.sql import functions as F

    parsed = format != "parquet"
    reader = spark.readStream.schema(_read_schema(schema, parsed) if parsed else to_ddl(schema))
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    if parsed:
        reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
    if format == "csv":
        reader = reader.option("header", str(csv_header).lower())
    frame = reader.format({"jsonl": "json", "csv": "csv", "parquet": "parquet"}[format]).load(path)
    control = F.lit(None).cast("long").alias(CONTROL_COLUMN)
    if not parsed:
        return frame.select(*[F.col(f"`{n}`") for n, _ in schema], control)
    columns, unreadable = [], F.lit(False)
    for name, kind in schema:
        column = F.col(f"`{name}`")
        if kind in TEMPORAL:
            converted = _temporal(column, kind)
            unreadable = unreadable | (column.isNotNull() & converted.isNull())
            column = converted
        columns.append(column.alias(name))
    corrupt = F.col(CORRUPT).isNotNull()
    bad = corrupt | unreadable
    frame = count_dead_letters(frame, source, bad)
    raw = F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*[F.col(f"`{n}`") for n, _ in schema])))
    error = F.when(corrupt, F.lit(f"the line is not a {'JSON object' if format == 'jsonl' else 'CSV row'} of the "
                                  f"schema {to_ddl(schema)}")).otherwise(F.lit("a timestamp or date that is neither "
                                                                              "ISO-8601 text nor epoch milliseconds"))
    dead = [F.when(bad, raw).alias(DEAD_COLUMNS[0]), F.when(bad, error).alias(DEAD_COLUMNS[1]),
            F.when(bad, _file_name()).alias(DEAD_COLUMNS[2])]
    return frame.select(*columns, control, *dead)
