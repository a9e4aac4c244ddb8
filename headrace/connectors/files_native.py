"""``Files`` read by Spark's own file source (``reader="spark"``, the default).

Spark's streaming file source (``readStream.format("json" | "csv" | "parquet")``) keeps the
files it read in its own log, so a replay reads the same files. Records become rows as
headrace's rules say (``headrace/connectors/file_formats/``), with Spark's parsers:

* timestamps and dates are read as text and converted here, so that ISO-8601 text (no zone:
  UTC) and epoch milliseconds both work, as with headrace's reader. Only those some step reads
  are checked (``SourceContext.fields_read``), as Spark's parser checks only the fields a query
  reads: the check of every row is what a query that does not read them would pay most for;
* a line that is not a record of the schema (Spark's corrupt-record column), or a timestamp
  or date that converts to nothing, goes to the dead letters with the file's name as its
  position (Spark gives no line numbers), or with ``fail_fast`` stops the query with a
  ``SourceError`` naming the file and the line's text. JSON lines kept for their dead letters
  are read as text and parsed by Spark's ``from_json`` (the same parser and options as its
  JSON file source), so that a dead letter carries its line as written (``_json_lines``; a
  line holding a JSON array is then a dead letter, where that source reads its objects); a
  CSV row whose timestamp does not convert is written back as CSV from its fields (Spark's CSV
  reader keeps a line's text only for a row it cannot parse). The name comes from
  ``input_file_name()``, evaluated only for such a line: selecting Spark's ``_metadata`` column
  instead made the scan carry it on every row, about 0.3 s per 2 M lines
  (``benchmarks/connectors.py --only files``);
* the dead letters are counted (``count_dead_letters``) on the rows as the scan gives them,
  before any column is computed: observed later, the count made Spark copy every row into
  the computed columns before counting, and left the rest of the query in a second piece of
  generated code;
* a JSON-lines source whose dead letters nothing reads but their count
  (``SourceContext.strict``) is read strictly until a bad line comes: Spark's FAILFAST parser,
  no corrupt-record column, no dead-letter test a row, and a timestamp that converts to nothing
  raises ``STRICT_READ_FAILED``; the runner then reads the batch again with the dead letters
  (``_read_strictly``; a pass-through into ``noop`` went from 0.85 to about 1.0 of Spark alone);
* no file is ever too old: Spark's ``maxFileAge`` (7 days by default: a file that appears with
  a modification time a week older than the newest one seen is skipped) is set beyond reach.

**Bounded**: Spark's source never ends, so headrace ends it. Spark reads two folders (a glob):
the source's directory and the source's end folder in the run files, and sees only the files
the directory holds when the run starts (a ``pathGlobFilter`` of their names) and the end
file. Spark logs the files each micro-batch takes before the batch runs, under the query's
checkpoint (``sources/<n>/<batch>``, ``<batch>.compact``: a ``v1`` line, then one JSON entry
per file). Between micro-batches, and every quarter of a second while one runs, the runner
calls ``end_bounded``: once the log holds every file of the directory in a planned batch, it
writes the end file, one flush row (its ``_hr_ctl`` set, which a row of any other file never
has), so that the batch after the one that took the last files reads it; once the log holds the
end file, it writes the exhausted marker.
No Python runs in the query. That needs the checkpoint on this machine's file system.

What differs from headrace's Python reader (``reader="python"``): files are taken oldest
first (by modification time; files modified in the same millisecond in any order), not by
name; a dead letter's position is its file, not ``file:line``; and a stop does not hold the
source (Spark plans every batch up to the files present).
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any
from urllib.parse import unquote, urlparse

from headrace.connectors.base import count_dead_letters, mark_exhausted, record_count, write_atomically
from headrace.contract import (
    CONTROL_COLUMN,
    CONTROL_METRIC_PREFIX,
    DEAD_COLUMNS,
    FLUSH_TIME_MS,
    STRICT_READ_FAILED,
    SourceContext,
)
from headrace.environment.state_paths import is_remote, local_path
from headrace.errors import SourceError
from headrace.schema import Schema, arrow_schema, to_ddl

CORRUPT = "_hr_corrupt"
LINE = "_hr_line"  # a JSON line's text, read leniently (_json_lines)
PARSED = "_hr_parsed"  # its fields, parsed
BLANK = "_hr_blank"  # whether it is blank
BYTE_ORDER_MARK = "\ufeff"
CONVERTED = "_hr_converted_"  # + a temporal field's name: its value converted, in the projection of conversions
PARTITION = "_hr_partition"  # that projection's non-deterministic column (see _with_dead_letters)
TEMPORAL = ("timestamp", "date")
SPARK_FORMATS = {"jsonl": "json", "csv": "csv", "parquet": "parquet"}
KEEP_EVERY_FILE = "3650000d"  # Spark's maxFileAge: files this much older than the newest are skipped
PATTERN_CHARACTERS = "{}[]*?\\"  # Hadoop's glob characters: Spark reads a path with any of them as a pattern
_GLOB_SPECIAL = set(PATTERN_CHARACTERS + ",")  # and the comma between the alternatives of the globs written here


def only_these(names: list[str]) -> str:
    r"""A ``pathGlobFilter`` that matches exactly ``names`` (and nothing when there are none).

    >>> only_these(["a.jsonl", "b,{1}.jsonl"])
    '{a.jsonl,b\\,\\{1\\}.jsonl}'
    """
    return "{" + ",".join(map(_glob, names)) + "}"


def list_files(path: str) -> list[str]:
    """The names of the regular, non-hidden files in ``path``, sorted."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries
                      if not e.name.startswith((".", "_")) and e.is_file())


