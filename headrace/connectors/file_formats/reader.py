"""What every format's reader shares: the source's Arrow schema, and how parsed columns and
dead-letter rows become record batches.

A line that does not parse, or a value that does not fit its field's type, becomes a
dead-letter row: data columns null, ``_hr_dead_raw`` the line, ``_hr_dead_error`` the
problem, ``_hr_dead_position`` ``<file>:<line>`` (1-based). With ``fail_fast`` the reader
raises ``SourceError`` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from headrace.connectors.file_formats.values import show
from headrace.contract import CONTROL_COLUMN, DEAD_COLUMNS
from headrace.errors import SourceError
from headrace.schema import Schema, arrow_schema

CHUNK_LINES = 65_536  # lines parsed per Arrow record batch


def batch_schema(schema: Schema, dead_letters: bool) -> pa.Schema:
    """The Arrow schema a source's ``read`` yields: data columns, ``_hr_ctl``, dead-letter columns."""
    fields = [*arrow_schema(schema), pa.field(CONTROL_COLUMN, pa.int64())]
    if dead_letters:
        fields.extend(pa.field(name, pa.string()) for name in DEAD_COLUMNS)
    return pa.schema(fields)


@dataclass
class DeadLine:
    line: int
    raw: str
    error: str


class FileReader:
    """Parses one file of a partition into record batches of the source's Arrow schema."""

    def __init__(self, options: dict[str, str], schema: Schema, path: str) -> None:
        self.schema = schema
        self.names = [name for name, _ in schema]
        self.path = path
        self.source = options.get("hr_source", "files")
        self.fail_fast = options.get("fail_fast", "false").lower() == "true"
        self.arrow = batch_schema(schema, dead_letters=True)

    def read(self) -> Iterator[pa.RecordBatch]:
        raise NotImplementedError

    def fail(self, line: int, error: str, raw: str) -> SourceError:
        return SourceError(f"source {self.source!r}: {self.path}:{line}: {error}: {show(raw[:200])}")

    def batches(self, columns: list[pa.Array], rows: int, errors: dict[int, str], dead: list[DeadLine],
                row_line: Callable[[int], tuple[int, str]]) -> Iterator[pa.RecordBatch]:
        """Good rows (minus those with a bad value), then dead letters, as record batches."""
        for row, error in errors.items():
            line, raw = row_line(row)
            dead.append(DeadLine(line, raw, error))
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
