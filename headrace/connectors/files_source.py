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

Parsing:

* jsonl: one JSON object per line; missing fields and JSON nulls are null;
  numbers, booleans, objects and arrays given for a string field are kept as
  their JSON text; integral floats (``3.0``) are accepted for integer fields.
* csv: one record per row (quoted fields may span lines); with ``csv_header``
  the first row names the columns (in any order, extra columns ignored; a
  header that lacks a schema column is an error), else columns are positional.
  An empty field is null.
* both: timestamps are ISO-8601 text (no zone means UTC) or epoch milliseconds;
  dates ISO-8601 text; binary base64 text; booleans ``true``/``false`` (CSV also
  ``1``/``0``). Empty lines are skipped. A line that does not parse, a CSV row
  with the wrong number of fields, or a value that does not fit its field's
  type becomes a dead-letter row (data columns null, ``_hr_dead_raw`` the line,
  ``_hr_dead_error`` the problem, ``_hr_dead_position`` ``<file>:<line>``,
  1-based). With ``fail_fast=True`` it raises ``SourceError`` instead.
* parquet: read with pyarrow and cast to the schema (missing columns null); a
  column that cannot be cast raises ``SourceError``. Without an explicit schema
  the schema of the first file (by name) is used.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.connectors.base import (
    CONTROL_COLUMN,
    DEAD_COLUMNS,
    FLUSH_TIME_MS,
    Guarantee,
    SourceConnector,
    SourceContext,
    mark_exhausted,
    stop_requested,
)
from headrace.errors import PlanError, SourceError
from headrace.schema import Schema, schema_of, to_ddl

FORMATS = ("jsonl", "csv", "parquet")
CHUNK_LINES = 65_536  # lines parsed per Arrow record batch
JSONL_BLOCK_BYTES = 8 << 20  # bytes of whole lines handed to pyarrow's JSON reader at a time
CSV_FAST_MAX_BYTES = 256 << 20  # larger CSV files are parsed record by record

ARROW_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "int": pa.int32(),
    "double": pa.float64(),
    "float": pa.float32(),
    "boolean": pa.bool_(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "binary": pa.binary(),
}


def arrow_schema(schema: Schema, dead_letters: bool) -> pa.Schema:
    """The Arrow schema a source's ``read`` yields: data columns, ``_hr_ctl``, dead-letter columns."""
    fields = [pa.field(name, ARROW_TYPES[type_name]) for name, type_name in schema]
    fields.append(pa.field(CONTROL_COLUMN, pa.int64()))
    if dead_letters:
        fields.extend(pa.field(name, pa.string()) for name in DEAD_COLUMNS)
    return pa.schema(fields)


def spark_schema(schema: Schema, dead_letters: bool) -> str:
    """The DDL of the same columns, for ``DataSource.schema``."""
    columns = [*schema, (CONTROL_COLUMN, "long")]
    if dead_letters:
        columns.extend((name, "string") for name in DEAD_COLUMNS)
    return to_ddl(tuple(columns))