def _glob(text: str) -> str:
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in text)


def _both(first: str, second: str) -> str:
    r"""A glob of two folders, as Hadoop takes it: their common parent, then the alternatives.

    >>> _both("/data/in,box", "/state/p/run/files_end/s")
    '/{data/in\\,box,state/p/run/files_end/s}'
    """
    parent = os.path.commonpath([first, second])
    relative = [os.path.relpath(folder, parent) for folder in (first, second)]
    return os.path.join(_glob(parent), "{" + ",".join(map(_glob, relative)) + "}")


def _read_schema(schema: Schema, parsed: bool, flush: bool, corrupt: bool) -> str:
    """The schema Spark reads with: temporal columns of text files as text (converted afterwards),
    the control column of a bounded source's end file, the corrupt-record column."""
    columns = [(name, "string" if parsed and kind in TEMPORAL else kind) for name, kind in schema]
    if flush:
        columns.append((CONTROL_COLUMN, "long"))
    if corrupt:
        columns.append((CORRUPT, "string"))
    return to_ddl(tuple(columns))


def reads_strictly(format: str, fail_fast: bool) -> bool:
    """Whether a source can be read strictly (``SourceContext.strict``): JSON lines, whose
    parser checks the same fields in Spark's FAILFAST mode as in PERMISSIVE mode with the
    corrupt-record column (the CSV parser checks every column only in the latter)."""
    return format == "jsonl" and not fail_fast


def _temporal(column: Any, kind: str) -> Any:
    """ISO-8601 text or epoch milliseconds (all digits) as a timestamp (or a date).

    Text with a ``:`` (a time of day) cannot be all digits: it skips the regular expression,
    which cost about 6 % of a read of NEXMark's bids (a Java string made of each value)."""
    from pyspark.sql import functions as F

    millis = F.when(column.rlike(r"^-?\d+$"), F.timestamp_millis(column.cast("long")))
    moment = F.when(column.contains(":"), F.try_to_timestamp(column)).otherwise(
        F.coalesce(millis, F.try_to_timestamp(column)))
    return moment.cast("date") if kind == "date" else moment


PROBE_MARK = 7_654_321_000_000  # in a probe's conversions: its number shows in the plan Spark optimized


def probe_mark(source: str, field: str) -> int:
    """The number that marks ``field``'s conversion in a probe of ``source`` (``headrace/spark/fields_read.py``)."""
    return PROBE_MARK + zlib.crc32(f"{source}/{field}".encode()) % 1_000_000


def _file_name() -> Any:
    """The name of the file the current row came from (``input_file_name()`` is its URI)."""
    from pyspark.sql import functions as F

    return F.url_decode(F.substring_index(F.input_file_name(), "/", -1))


