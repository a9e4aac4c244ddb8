"""JSON lines: one JSON object per line.

Missing fields and JSON nulls are null; numbers, booleans, objects and arrays given for a
string field are kept as their JSON text; integral floats (``3.0``) are accepted for integer
fields. Empty lines are skipped. Blocks of whole lines go through pyarrow's JSON reader first;
a block it rejects (a bad line, a value pyarrow would not convert the way headrace does) is
parsed line by line.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from headrace.connectors.file_formats.reader import CHUNK_LINES, DeadLine, FileReader
from headrace.connectors.file_formats.values import (
    BadValue,
    binary_value,
    convert_values,
    date_value,
    epoch_ms_us,
    iso_us,
    json_int,
    json_long,
)
from headrace.contract import DEAD_COLUMNS
from headrace.schema import arrow_schema, arrow_type

JSONL_BLOCK_BYTES = 8 << 20  # bytes of whole lines handed to pyarrow's JSON reader at a time


def _json_double(value: Any) -> float:
    if type(value) not in (int, float):
        raise BadValue
    return float(value)


def _json_boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise BadValue
    return value


def _json_timestamp(value: Any) -> int:
    if type(value) is str:
        return iso_us(value)
    if type(value) in (int, float):
        return epoch_ms_us(value)
    raise BadValue


def _json_string(value: Any) -> str:
    return value if type(value) is str else json.dumps(value)


JSON_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "string": _json_string, "long": json_long, "int": json_int, "double": _json_double,
    "float": _json_double, "boolean": _json_boolean, "timestamp": _json_timestamp,
    "date": date_value, "binary": binary_value,
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


def _json_column(name: str, type_name: str, values: list[Any], errors: dict[int, str]) -> pa.Array:
    fast = _JSON_FAST_TYPES.get(type_name)
    if fast is not None and set(map(type, values)) <= fast:
        try:
            return pa.array(values, arrow_type(type_name))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    return convert_values(name, type_name, values, JSON_CONVERTERS[type_name], errors)


def _text(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r\n")


class JsonLinesReader(FileReader):
    def read(self) -> Iterator[pa.RecordBatch]:
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
                    yield from self._block(block, first_line, fast)
                    first_line += block.count(b"\n")
                if not data:
                    return

    def _block(self, block: bytes, first_line: int, fast: bool) -> Iterator[pa.RecordBatch]:
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
                        explicit_schema=arrow_schema(self.schema),
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
            yield from self._chunk(chunk[start:start + CHUNK_LINES])

    def _chunk(self, chunk: list[tuple[int, bytes]]) -> Iterator[pa.RecordBatch]:
        objects: list[dict[str, Any]] = []
        row_lines: list[tuple[int, bytes]] = []
        dead: list[DeadLine] = []
        decode = _JSON_DECODER.decode
        for number, line in chunk:
            try:
                obj = decode(line.decode("utf-8"))
            except json.JSONDecodeError as exc:
                dead.append(DeadLine(number, _text(line), f"invalid JSON ({exc.msg} at column {exc.colno})"))
                continue
            except UnicodeDecodeError as exc:
                dead.append(DeadLine(number, _text(line), f"invalid UTF-8 ({exc.reason} at byte {exc.start + 1})"))
                continue
            if type(obj) is not dict:
                got = _JSON_NAMES.get(type(obj), "a value")
                dead.append(DeadLine(number, _text(line), f"expected a JSON object, got {got}"))
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
