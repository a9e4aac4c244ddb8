"""Records as the local runner carries them: dicts of plain Python values of the plan's types,
as a TestSink gives them back (a timestamp a timezone-aware UTC datetime, a double a float)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from typing import Any

from headrace.plan.nodes import RESULT_TIME
from headrace.schema import Schema

Row = dict[str, Any]
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def to_millis(moment: datetime.datetime) -> int:
    """Epoch milliseconds, rounded down (Spark's ``unix_millis``)."""
    delta = moment - EPOCH if moment.tzinfo else moment - EPOCH.replace(tzinfo=None)
    return (delta.days * 86_400_000_000 + delta.seconds * 1_000_000 + delta.microseconds) // 1000


def from_millis(ms: float | None) -> datetime.datetime | None:
    if ms is None or ms in (math.inf, -math.inf):
        return None
    return EPOCH + datetime.timedelta(milliseconds=ms)


def event_millis(value: Any) -> int | None:
    """An event-time field's value in epoch milliseconds (a timestamp, or a number of ms)."""
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        return to_millis(value)
    return int(value)


def conform(value: Any, type_name: str) -> Any:
    """``value`` as a column of ``type_name`` holds it."""
    if value is None:
        return None
    if type_name == "timestamp":
        if isinstance(value, datetime.datetime):
            return value.replace(tzinfo=datetime.UTC) if value.tzinfo is None else value.astimezone(datetime.UTC)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return from_millis(value)
    if type_name in ("double", "float") and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def conform_row(row: Mapping[str, Any], schema: Schema | None) -> Row:
    """``row`` with exactly the schema's fields, in its order (a missing field is null)."""
    if schema is None:
        return dict(row)
    shaped = {name: conform(row.get(name), kind) for name, kind in schema}
    if RESULT_TIME in row:
        shaped[RESULT_TIME] = row[RESULT_TIME]
    return shaped


def visible(row: Row) -> Row:
    """The row without the hidden event time of a stateful step's results."""
    if RESULT_TIME not in row:
        return row
    return {k: v for k, v in row.items() if k != RESULT_TIME}