def read_stream(spark: Any, context: SourceContext, path: str, format: str, schema: Schema, *, csv_header: bool,
                max_files: int | None, bounded: bool, fail_fast: bool) -> Any:
    """The streaming DataFrame of the source: data columns, the control column and (JSON lines
    and CSV) the dead-letter columns, counted by ``count_dead_letters``."""
    from pyspark.sql import functions as F

    source = context.source_name
    parsed = format != "parquet"
    strict = context.strict  # only where reads_strictly holds (FileSource.reads_strictly)
    if context.checkpoint and not is_remote(context.checkpoint):
        forget_unplanned(_local(context.checkpoint))
    flush = bounded and context.control_read  # the end file's flush row, when a step reads it
    end = _prepare_end(context, path, flush) if bounded else ""
    read_schema = _read_schema(schema, parsed, flush, corrupt=parsed and not strict)
    reader = spark.readStream.option("maxFileAge", KEEP_EVERY_FILE)
    if bounded:
        reader = reader.option("pathGlobFilter", only_these([*_this_run(end)["files"], *[END_FILE[format]] * flush]))
    if max_files is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files))
    if strict:
        reader = reader.option("mode", "FAILFAST")
    elif parsed:
        reader = reader.option("mode", "PERMISSIVE").option("columnNameOfCorruptRecord", CORRUPT)
    if format == "csv":
        reader = reader.option("header", str(csv_header).lower())
    location = _both(path, end) if flush else path
    if keeps_lines(format, context, fail_fast):
        frame = _json_lines(reader, location, read_schema)
    else:
        frame = reader.schema(read_schema).format(SPARK_FORMATS[format]).load(location)
    control = F.lit(None).cast("long")
    if flush:  # only the end file's row is a control row; Spark counts it as input, progress takes it off
        control = F.when(F.col(CONTROL_COLUMN).isNotNull() & (_file_name() == END_FILE[format]), F.col(CONTROL_COLUMN))
    if strict:
        return _read_strictly(frame, context, schema, control)
    if parsed:
        return _with_dead_letters(frame, context, path, format, schema, control, fail_fast, flush)
    if flush:
        frame = frame.observe(f"{CONTROL_METRIC_PREFIX}{source}", F.count(control).alias("control_rows"))
    return frame.select(*[F.col(f"`{n}`") for n, _ in schema], control.alias(CONTROL_COLUMN))


def keeps_lines(format: str, context: SourceContext, fail_fast: bool) -> bool:
    """Whether the source reads JSON lines as text (``_json_lines``): when the text of a bad
    line may be read, by a dead-letter step or in ``fail_fast``'s error. Spark's JSON file
    source reads the others (strictly, or leniently when only the dead letters' count is read)."""
    return format == "jsonl" and not context.strict and (fail_fast or not context.dead_letters_counted)


def _json_lines(reader: Any, location: str, ddl: str) -> Any:
    """JSON lines as text (``LINE``, what a dead letter carries as written) and their fields as
    Spark's JSON parser makes them (``from_json``, the parser of its JSON file source), with the
    corrupt-record column and ``BLANK``: a blank line, which is no record (Spark's JSON file
    source skips it; ``_with_dead_letters`` counts it off the input rows, then drops it). A byte
    order mark before a file's first line is not part of it."""
    from pyspark.sql import functions as F

    text = F.col("value")
    line = F.when(text.startswith(BYTE_ORDER_MARK), text.substr(F.lit(2), F.length(text))).otherwise(text)
    parsed = F.from_json(F.col(LINE), ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT})
    lines = reader.format("text").load(location).select(line.alias(LINE))
    return lines.select(LINE, parsed.alias(PARSED)).select(LINE, f"{PARSED}.*", F.col(PARSED).isNull().alias(BLANK))


def _read_strictly(frame: Any, context: SourceContext, schema: Schema, control: Any) -> Any:
    """The data columns, their timestamps converted, and the control column: a line that is not
    a record of the schema stops the batch in Spark's parser (FAILFAST), and a timestamp or date
    that converts to nothing stops it with ``STRICT_READ_FAILED``. (A source read strictly has
    no step that reads its control rows: it has no flush row to count.)"""
    from pyspark.sql import functions as F

    columns = []
    for name, kind in schema:
        column = F.col(f"`{name}`")
        if kind in TEMPORAL:
            converted = _temporal(column, kind)
            if context.fields_read is None or name in context.fields_read:  # only those read are checked
                failed = F.raise_error(F.lit(f"{STRICT_READ_FAILED} (source {context.source_name!r}, field {name!r})"))
                converted = F.coalesce(converted, F.when(column.isNotNull(), failed.cast(kind)))
            column = converted
        columns.append(column.alias(name))
    return frame.select(*columns, control.alias(CONTROL_COLUMN))


