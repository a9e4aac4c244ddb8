"""A sink that prints each micro-batch to standard output, for development."""

from __future__ import annotations

import datetime
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

from headrace.contract import Guarantee, SinkConnector
from headrace.errors import PlanError

DEFAULT_WIDTH = 20


class Console(SinkConnector):
    """Print each batch: a header with the batch id, then up to ``limit`` rows as a table.

    ``limit`` is the number of rows shown per batch (``None`` shows them all);
    ``truncate`` cuts long cell values: ``False`` keeps them whole, ``True``
    cuts them at 20 characters, a number cuts them at that many. A batch Spark
    replays after a failure is printed again, so the guarantee is at-least-once.

    Output for a batch of two rows::

        --- batch 0 ---
        +----+---+
        |word|n  |
        +----+---+
        |a   |1  |
        |b   |2  |
        +----+---+
    """

    guarantee = Guarantee.AT_LEAST_ONCE
    native_format = None

    def __init__(self, limit: int | None = 20, truncate: bool | int = False, *, out: IO[str] | None = None):
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise PlanError(f"Console sink: limit must be a whole number >= 0 or None, got {limit!r}")
        if not isinstance(truncate, (bool, int)) or (not isinstance(truncate, bool) and truncate < 1):
            raise PlanError(f"Console sink: truncate must be True, False or a width >= 1, got {truncate!r}")
        self.limit = limit
        self.truncate = truncate
        self._out = out

    def write_batch(self, df: Any, batch_id: int) -> None:
        # Not df.limit(): it stops reading early, and Spark commits a batch's state only when the
        # batch is read to its end. Every partition is read; each sends at most limit + 1 rows here.
        sample = df if self.limit is None else df.mapInArrow(_first_rows(self.limit + 1), df.schema)
        table = sample.toArrow()
        rows = [[row[name] for name in table.column_names] for row in table.to_pylist()]
        more = self.limit is not None and len(rows) > self.limit
        if more:
            rows = rows[: self.limit]
        text = format_batch(batch_id, list(df.columns), rows, self._width(), more)
        print(text, file=self._out or sys.stdout, flush=True)

    def _width(self) -> int | None:
        if self.truncate is True:
            return DEFAULT_WIDTH
        if self.truncate is False:
            return None
        return int(self.truncate)

    def describe(self) -> dict[str, Any]:
        return {"type": "Console", "limit": self.limit, "truncate": self.truncate}

    def __repr__(self) -> str:
        return f"Console(limit={self.limit!r}, truncate={self.truncate!r})"


def _first_rows(count: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A ``mapInArrow`` function that reads its whole partition and passes on its first ``count`` rows."""
    def first(batches: Iterator[Any]) -> Iterator[Any]:
        kept = 0
        for batch in batches:  # read to the end, keep the head
            if kept < count:
                head = batch.slice(0, count - kept)
                kept += head.num_rows
                yield head
    return first


def format_value(value: Any, width: int | None) -> str:
    """One cell as text: ``null`` for None, ISO format for times, cut to ``width`` characters."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (datetime.datetime, datetime.date)):
        text = value.isoformat(sep=" ") if isinstance(value, datetime.datetime) else value.isoformat()
    elif isinstance(value, (bytes, bytearray)):
        text = "0x" + bytes(value).hex()
    else:
        text = str(value)
    text = text.replace("\n", "\\n")
    if width is not None and len(text) > width:
        text = text[: max(width - 3, 0)] + "..." if width > 3 else text[:width]
    return text


def format_batch(batch_id: int, columns: list[str], rows: list[list[Any]], width: int | None = None,
                 more: bool = False) -> str:
    """The text the console sink prints for one batch.

    >>> print(format_batch(3, ["word", "n"], [["a", 1], [None, 22]]))
    --- batch 3 ---
    +----+---+
    |word|n  |
    +----+---+
    |a   |1  |
    |null|22 |
    +----+---+
    """
    header = f"--- batch {batch_id} ---"
    if not columns:
        return f"{header}\n({len(rows)} rows without columns)"
    cells = [[format_value(value, width) for value in row] for row in rows]
    sizes = [max([len(name), 3, *(len(row[i]) for row in cells)]) for i, name in enumerate(columns)]
    rule = "+" + "+".join("-" * size for size in sizes) + "+"

    def line(values: list[str]) -> str:
        return "|" + "|".join(value.ljust(size) for value, size in zip(values, sizes)) + "|"

    lines = [header, rule, line(columns), rule, *(line(row) for row in cells), rule]
    if not rows:
        lines.append("(no rows)")
    elif more:
        lines.append(f"only showing the first {len(rows)} rows")
    return "\n".join(lines)
