"""Value conversion shared by the text formats (JSON lines, CSV).

A converter turns one non-null value into what pyarrow expects for the field's type, or
raises :class:`BadValue`; :func:`convert_values` turns a column of values with one and
records, per row, what was expected. Timestamps are ISO-8601 text (no zone means UTC) or
epoch milliseconds, dates ISO-8601 text, binary base64 text.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pyarrow as pa

from headrace.schema import arrow_type


class BadValue(Exception):
    pass


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
MIN_US = -62_135_596_800_000_000  # 0001-01-01
MAX_US = 253_402_300_799_999_999  # 9999-12-31 23:59:59.999999
_INT_TEXT = re.compile(r"^\s*[+-]?\d+\s*$")

EXPECTED = {
    "timestamp": "timestamp (ISO-8601 text or epoch milliseconds)",
    "date": "date (ISO-8601 text)",
    "binary": "binary (base64 text)",
}


def iso_us(text: str) -> int:
    """Microseconds since the epoch of ISO-8601 text (no zone means UTC)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadValue from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // _ONE_US


def epoch_ms_us(value: float) -> int:
    """Microseconds of ``value`` epoch milliseconds, within the years 1 to 9999."""
    micros = round(value * 1000)
    if not MIN_US <= micros <= MAX_US:
        raise BadValue
    return micros


def _integer(bits: int) -> tuple[Callable[[Any], Any], Callable[[str], Any]]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def from_json(value: Any) -> int:
        if type(value) is float and value.is_integer():
            value = int(value)
        if type(value) is not int or not low <= value <= high:
            raise BadValue
        return value

    def from_text(text: str) -> int:
        if not _INT_TEXT.match(text):
            raise BadValue
        return from_json(int(text))

    return from_json, from_text


json_long, text_long = _integer(64)
json_int, text_int = _integer(32)


def date_value(value: Any) -> date:
    if type(value) is not str:
        raise BadValue
    try:
        return date.fromisoformat(value.strip())
    except ValueError:
        raise BadValue from None


def binary_value(value: Any) -> bytes:
    if type(value) is not str:
        raise BadValue
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadValue from None


def show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def convert_values(name: str, type_name: str, values: list[Any], convert: Callable[[Any], Any],
                   errors: dict[int, str]) -> pa.Array:
    """The column of ``values`` converted one by one; a value that does not convert is null and
    its row's error is recorded in ``errors``."""
    out: list[Any] = []
    append = out.append
    for row, value in enumerate(values):
        if value is None:
            append(None)
            continue
        try:
            append(convert(value))
        except BadValue:
            append(None)
            errors.setdefault(row, f"field {name!r}: expected {EXPECTED.get(type_name, type_name)}, "
                                   f"got {show(value)}")
    return pa.array(out, arrow_type(type_name))