def _with_dead_letters(frame: Any, context: SourceContext, path: str, format: str, schema: Schema, control: Any,
                       fail_fast: bool, count_control: bool) -> Any:
    from pyspark.sql import functions as F

    source, columns, unreadable = context.source_name, [], F.lit(False)
    converted_columns = []
    for name, kind in schema:
        column = F.col(f"`{name}`")
        if kind in TEMPORAL and context.probe_fields:
            column = F.timestamp_millis(F.length(column) + F.lit(probe_mark(source, name)))
        elif kind in TEMPORAL and (context.fields_read is None or name in context.fields_read):
            converted_columns.append(_temporal(column, kind).alias(f"{CONVERTED}{name}"))
            converted = F.col(f"`{CONVERTED}{name}`")
            unreadable = unreadable | (column.isNotNull() & converted.isNull())
            column = converted
        elif kind in TEMPORAL:  # no step reads it: unchecked, and Spark drops its conversion
            column = _temporal(column, kind)
        columns.append(column.alias(name))
    if converted_columns:
        # Each conversion once a row: in a projection of its own, which a non-deterministic column
        # (read by the dead-letter test below) keeps Spark's optimizer from pushing the good-rows
        # filter through, inlining each conversion into the filter and the output a second time.
        frame = frame.select("*", *converted_columns, F.spark_partition_id().alias(PARTITION))
        unreadable = unreadable | (F.col(PARTITION) < 0)
    corrupt = F.col(CORRUPT).isNotNull()
    bad = corrupt | unreadable
    frame = _counted(frame, context, bad, control if count_control else None)
    if format == "csv":
        raw = F.coalesce(F.col(CORRUPT), _csv_row(schema))
    else:  # without the lines' text, only the dead letters' count is read (keeps_lines)
        raw = F.col(LINE) if LINE in frame.columns else F.col(CORRUPT)
    error = F.when(corrupt, F.lit(f"the line is not a {'JSON object' if format == 'jsonl' else 'CSV row'} of the "
                                  f"schema {to_ddl(schema)}")).otherwise(F.lit("a timestamp or date that is neither "
                                                                              "ISO-8601 text nor epoch milliseconds"))
    if fail_fast:  # the query stops on the first bad line, with a SourceError (headrace.errors.raised_inside)
        where = F.concat(F.lit(f"headrace.errors.SourceError: source {source!r}: {path}/"), _file_name(), F.lit(": "))
        text = F.regexp_replace(F.substring(raw, 1, 200), r"[\r\n]+", " ")  # Spark adds its SQLSTATE after a line
        control = F.when(bad, F.raise_error(F.concat(where, error, F.lit(": "), text, F.lit("\n"))).cast("long")
                         ).otherwise(control)
    dead = [F.when(bad, raw).alias(DEAD_COLUMNS[0]), F.when(bad, error).alias(DEAD_COLUMNS[1]),
            F.when(bad, _file_name()).alias(DEAD_COLUMNS[2])]
    return frame.select(*columns, control.alias(CONTROL_COLUMN), *dead)


def _counted(frame: Any, context: SourceContext, bad: Any, control: Any) -> Any:
    """``frame`` with its dead letters counted (``count_dead_letters``) unless the query counts
    them (``SourceContext.dead_letters_counted``), and without the blank lines of JSON lines read
    as text, counted beside the control rows: Spark counts them as input rows, progress takes
    them off, as it does control rows."""
    from pyspark.sql import functions as F

    blank = F.col(BLANK) if BLANK in frame.columns else None
    not_records = control if blank is None else F.when(blank, F.lit(0)).otherwise(control)
    if not context.dead_letters_counted:
        frame = count_dead_letters(frame, context.source_name, bad, not_records,
                                   records=record_count(not_records) if context.count_records else None)
    elif blank is not None:
        frame = frame.observe(f"{CONTROL_METRIC_PREFIX}{context.source_name}",
                              F.count(not_records).alias("control_rows"))
    return frame if blank is None else frame.where(~blank)


