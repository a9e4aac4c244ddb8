"""CSV: one record per row (quoted fields may span lines).

With ``csv_header`` the first row names the columns (in any order, extra columns ignored; a
header that lacks a schema column is an error), else columns are positional. An empty field
is null; booleans are ``true``/``false`` or ``1``/``0``. Empty lines are skipped; a row with
the wrong number of fields is a dead letter. pyarrow's CSV reader reads a whole file first;
a file it rejects (a bad row, a value that does not convert) is parsed again record by record.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace.connectors.file_formats.reader import CHUNK_LINES, DeadLine, FileReader
from headrace.connectors.file_formats.values import (
    MAX_US,
    MIN_US,
    BadValue,
    binary_value,
    convert_values,
    date_value,
    epoch_ms_us,
    iso_us,
    text_int,
    text_long,
)
from headrace.contract import DEAD_COLUMNS
from headrace.errors import SourceError
from headrace.schema import Schema, arrow_type

CSV_FAST_MAX_BYTES = 256 << 20  # larger CSV files are parsed record by record

_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_NUMBER_TEXT = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")


def _text_double(text: str) -> float:
    if "_" in text:
        raise BadValue
    try:
        return float(text)
    except ValueError:
        raise BadValue from None


def _text_boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise BadValue


def _text_timestamp(text: str) -> int:
    if _NUMBER_TEXT.match(text):
        return epoch_ms_us(float(text) if any(c in text for c in ".eE") else int(text))
    return iso_us(text)


TEXT_CONVERTERS: dict[str, Callable[[str], Any]] = {
    "string": str, "long": text_long, "int": text_int, "double": _text_double,
    "float": _text_double, "boolean": _text_boolean, "timestamp": _text_timestamp,
    "date": date_value, "binary": binary_value,
}


def _text_column(name: str, type_name: str, text: pa.Array, errors: dict[int, str]) -> pa.Array:
    """Convert a column of CSV text (nulls for empty fields) to the field's type."""
    target = arrow_type(type_name)
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
    return convert_values(name, type_name, text.to_pylist(), TEXT_CONVERTERS[type_name], errors)


def _text_timestamps(text: pa.Array) -> pa.Array | None:
    """Vectorised timestamps from text: all epoch milliseconds, all ISO-8601 with a zone, or
    all ISO-8601 without one (UTC); None when the column mixes them or pyarrow refuses."""
    target = arrow_type("timestamp")
    try:
        if pc.all(pc.match_substring_regex(text, r"^-?\d+$"), skip_nulls=True).as_py() is not False:
            millis = pc.cast(text, pa.int64())
            low, high = pc.min_max(millis).values()
            if low.is_valid and not (MIN_US // 1000 <= low.as_py() and high.as_py() <= MAX_US // 1000):
                return None
            return pc.multiply(millis, 1000).cast(target)
        try:
            return pc.cast(text, target)
        except pa.ArrowInvalid:
            return pc.cast(pc.cast(text, pa.timestamp("us")), target)
    except (pa.ArrowInvalid, OverflowError):
        return None


class CsvReader(FileReader):
    def __init__(self, options: dict[str, str], schema: Schema, path: str) -> None:
        super().__init__(options, schema, path)
        self.csv_header = options.get("csv_header", "true").lower() == "true"

    def read(self) -> Iterator[pa.RecordBatch]:
        """pyarrow's CSV reader for a whole file first; a file it rejects (a bad row, a value
        that does not convert) is parsed again record by record."""
        batches = self._fast()
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
            dead: list[DeadLine] = []
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
                    dead.append(DeadLine(first_line, raw, f"expected {width} fields, got {len(record)}"))
                    if self.fail_fast:
                        break
                    continue
                chunk.append((first_line, raw, record))
                if len(chunk) + len(dead) >= CHUNK_LINES:
                    yield from self._chunk(chunk, positions, dead)
                    chunk, dead = [], []
            if chunk or dead:
                yield from self._chunk(chunk, positions or [], dead)

    def _fast(self) -> list[pa.RecordBatch] | None:
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

    def _chunk(self, chunk: list[tuple[int, str, list[str]]], positions: list[int],
               dead: list[DeadLine]) -> Iterator[pa.RecordBatch]:
        errors: dict[int, str] = {}
        columns = []
        for (name, type_name), position in zip(self.schema, positions):
            values = pa.array([record[position] or None for _, _, record in chunk], pa.string())
            columns.append(_text_column(name, type_name, values, errors))
        yield from self.batches(columns, len(chunk), errors, dead, lambda row: (chunk[row][0], chunk[row][1]))
