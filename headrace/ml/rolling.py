"""Rolling features per key over a span of event time (``keyed.rolling``): for each record, the
aggregates of the key's records whose event time lies in ``(t - span, t]``, ``t`` the record's,
as a range window over the key's records ordered by time computes them on the whole input.

A record waits in the key's state until the watermark passes its time (an event-time timer at
its time), so that every record of the key up to that time is there: then the records due are
taken in time order, and each is emitted with its features. Records with the same time are
counted in each other's features (they are peers in the range). The key keeps the values of its
records while the watermark is within ``span`` of them, and drops them after. The same code
runs on a bounded input (the end of the input fires every timer) and an unbounded one, so both
give the same values. A record that arrives at or behind the watermark is late: it is emitted
at once with the features of what the key holds, and the records emitted before it do not count
it.
"""

from __future__ import annotations

from typing import Any

from headrace.aggregates import Agg
from headrace.process import Context, KeyedProcessFunction, Timer
from headrace.state import ListState


class RollingFeatures(KeyedProcessFunction):
    """The process function behind ``keyed.rolling`` (docs/ml.md)."""

    pending = ListState()  # (time, record) not emitted yet
    kept = ListState()  # (time, the values the features read) of the key's records still within reach

    def __init__(self, span_ms: int, features: dict[str, Agg]) -> None:
        self.span_ms, self.features = span_ms, features
        self.columns = sorted({agg.column for agg in features.values() if agg.column})

    def process(self, record: dict[str, Any], ctx: Context) -> None:
        time = ctx.timestamp
        assert time is not None  # keyed.rolling needs event time
        values = tuple(record.get(c) for c in self.columns)
        if ctx.watermark is not None and time <= ctx.watermark:  # late: at once
            self.kept.append((time, values))
            self._emit(time, record, ctx)
            return
        self.pending.append((time, record))
        ctx.register_event_time_timer(time)

    def on_timer(self, timer: Timer, ctx: Context) -> None:
        waiting = self.pending.get()
        due = sorted((entry for entry in waiting if entry[0] <= timer.time), key=lambda entry: entry[0])
        if not due:
            return
        later = [entry for entry in waiting if entry[0] > timer.time]
        self.pending.set(later)
        for time, record in due:  # first all, so that records of the same time count each other
            self.kept.append((time, tuple(record.get(c) for c in self.columns)))
        for time, record in due:
            self._emit(time, record, ctx)
        # what a record still to come can reach: one waiting, or one after the watermark
        earliest = min([time for time, _ in later] + [max(timer.time, ctx.watermark or timer.time)])
        self.kept.set([entry for entry in self.kept.get() if entry[0] > earliest - self.span_ms])

    def _emit(self, time: int, record: dict[str, Any], ctx: Context) -> None:
        window = [values for at, values in self.kept.get() if time - self.span_ms < at <= time]
        ctx.emit({**record, **{name: self._aggregate(agg, window) for name, agg in self.features.items()}},
                 timestamp=time)

    def _aggregate(self, agg: Agg, window: list[tuple[Any, ...]]) -> Any:
        if agg.func == "count":
            return len(window)
        index = self.columns.index(agg.column)  # type: ignore[arg-type]
        values = [v[index] for v in window if v[index] is not None]
        if not values:
            return None
        if agg.func == "sum":
            return sum(values)
        if agg.func == "mean":
            return sum(values) / len(values)
        return min(values) if agg.func == "min" else max(values)
