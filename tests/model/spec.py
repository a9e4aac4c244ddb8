"""A random pipeline as plain data: its input, its steps and its sinks.

One spec is read twice: by ``build`` (a headrace pipeline) and by ``interpreter`` (the model).
Every event has the fields ``key`` (string or null), ``value`` (long or null) and ``ts`` (event
time, epoch milliseconds). Each micro-batch is one JSON-lines file; a ``BadLine`` is a line the
source cannot parse, a dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SOURCE = "events"
SECOND_SOURCE = "more"
EVENT_SCHEMA = {"key": "string", "value": "long", "ts": "long"}


@dataclass(frozen=True)
class Event:
    key: str | None
    value: int | None
    ts: int

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "ts": self.ts}


@dataclass(frozen=True)
class BadLine:
    raw: str


Line = Event | BadLine

# -- stateless steps --------------------------------------------------------------------------


@dataclass(frozen=True)
class NativeFilter:
    """``filter(hr.col("value") > above)``: SQL's rule, a null value does not pass."""

    above: int


@dataclass(frozen=True)
class PythonFilter:
    """``filter(fn)``: drops the values divisible by ``modulo``; a null value passes."""

    modulo: int

    def __call__(self, record: dict[str, Any]) -> bool:
        return record["value"] is None or record["value"] % self.modulo != 0


@dataclass(frozen=True)
class PythonMap:
    """``map(fn)``: adds ``add`` to the value (null stays null) and upper-cases key ``b``."""

    add: int

    def __call__(self, record: dict[str, Any]) -> dict[str, Any]:
        value = None if record["value"] is None else record["value"] + self.add
        key = "B" if record["key"] == "b" else record["key"]
        return {"key": key, "value": value, "ts": record["ts"]}


@dataclass(frozen=True)
class WithColumns:
    """``with_columns(value=hr.col("value") * times)``."""

    times: int


@dataclass(frozen=True)
class SqlStep:
    """``p.sql("SELECT key, value + add AS value, ts FROM <the stream so far>")``."""

    add: int


WEIGHTS = {"a": 2, "b": 3}  # the table of a TableJoin: key -> weight


@dataclass(frozen=True)
class TableJoin:
    """``join(table, on="key", how=how)`` with the table WEIGHTS, then ``value * weight`` and
    ``select("key", "value", "ts")``: an inner join drops keys not in the table (null included), a
    left join keeps them with a null weight."""

    how: str


Stateless = NativeFilter | PythonFilter | PythonMap | WithColumns | SqlStep | TableJoin

# -- stateful steps ---------------------------------------------------------------------------

AGGREGATES = ("count", "sum", "min", "max")
AGGREGATE_NAMES = {"count": "n", "sum": "total", "min": "low", "max": "high"}


@dataclass(frozen=True)
class Tumbling:
    size: int


@dataclass(frozen=True)
class Sliding:
    size: int
    slide: int


@dataclass(frozen=True)
class Session:
    gap: int


Shape = Tumbling | Sliding | Session


@dataclass(frozen=True)
class SecondWindow:
    """A window over a window's results (each at its window's end - 1 µs), keyed as the first:
    ``window(Tumbling(size)).aggregate(sum_n=hr.sum("n"), windows=hr.count())``."""

    size: int


@dataclass(frozen=True)
class Window:
    """``[key_by("key").]window(shape).aggregate(...)`` with ``emit="final"``, then maybe a second
    window over its results (the first then counts: ``n``)."""

    shape: Shape
    keyed: bool
    aggregates: tuple[str, ...]
    then: SecondWindow | None = None
    lateness: int = 0                         # allowed_lateness, ms
    early: int | None = None                  # trigger=hr.AfterWatermark(early=hr.EveryN(early))
    accumulating: bool = True                 # accumulation="accumulating" or "discarding"

    @property
    def panes(self) -> bool:
        """Whether the output has ``pane_kind`` and ``pane_index`` (docs/windows.md)."""
        return bool(self.lateness or self.early or not self.accumulating)


@dataclass(frozen=True)
class Rolling:
    """``key_by("key").aggregate(...)``: running aggregates, Spark's update mode."""

    aggregates: tuple[str, ...]


@dataclass(frozen=True)
class Tally:
    """``key_by("key").process(...)``: per key, the records seen so far (value state); each record
    emits ``{key, kind: "record", n, at: its time}`` and sets an event-time timer ``after`` ms
    later, whose firing emits ``{key, kind: "timer", n, at: the timer's time}``."""

    after: int


@dataclass(frozen=True)
class SqlWindow:
    """``p.sql("SELECT window, key, count(*) AS n, sum(value) AS total FROM <stream> GROUP BY
    window(ts, '<size> seconds'), key")``: Spark's tumbling window, flattened to window_start and
    window_end (docs/sql.md)."""

    seconds: int


PROCESS_SCHEMA = {"key": "string", "kind": "string", "n": "long", "at": "long"}

Stateful = Window | Rolling | Tally | SqlWindow

@dataclass(frozen=True)
class Union:
    """A second source (``more``, its own files and out-of-orderness, event time ``ts``) united with
    the stream after the stateless steps, before the stateful step."""

    batches: tuple[tuple[Line, ...], ...]
    delay: int


# -- the whole pipeline -----------------------------------------------------------------------

SINK_KINDS = ("test", "files")


@dataclass(frozen=True)
class Spec:
    batches: tuple[tuple[Line, ...], ...]
    delay: int                                # max out-of-orderness, ms
    steps: tuple[Stateless, ...]
    stateful: Stateful | None
    sinks: tuple[str, ...]                    # the kinds of the final stream's sinks
    tap: str | None = None                    # a sink of the stateless stream, before the stateful step
    dead_letters: str | None = None           # a sink of the dead letters
    union: Union | None = None

    def sink_kinds(self) -> dict[str, str]:
        """Each sink's name and kind."""
        named = {f"out_{n}": kind for n, kind in enumerate(self.sinks)}
        if self.tap:
            named["tap"] = self.tap
        if self.dead_letters:
            named["dead"] = self.dead_letters
        return named


def file_name(batch: int) -> str:
    return f"part-{batch:03d}.jsonl"