def _csv_row(schema: Schema) -> Any:
    """A CSV row whose timestamp or date does not convert, written back as CSV from its fields
    as Spark's CSV parser read them (the temporal ones as their text): Spark's CSV reader gives
    a line as written only for a row it cannot parse."""
    from pyspark.sql import functions as F

    as_read = F.struct(*[F.col(f"`{n}`") for n, _ in schema])
    return F.to_csv(as_read, {"ignoreLeadingWhiteSpace": "false", "ignoreTrailingWhiteSpace": "false"})


# ----------------------------------------------------------------------------------------------
# The end of a bounded source.

END_FILE = {"jsonl": "headrace-end-of-input.jsonl", "csv": "headrace-end-of-input.csv",
            "parquet": "headrace-end-of-input.parquet"}
RUN_FILE = ".this-run.json"
ENDED = ".ended"  # written once the input has ended  # hidden: Spark skips names that start with "." or "_"


def _end_folder(context: SourceContext) -> str:
    return os.path.abspath(os.path.join(context.run_dir, "files_end", context.source_name))


def _this_run(end: str) -> dict[str, Any]:
    """What ``_prepare_end`` wrote: ``files``, this run's, and ``flush``, whether to write the end file."""
    with open(os.path.join(end, RUN_FILE), encoding="utf-8") as run:
        return dict(json.load(run))


def _prepare_end(context: SourceContext, path: str, flush: bool) -> str:
    """The source's end folder, with the names of the files the directory holds now (what this
    run reads) and whether a step reads the flush row. The end file is written later, by
    ``end_bounded``; a run that stopped before Spark took it leaves it for the next."""
    if not context.checkpoint or is_remote(context.checkpoint):
        raise SourceError(f"source {context.source_name!r}: a bounded Files source read by Spark's file source "
                          f"learns that its input has ended from the checkpoint, which must be on this machine "
                          f"(the state dir is {context.checkpoint or 'unknown'}); use reader='python'")
    end = _end_folder(context)
    os.makedirs(end, exist_ok=True)
    # An input that ended in an earlier run from this checkpoint stays ended: nothing more is read
    # but the files Spark took already (the filter applies to a batch it runs again, too: the
    # last, when the run before stopped during it).
    taken = files_taken(_local(context.checkpoint)) if os.path.exists(os.path.join(end, ENDED)) else set()
    files = [name for name in list_files(path) if not taken or os.path.join(path, name) in taken]
    write_atomically(os.path.join(end, RUN_FILE), json.dumps({"files": files, "flush": flush}).encode())
    return end


def end_bounded(context: SourceContext, path: str, format: str, schema: Schema, csv_header: bool) -> None:
    """Between micro-batches: once Spark has taken every file of this run, the end file (or,
    when no step reads the flush row, the end); once it has taken the end file, the end: the
    exhausted marker, and the ended marker a later run from this checkpoint reads nothing after."""
    end = _end_folder(context)
    if not os.path.exists(os.path.join(end, RUN_FILE)):
        return  # the query has not started
    run, end_file = _this_run(end), os.path.join(end, END_FILE[format])
    taken = files_taken(_local(context.checkpoint))
    all_taken = all(os.path.join(path, name) in taken for name in run["files"])
    if end_file in taken or (all_taken and not run["flush"]):
        write_atomically(os.path.join(end, ENDED), b"")
        mark_exhausted(context.options())
    elif all_taken and not os.path.exists(end_file):
        write_atomically(end_file, _end_file(format, schema, csv_header))


def _local(checkpoint: str) -> str:
    return os.path.abspath(local_path(checkpoint))


def _end_file(format: str, schema: Schema, csv_header: bool) -> bytes:
    """One row: every column null but the control column, FLUSH_TIME_MS."""
    if format == "jsonl":
        return json.dumps({CONTROL_COLUMN: FLUSH_TIME_MS}).encode() + b"\n"
    if format == "csv":
        header = ",".join([*(name for name, _ in schema), CONTROL_COLUMN]) + "\n" if csv_header else ""
        return (header + "," * len(schema) + f"{FLUSH_TIME_MS}\n").encode()
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    fields = [*arrow_schema(schema), pa.field(CONTROL_COLUMN, pa.int64())]
    row = pa.table([pa.nulls(1, f.type) for f in fields[:-1]] + [pa.array([FLUSH_TIME_MS], pa.int64())],
                   schema=pa.schema(fields))
    buffer = io.BytesIO()
    pq.write_table(row, buffer)
    return buffer.getvalue()


