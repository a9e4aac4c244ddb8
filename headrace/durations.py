"""Durations given as ``"10s"``, ``"500ms"``, ``"2m"``, ``"1h"``, a timedelta or integer milliseconds."""

from __future__ import annotations

import datetime
import re

from headrace.errors import PlanError

_UNITS_MS = {"ms": 1, "s": 1000, "sec": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}
_PATTERN = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


def to_millis(value: object, what: str) -> int:
    """Milliseconds in ``value``; ``what`` names the argument in the error message."""
    if isinstance(value, bool):
        raise PlanError(f"{what}: expected a duration such as '10s', got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, str):
        match = _PATTERN.match(value.lower())
        if match and match.group(2) in _UNITS_MS:
            return int(float(match.group(1)) * _UNITS_MS[match.group(2)])
    raise PlanError(f"{what}: cannot read {value!r} as a duration; write e.g. '500ms', '10s', '5m', "
                    "a datetime.timedelta or an integer number of milliseconds")


def describe_millis(ms: int) -> str:
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