def flush_batch(schema: pa.Schema) -> pa.RecordBatch:
    """One control row: every other column null, ``_hr_ctl`` = FLUSH_TIME_MS."""
    arrays = [
        pa.array([FLUSH_TIME_MS], pa.int64()) if field.name == CONTROL_COLUMN else pa.nulls(1, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _spark_type_of_arrow(name: str, arrow_type: pa.DataType, where: str) -> str:
    checks: list[tuple[Callable[[pa.DataType], bool], str]] = [
        (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "string"),
        (pa.types.is_int64, "long"),
        (lambda t: pa.types.is_integer(t) and t.bit_width <= 32 and not (
            pa.types.is_unsigned_integer(t) and t.bit_width == 32), "int"),
        (lambda t: pa.types.is_unsigned_integer(t), "long"),
        (pa.types.is_float64, "double"),
        (lambda t: pa.types.is_float32(t) or pa.types.is_float16(t), "float"),
        (pa.types.is_boolean, "boolean"),
        (pa.types.is_timestamp, "timestamp"),
        (pa.types.is_date, "date"),
        (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), "binary"),
    ]
    for check, type_name in checks:
        if check(arrow_type):
            return type_name
    raise PlanError(f"{where}: column {name!r} has the Parquet type {arrow_type}, which headrace cannot "
                    "carry; pass schema= with the columns you need")


def list_files(path: str) -> list[str]:
    """The names of the regular, non-hidden files in ``path``, sorted."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries
                      if not e.name.startswith((".", "_")) and e.is_file())


# ----------------------------------------------------------------------------------------
# Value conversion. A converter turns one non-null value into what pyarrow expects for
# the field's type, or raises _BadValue with the expected type.

class _BadValue(Exception):
    pass


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
_MIN_US = -62_135_596_800_000_000  # 0001-01-01
_MAX_US = 253_402_300_799_999_999  # 9999-12-31 23:59:59.999999
_INT_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")
_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_NUMBER_TEXT = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")

EXPECTED = {
    "timestamp": "timestamp (ISO-8601 text or epoch milliseconds)",
    "date": "date (ISO-8601 text)",
    "binary": "binary (base64 text)",
}


def _iso_us(text: str) -> int:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise _BadValue from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _ONE_US


def _epoch_ms_us(value: float) -> int:
    micros = round(value * 1000)
    if not _MIN_US <= micros <= _MAX_US:
        raise _BadValue
    return micros


def _integer(bits: int) -> tuple[Callable[[Any], Any], Callable[[str], Any]]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def from_json(value: Any) -> int:
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int or not low <= value <= high:
            raise _BadValue
        return value

    def from_text(text: str) -> int:
        if not _INT_TEXT.match(text):
            raise _BadValue
        return from_json(int(text))

    return from_json, from_text


def _json_double(value: Any) -> float:
    if type(value) not in (int, float):
        raise _BadValue
    return float(value)


def _text_double(text: str) -> float:
    if "_" in text:
        raise _BadValue
    try:
        return float(text)
    except ValueError:
        raise _BadValue from None


def _json_boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise _BadValue
    return value


def _text_boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise _BadValue


def _json_timestamp(value: Any) -> int:
    if type(value) is str:
        return _iso_us(value)
    if type(value) in (int, float):
        return _epoch_ms_us(value)
    raise _BadValue


def _text_timestamp(text: str) -> int:
    if _NUMBER_TEXT.match(text):
        return _epoch_ms_us(float(text) if any(c in text for c in ".eE") else int(text))
    return _iso_us(text)


def _date(value: Any) -> date:
    if type(value) is not str:
        raise _BadValue
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise _BadValue from None


def _binary(value: Any) -> bytes:
    if type(value) is not str:
        raise _BadValue
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _BadValue from None


def _json_string(value: Any) -> str:
    return value if type(value) is str else json.dumps(value)


_LONG, _INT = _integer(64), _integer(32)
JSON_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "string": _json_string, "long": _LONG[0], "int": _INT[0], "double": _json_double,
    "float": _json_double, "boolean": _json_boolean, "timestamp": _json_timestamp,
    "date": _date, "binary": _binary,
}
TEXT_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "string": str, "long": _LONG[1], "int": _INT[1], "double": _text_double,
    "float": _text_double, "boolean": _text_boolean, "timestamp": _text_timestamp,
    "date": _date, "binary": _binary,
}
# Python types pyarrow converts exactly as the converters would, per field type (JSON).
_JSON_FAST_TYPES: dict[str, set[type]] = {
    "string": {str, type(None)}, "long": {int, type(None)}, "int": {int, type(None)},
    "double": {int, float, type(None)}, "float": {int, float, type(None)}, "boolean": {bool, type(None)},
}


# pyarrow's JSON reader does not read these the way headrace does (base64, ISO dates).
_JSON_SLOW_TYPES = ("date", "binary")
_JSON_DECODER = json.JSONDecoder()
_NULL_LINE = re.compile(rb"^[ \t\r]*null[ \t\r]*$", re.MULTILINE)


def _may_have_null_line(block: bytes) -> bool:
    """A quick test before the (slow) regex: does "null" end a line anywhere?"""
    return (b"null\n" in block or b"null\r" in block or b"null " in block or b"null\t" in block
            or block.rstrip().endswith(b"null"))
_JSON_NAMES = {list: "an array", str: "a string", int: "a number", float: "a number",
               bool: "a boolean", type(None): "null"}


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _convert_slow(name: str, type_name: str, values: list[Any], convert: Callable[[Any], Any],
                  errors: dict[int, str]) -> pa.Array:
    out: list[Any] = []
    append = out.append
    for row, value in enumerate(values):
        if value is None:
            append(None)
            continue
        try:
            append(convert(value))
        except _BadValue:
            append(None)
            errors.setdefault(row, f"field {name!r}: expected {EXPECTED.get(type_name, type_name)}, "
                                   f"got {_show(value)}")
    return pa.array(out, ARROW_TYPES[type_name])


def _json_column(name: str, type_name: str, values: list[Any], errors: dict[int, str]) -> pa.Array:
    fast = _JSON_FAST_TYPES.get(type_name)
    if fast is not None and set(map(type, values)) <= fast:
        try:
            return pa.array(values, ARROW_TYPES[type_name])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    return _convert_slow(name, type_name, values, JSON_CONVERTERS[type_name], errors)


def _text_column(name: str, type_name: str, text: pa.Array, errors: dict[int, str]) -> pa.Array:
    """Convert a column of CSV text (nulls for empty fields) to the field's type."""
    target = ARROW_TYPES[type_name]
    if type_name == "string":
        return text
    if type_name in ("long", "int", "double", "float"):
        pattern = r"^-?\d+$" if type_name in ("long", "int") else _FLOAT_TEXT.pattern
        if pc.all(pc.match_substring_regex(text, pattern), skip_nulls=True).as_py() is not False:
            try:
                return pc.cast(text, target)
            except (pa.ArrowInvalid, OverflowError):
                pass
    if type_name == "timestamp":
        converted = _text_timestamps(text)
        if converted is not None:
            return converted
    return _convert_slow(name, type_name, text.to_pylist(), TEXT_CONVERTERS[type_name], errors)


def _text_timestamps(text: pa.Array) -> pa.Array | None:
    """Vectorised timestamps from text: all epoch milliseconds, all ISO-8601 with a zone, or
    all ISO-8601 without one (UTC); None when the column mixes them or pyarrow refuses."""
    target = ARROW_TYPES["timestamp"]
    try:
        if pc.all(pc.match_substring_regex(text, r"^-?\d+$"), skip_nulls=True).as_py() is not False:
            millis = pc.cast(text, pa.int64())
            low, high = pc.min_max(millis).values()
            if low.is_valid and not (_MIN_US // 1000 <= low.as_py() and high.as_py() <= _MAX_US // 1000):
                return None
            return pc.multiply(millis, 1000).cast(target)
        try:
            return pc.cast(text, target)
        except pa.ArrowInvalid:
            return pc.cast(pc.cast(text, pa.timestamp("us")), target)
    except (pa.ArrowInvalid, OverflowError):
        return None


# ----------------------------------------------------------------------------------------
# Reading one file.

@dataclass
class _Dead:
    line: int
    raw: str
    error: str


class _FileReader:
    """Parses one file of a partition into record batches of the source's Arrow schema."""

    def __init__(self, options: dict[str, str], schema: Schema, path: str) -> None:
        self.schema = schema
        self.names = [name for name, _ in schema]
        self.path = path
        self.source = options.get("hr_source", "files")
        self.fail_fast = options.get("fail_fast", "false").lower() == "true"
        self.csv_header = options.get("csv_header", "true").lower() == "true"
        self.arrow = arrow_schema(schema, dead_letters=True)

    def fail(self, line: int, error: str, raw: str) -> SourceError:
        return SourceError(f"source {self.source!r}: {self.path}:{line}: {error}: {_show(raw[:200])}")

    def batches(self, columns: list[pa.Array], rows: int, errors: dict[int, str], dead: list[_Dead],
                row_line: Callable[[int], tuple[int, str]]) -> Iterator[pa.RecordBatch]:
        """Good rows (minus those with a bad value), then dead letters, as record batches."""
        for row, error in errors.items():
            line, raw = row_line(row)
            dead.append(_Dead(line, raw, error))
        if dead and self.fail_fast:
            first = min(dead, key=lambda d: d.line)
            raise self.fail(first.line, first.error, first.raw)
        if errors:
            keep = pa.array([row not in errors for row in range(rows)])
            columns = [pc.filter(column, keep) for column in columns]
            rows -= len(errors)
        if rows:
            nulls = [pa.nulls(rows, pa.int64()), *(pa.nulls(rows, pa.string()) for _ in DEAD_COLUMNS)]
            yield pa.RecordBatch.from_arrays([*columns, *nulls], schema=self.arrow)
        if dead:
            dead.sort(key=lambda d: d.line)
            count = len(dead)
            data = [pa.nulls(count, field.type) for field in self.arrow][:len(self.schema) + 1]
            yield pa.RecordBatch.from_arrays([
                *data,
                pa.array([d.raw for d in dead], pa.string()),
                pa.array([d.error for d in dead], pa.string()),
                pa.array([f"{self.path}:{d.line}" for d in dead], pa.string()),
            ], schema=self.arrow)

    # -- jsonl --------------------------------------------------------------------------

    def read_jsonl(self) -> Iterator[pa.RecordBatch]:
        """Blocks of whole lines: pyarrow's JSON reader first; a block it rejects (a bad line,
        a value pyarrow would not convert the way headrace does) is parsed line by line."""
        fast = all(type_name not in _JSON_SLOW_TYPES for _, type_name in self.schema)
        first_line = 1
        pending = b""
        with open(self.path, "rb") as handle:
            while True:
                data = handle.read(JSONL_BLOCK_BYTES)
                if first_line == 1 and not pending and data.startswith(b"\xef\xbb\xbf"):
                    data = data[3:]  # a UTF-8 byte order mark
                buffer = pending + data
                cut = len(buffer) if not data else buffer.rfind(b"\n") + 1
                block, pending = buffer[:cut], buffer[cut:]
                if block:
                    yield from self._jsonl_block(block, first_line, fast)
                    first_line += block.count(b"\n")
                if not data:
                    return

    def _jsonl_block(self, block: bytes, first_line: int, fast: bool) -> Iterator[pa.RecordBatch]:
        if fast:
            import pyarrow.json as pa_json

            table = None
            try:
                block.decode("utf-8")  # pyarrow would let invalid UTF-8 into string columns
                if _may_have_null_line(block) and _NULL_LINE.search(block):
                    # pyarrow reads a `null` line as a row of nulls (and may crash on it)
                    raise ValueError("a null line")
                table = pa_json.read_json(
                    io.BytesIO(block),
                    read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
                    parse_options=pa_json.ParseOptions(
                        explicit_schema=arrow_schema(self.schema, dead_letters=False).remove(len(self.schema)),
                        unexpected_field_behavior="ignore"))
            except (pa.ArrowException, ValueError):
                pass
            lines = block.count(b"\n") + (not block.endswith(b"\n"))
            if table is not None and table.num_rows != lines and \
                    table.num_rows != sum(1 for line in block.split(b"\n") if line.strip()):
                table = None  # pyarrow also reads several objects on a line, or one over several
            if table is not None:
                table = table.select(self.names)
                for batch in table.to_batches(max_chunksize=CHUNK_LINES):
                    rows = batch.num_rows
                    if rows:
                        nulls = [pa.nulls(rows, pa.int64()), *(pa.nulls(rows, pa.string()) for _ in DEAD_COLUMNS)]
                        yield pa.RecordBatch.from_arrays([*batch.columns, *nulls], schema=self.arrow)
                return
        chunk = [(first_line + k, line) for k, line in enumerate(block.split(b"\n")) if line.strip()]
        for start in range(0, len(chunk), CHUNK_LINES):
            yield from self._jsonl_chunk(chunk[start:start + CHUNK_LINES])

    def _jsonl_chunk(self, chunk: list[tuple[int, bytes]]) -> Iterator[pa.RecordBatch]:
        objects: list[dict[str, Any]] = []
        row_lines: list[tuple[int, bytes]] = []
        dead: list[_Dead] = []
        decode = _JSON_DECODER.decode
        for number, line in chunk:
            try:
                obj = decode(line.decode("utf-8"))
            except json.JSONDecodeError as exc:
                dead.append(_Dead(number, _text(line), f"invalid JSON ({exc.msg} at column {exc.colno})"))
                continue
            except UnicodeDecodeError as exc:
                dead.append(_Dead(number, _text(line), f"invalid UTF-8 ({exc.reason} at byte {exc.start + 1})"))
                continue
            if type(obj) is not dict:
                got = _JSON_NAMES.get(type(obj), "a value")
                dead.append(_Dead(number, _text(line), f"expected a JSON object, got {got}"))
                continue
            objects.append(obj)
            row_lines.append((number, line))
        errors: dict[int, str] = {}
        columns = [
            _json_column(name, type_name, [obj.get(name) for obj in objects], errors)
            for name, type_name in self.schema
        ]
        yield from self.batches(columns, len(objects), errors, dead,
                                lambda row: (row_lines[row][0], _text(row_lines[row][1])))

    # -- csv ----------------------------------------------------------------------------

    def read_csv(self) -> Iterator[pa.RecordBatch]:
        """pyarrow's CSV reader for a whole file first; a file it rejects (a bad row, a value
        that does not convert) is parsed again record by record."""
        batches = self._csv_fast()
        if batches is not None:
            yield from batches
            return
        with open(self.path, encoding="utf-8-sig", errors="replace", newline="") as handle:
            captured: list[str] = []

            def lines() -> Iterator[str]:
                for line in handle:
                    captured.append(line)
                    yield line

            reader = csv.reader(lines())
            positions: list[int] | None = None
            width = len(self.schema)
            chunk: list[tuple[int, str, list[str]]] = []
            dead: list[_Dead] = []
            consumed = 0
            for record in reader:
                first_line = consumed + 1
                consumed = reader.line_num
                raw = "".join(captured).rstrip("\r\n")
                captured.clear()
                if not record or (len(record) == 1 and not record[0].strip()):
                    continue
                if positions is None:
                    if self.csv_header:
                        positions = self._header_positions(record, first_line)
                        width = len(record)
                        continue
                    positions = list(range(len(self.schema)))
                if len(record) != width:
                    dead.append(_Dead(first_line, raw, f"expected {width} fields, got {len(record)}"))
                    if self.fail_fast:
                        break
                    continue
                chunk.append((first_line, raw, record))
                if len(chunk) + len(dead) >= CHUNK_LINES:
                    yield from self._csv_chunk(chunk, positions, dead)
                    chunk, dead = [], []
            if chunk or dead:
                yield from self._csv_chunk(chunk, positions or [], dead)

    def _csv_fast(self) -> list[pa.RecordBatch] | None:
        import pyarrow.csv as pa_csv

        if os.path.getsize(self.path) > CSV_FAST_MAX_BYTES:
            return None
        names = None if self.csv_header else self.names
        try:
            table = pa_csv.read_csv(
                self.path,
                read_options=pa_csv.ReadOptions(use_threads=False, column_names=names),
                parse_options=pa_csv.ParseOptions(newlines_in_values=True),
                convert_options=pa_csv.ConvertOptions(
                    column_types={name: pa.string() for name in self.names}, include_columns=self.names,
                    null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=True))
        except (pa.ArrowException, ValueError, KeyError):
            return None
        errors: dict[int, str] = {}
        columns = [_text_column(name, type_name, table.column(name).combine_chunks(), errors)
                   for name, type_name in self.schema]
        if errors:
            return None
        rows = table.num_rows
        nulls = [pa.nulls(rows, pa.int64()), *(pa.nulls(rows, pa.string()) for _ in DEAD_COLUMNS)]
        whole = pa.Table.from_arrays([*columns, *nulls], schema=self.arrow)
        return whole.to_batches(max_chunksize=CHUNK_LINES)

    def _header_positions(self, header: list[str], line: int) -> list[int]:
        names = [h.strip() for h in header]
        missing = [name for name in self.names if name not in names]
        if missing:
            raise SourceError(
                f"source {self.source!r}: {self.path}:{line}: the CSV header lacks the column(s) "
                f"{', '.join(map(repr, missing))}; the header has {', '.join(map(repr, names))} and the "
                "schema expects " + ", ".join(map(repr, self.names)) +
                " (pass csv_header=False if the file has no header)")
        return [names.index(name) for name in self.names]

    def _csv_chunk(self, chunk: list[tuple[int, str, list[str]]], positions: list[int],
                   dead: list[_Dead]) -> Iterator[pa.RecordBatch]:
        errors: dict[int, str] = {}
        columns = []
        for (name, type_name), position in zip(self.schema, positions):
            values = pa.array([record[position] or None for _, _, record in chunk], pa.string())
            columns.append(_text_column(name, type_name, values, errors))
        yield from self.batches(columns, len(chunk), errors, dead, lambda row: (chunk[row][0], chunk[row][1]))

    # -- parquet ------------------------------------------------------------------------

    def read_parquet(self) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        arrow = arrow_schema(self.schema, dead_letters=False)
        parquet = pq.ParquetFile(self.path)
        present = set(parquet.schema_arrow.names)
        wanted = [name for name in self.names if name in present]
        for batch in parquet.iter_batches(batch_size=CHUNK_LINES, columns=wanted):
            arrays = []
            for field in arrow:
                if field.name == CONTROL_COLUMN:
                    arrays.append(pa.nulls(batch.num_rows, pa.int64()))
                elif field.name not in present:
                    arrays.append(pa.nulls(batch.num_rows, field.type))
                else:
                    column = batch.column(field.name)
                    try:
                        arrays.append(pc.cast(column, options=pc.CastOptions(
                            field.type, allow_time_truncate=True)))
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                        raise SourceError(
                            f"source {self.source!r}: {self.path}: column {field.name!r} of type "
                            f"{column.type} cannot be read as {field.type}: {exc}") from None
            yield pa.RecordBatch.from_arrays(arrays, schema=arrow)


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r\n")


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
        self._marked = False

    def initialOffset(self) -> dict:
        return {"files": []}

    def _exhausted(self) -> None:
        if not self._marked:
            mark_exhausted(self.options)
            self._marked = True

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        if start.get("flushed"):
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
        new = sorted(set(names) - set(seen))
        if self.bounded:
            self._exhausted()
            return {"files": sorted(seen + new), "flushed": True}
        if not new:
            return start
        return {"files": sorted(seen + new)}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        seen = set(start["files"])
        parts: list[InputPartition] = [
            FilePartition(os.path.join(self.path, name)) for name in end["files"] if name not in seen
        ]
        if end.get("flushed") and not start.get("flushed"):
            parts.append(FilePartition(None))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        if partition.path is None:
            yield flush_batch(arrow_schema(self.schema, self.dead_letters))
            return
        reader = _FileReader(self.options, self.schema, partition.path)
        if self.format == "jsonl":
            yield from reader.read_jsonl()
        elif self.format == "csv":
            yield from reader.read_csv()
        else:
            yield from reader.read_parquet()

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
    ``csv_header``: the first CSV row names the columns. Exactly-once while the
    files are kept unchanged.
    """

    path: str
    format: str
    data_schema: Schema | None
    bounded_input: bool
    fail_fast: bool
    csv_header: bool

    guarantee = Guarantee.EXACTLY_ONCE

    def __init__(self, path: str, format: str = "jsonl", schema: Any = None, *, bounded: bool = False,
                 fail_fast: bool = False, csv_header: bool = True) -> None:
        where = f"FileSource({path!r})"
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

    @property
    def bounded(self) -> bool:
        return self.bounded_input

    @property
    def emits_dead_letters(self) -> bool:  # type: ignore[override]
        return self.format != "parquet"

    def schema(self) -> Schema:
        if self.data_schema is not None:
            return self.data_schema
        cached = self.__dict__.get("_inferred")
        if cached is None:
            cached = self._infer_parquet_schema()
            object.__setattr__(self, "_inferred", cached)
        return cached

    def _infer_parquet_schema(self) -> Schema:
        import pyarrow.parquet as pq

        where = f"FileSource({self.path!r})"
        try:
            names = [n for n in list_files(self.path) if n.endswith(".parquet")] or list_files(self.path)
        except OSError as exc:
            raise PlanError(f"{where}: cannot list the directory to read a Parquet schema ({exc}); "
                            "create it or pass schema=") from None
        if not names:
            raise PlanError(f"{where}: no file to read a Parquet schema from; pass schema=")
        arrow = pq.read_schema(os.path.join(self.path, names[0]))
        return tuple((f.name, _spark_type_of_arrow(f.name, f.type, where)) for f in arrow)

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
        }

    def offset_identity(self) -> dict[str, Any]:
        """The offset lists file names: the directory, and how a file becomes records (format,
        schema, CSV header), fix what it means. ``fail_fast`` does not."""
        return {"path": self.path, "format": self.format, "schema": ", ".join(f"{n} {t}" for n, t in self.schema()),
                "csv_header": self.csv_header}

    def describe(self) -> dict[str, Any]:
        return {
            "type": "FileSource", "path": self.path, "format": self.format,
            "schema": to_ddl(self.data_schema) if self.data_schema else None,
            "bounded": self.bounded, "fail_fast": self.fail_fast, "csv_header": self.csv_header,
            "guarantee": self.guarantee.value, "dead_letters": self.emits_dead_letters,
        }

    def prepare(self, context: SourceContext) -> None:
        if not os.path.isdir(self.path):
            raise SourceError(f"source {context.source_name!r}: the directory "
                              f"{self.path!r} does not exist; create it before starting the pipeline")