def files_taken(checkpoint: str) -> set[str]:
    """The paths of the files the query's file sources have taken in a planned micro-batch: the
    entries of their logs that the offset log's latest entry covers. ``end_bounded`` also runs
    while a batch is being planned, and Spark logs a batch's files just before its offsets: a
    file of a batch not planned yet (which ``forget_unplanned`` would take out after a crash)
    does not count."""
    paths: set[str] = set()
    logs = os.path.join(checkpoint, "sources")
    if not os.path.isdir(logs):
        return paths
    planned = _planned_log_offsets(checkpoint)
    for source in os.scandir(logs):
        if source.is_dir() and source.name.isdigit():
            last = planned.get(int(source.name), -1)
            for log in os.scandir(source.path):
                if not log.name.startswith(".") and not log.name.endswith(".crc"):  # being written; checksums
                    paths.update(unquote(urlparse(entry["path"]).path) for entry in _log_entries(log.path) or ()
                                 if entry["batchId"] <= last)
    return paths


_READ_LOGS: dict[str, tuple[tuple[int, int], list[dict[str, Any]] | None]] = {}


def _log_entries(log: str) -> list[dict[str, Any]] | None:
    """The entries of a file source's log (one per file: ``path``, ``batchId``...), or None for
    another kind of source's log. A log is read again only once it changed: the runner asks
    between every two micro-batches, and a compacted log holds every file taken so far."""
    stat = os.stat(log)
    version = (stat.st_mtime_ns, stat.st_size)
    cached = _READ_LOGS.get(log)
    if cached is not None and cached[0] == version:
        return cached[1]
    with open(log, encoding="utf-8") as lines:
        first, *rest = lines.read().splitlines() or [""]
    entries = [_file_entry(line) for line in rest] if first.strip() == "v1" else [None]
    found = None if None in entries else [e for e in entries if e is not None]
    _READ_LOGS[log] = (version, found)
    return found


def _file_entry(line: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) and {"path", "batchId"} <= set(entry) else None


# ----------------------------------------------------------------------------------------------
# Files Spark logged for a micro-batch it never planned.


def forget_unplanned(checkpoint: str) -> None:
    """Take out of the file sources' logs the files of a micro-batch that no offset log entry
    names: a driver killed between the two writes left them. Spark would otherwise put them in
    the next micro-batch beside the files it lists then, past ``maxFilesPerTrigger``. A delta
    log is removed; a compacted one (every tenth, holding the earlier batches' files too) loses
    those entries only."""
    logs = os.path.join(checkpoint, "sources")
    if not os.path.isdir(logs):
        return
    planned = _planned_log_offsets(checkpoint)
    for source in os.scandir(logs):
        if source.is_dir() and source.name.isdigit():
            _forget_after(source.path, planned.get(int(source.name), -1))


def _planned_log_offsets(checkpoint: str) -> dict[int, int]:
    """Each file source's log offset in the latest entry of the query's offset log, by source index."""
    offsets = os.path.join(checkpoint, "offsets")
    batches = [int(n) for n in os.listdir(offsets) if n.isdigit()] if os.path.isdir(offsets) else []
    if not batches:
        return {}
    with open(os.path.join(offsets, str(max(batches))), encoding="utf-8") as log:
        lines = log.read().splitlines()[2:]  # after the version and the batch's metadata
    found = {}
    for index, line in enumerate(lines):
        try:
            offset = json.loads(line)
        except ValueError:
            continue
        if isinstance(offset, dict) and set(offset) == {"logOffset"} and isinstance(offset["logOffset"], int):
            found[index] = offset["logOffset"]
    return found


def _forget_after(log_folder: str, planned: int) -> None:
    for name in os.listdir(log_folder):
        batch = name.removesuffix(".compact")
        if not batch.isdigit() or int(batch) <= planned:
            continue
        path = os.path.join(log_folder, name)
        entries = _log_entries(path)
        if entries is None:
            continue  # another kind of source's log
        checksum = os.path.join(log_folder, f".{name}.crc")  # Hadoop's checksum of the old content
        if os.path.exists(checksum):
            os.remove(checksum)
        if name.endswith(".compact"):
            with open(path, encoding="utf-8") as log:
                lines = log.read().splitlines()[1:]  # one per entry, after the version
            kept = [line for line, entry in zip(lines, entries) if entry["batchId"] <= planned]
            write_atomically(path, "\n".join(["v1", *kept]).encode())
        else:
            os.remove(path)
