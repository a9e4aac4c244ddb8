"""The event-time window operator's logic, free of Spark: windows per key, triggers,
allowed lateness, accumulation, session merging, count windows and the late side output.
What a window computes from its records is a :class:`WindowFunction`
(``headrace/engine/window_functions.py``).

One :class:`WindowState` holds the windows of one key, stored under that key; Spark's
stateful processor (``headrace/spark/window_lowering.py``) loads it, feeds it the key's records of a
micro-batch and the watermark, and stores it back. A micro-batch's records are judged against the
watermark left by the batches before it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from headrace.engine.window_functions import BuiltinAggregates, WindowFunction
from headrace.triggers import Emission
from headrace.windows import Count, Global, Session, WindowShape

NEG_INF = -math.inf
_NO_WINDOW: Any = object()  # a key without an open tumbling count window


@dataclass
class Pane:
    total: Any                  # everything in the window so far
    pending: Any                # what arrived since the previous pane
    pending_records: int = 0
    on_time_done: bool = False
    early_count: int = 0
    timer: float | None = None  # processing time of a due early pane
    panes_emitted: int = 0


@dataclass
class Fired:
    key: Any
    start: int | None
    end: int | None
    kind: str                   # early, on_time, late, count
    pane: int
    results: list[dict[str, Any]]


@dataclass
class Dropped:
    key: Any
    record: dict[str, Any]
    window_start: int | None
    window_end: int | None


@dataclass
class WindowState:
    panes: dict[tuple[Any, float, float], Pane] = field(default_factory=dict)
    counts: dict[Any, list[dict[str, Any]]] = field(default_factory=dict)
    since: dict[Any, int] = field(default_factory=dict)
    count_panes: dict[Any, int] = field(default_factory=dict)
    clock: int = 0
    count_accs: dict[Any, Any] = field(default_factory=dict)  # tumbling count windows: the open window
    # the last watermark the key acted on, for a step reading another stateful step's results
    # (see WindowLogic.process_results)
    watermark: float = NEG_INF

    def __setstate__(self, pickled: dict[str, Any]) -> None:
        """A state stored by an older version lacks the newer fields: they start empty."""
        self.__dict__.update({**WindowState().__dict__, **pickled})

    def is_empty(self) -> bool:
        """Nothing to remember: no open window, no count window under way, no pane index to continue."""
        return not (self.panes or self.counts or self.since or self.count_panes or self.count_accs)


def _label(start: float, end: float) -> tuple[int | None, int | None]:
    return (None if start == NEG_INF else int(start), None if end == math.inf else int(end))


class WindowLogic:
    """The operator for one window step: shape, emission policy and window function."""

    def __init__(self, shape: WindowShape, emission: Emission, function: WindowFunction,
                 updates: bool = False, merge_sessions_first: bool = True) -> None:
        self.shape, self.emission, self.function = shape, emission, function
        # A late record's session: Flink's rule merges it with the key's sessions first and
        # checks the merged one (a record that bridges into an open session is kept); Spark's
        # rule checks the record's own [t, t + gap) before merging (docs/semantics.md).
        self.merge_sessions_first = merge_sessions_first
        # emit="updates": each micro-batch emits the windows it changed ("update" panes), as
        # Spark's update mode does, and nothing when the watermark passes a window's end.
        self.updates = updates
        self.lateness = emission.allowed_lateness_ms
        self.trigger = emission.trigger
        # A tumbling count window of a function that can fold on arrival keeps one accumulator
        # per key; otherwise the key's last `size` records.
        self.folds_counts = (isinstance(shape, Count) and shape.slide == shape.size
                             and getattr(function, "incremental", False))
        # ... and built-in aggregates fold a micro-batch's records a column at a time.
        self.counts_columns = self.folds_counts and isinstance(function, BuiltinAggregates)

    # -- the three ways in -----------------------------------------------------------------
    def process(self, state: WindowState, records: Iterable[tuple[Any, int, dict[str, Any]]], watermark: float,
                out: list[Fired], dropped: list[Dropped]) -> None:
        """Add a micro-batch's records (key, event time in ms, record), in arrival order."""
        if isinstance(self.shape, Count):
            add = self._fold_counted if self.folds_counts else self._add_counted
            for key, _, record in records:
                add(state, key, record, out)
            return
        for key, t, record in records:
            if isinstance(self.shape, Session):
                merged = self._merge_session(state, key, t, watermark)
                windows = [merged] if merged is not None else []
                if merged is None:
                    dropped.append(Dropped(key, record, t, t + self.shape.gap_ms))
            else:
                assigned = ([(NEG_INF, math.inf)] if isinstance(self.shape, Global)
                            else [(float(s), float(e)) for s, e in self.shape.assign(t)])
                windows = [w for w in assigned if not self._expired(w, watermark)]
                if not windows:
                    last = assigned[-1]
                    dropped.append(Dropped(key, record, *_label(*last)))
            for window in windows:
                self._add(state, key, window, record, watermark, out)
        if self.updates:
            for ident in sorted(state.panes, key=_order):
                self._fire(ident, state.panes[ident], "update", out)

    def process_results(self, state: WindowState, records: Iterable[tuple[Any, int, dict[str, Any]]],
                        watermark: float, out: list[Fired], dropped: list[Dropped]) -> None:
        """``process`` then ``on_watermark`` for a step that reads the results of an earlier
        stateful step. Spark hands it the results the earlier step emitted when this micro-batch's
        watermark passed them, so they are behind that watermark; on time is judged as Spark's
        late-event filter judges a chained operator's input: against the watermark before this
        micro-batch (the last one the key acted on). The windows they complete then fire on time,
        in the same micro-batch."""
        self.process(state, records, state.watermark, out, dropped)
        self.on_watermark(state, watermark, out)

    def process_counted_columns(self, state: WindowState, key: Any, columns: dict[str, list[Any]], records: int,
                                out: list[Fired]) -> None:
        """``process`` for a tumbling count window of built-in aggregates (``counts_columns``):
        a key's records of a micro-batch as columns, folded a window's slice at a time."""
        assert isinstance(self.shape, Count) and isinstance(self.function, BuiltinAggregates)
        done = 0
        while done < records:
            accumulator = self._open_count_window(state, key)
            since = state.since.get(key, 0)
            stop = min(records, done + self.shape.size - since)
            accumulator = self.function.add_columns(accumulator, columns, done, stop)
            self._counted(state, key, accumulator, since + stop - done, out)
            done = stop

    def on_watermark(self, state: WindowState, watermark: float, out: list[Fired]) -> None:
        """Fire the on-time panes of windows the watermark completed; forget expired ones."""
        state.watermark = max(state.watermark, watermark)
        if self.trigger.fires_on_time and not self.updates:
            for ident in sorted(state.panes, key=_order):
                pane = state.panes[ident]
                if not pane.on_time_done and watermark >= ident[2]:
                    pane.on_time_done = True
                    self._fire(ident, pane, "on_time", out)
                    pane.timer = None
        for ident in [i for i in state.panes if self._expired((i[1], i[2]), watermark)]:
            del state.panes[ident]

    def on_clock(self, state: WindowState, clock: int, out: list[Fired]) -> None:
        """Processing time moved to ``clock``: fire the early panes that are due."""
        state.clock = max(state.clock, clock)
        for ident in sorted(state.panes, key=_order):
            pane = state.panes[ident]
            if pane.timer is not None and pane.timer <= state.clock:
                pane.timer = None
                if not pane.on_time_done:
                    self._fire(ident, pane, "early", out)

    def next_event_time(self, state: WindowState) -> float | None:
        """The earliest watermark at which something will happen (an on-time pane or an expiry)."""
        times = []
        for (_, _start, end), pane in state.panes.items():
            if self.trigger.fires_on_time and not pane.on_time_done and not self.updates:
                times.append(end)
            times.append(end + self.lateness)
        finite = [t for t in times if t != math.inf]
        return min(finite) if finite else None

    # -- internals -----------------------------------------------------------------------------
    def _expired(self, window: tuple[float, float], watermark: float) -> bool:
        return watermark >= window[1] + self.lateness

    def _add(self, state: WindowState, key: Any, window: tuple[float, float], record: dict[str, Any],
             watermark: float, out: list[Fired]) -> None:
        ident = (key, window[0], window[1])
        pane = state.panes.get(ident)
        if pane is None:
            pane = state.panes[ident] = Pane(self.function.create(), self.function.create())
        pane.total = self.function.add(pane.total, record)
        pane.pending = self.function.add(pane.pending, record)
        pane.pending_records += 1
        if self.updates:  # fired at the end of the micro-batch
            return
        kind = self.trigger.on_record(pane, window[1], watermark, state.clock)
        if kind is not None:
            self._fire(ident, pane, kind, out)

    def _fire(self, ident: tuple[Any, float, float], pane: Pane, kind: str, out: list[Fired]) -> None:
        empty_on_time = kind == "on_time" and self.trigger.fires_empty_on_time()
        if not pane.pending_records and not empty_on_time:
            return
        accumulator = pane.total if self.emission.accumulating else pane.pending
        window = _label(ident[1], ident[2])
        out.append(Fired(ident[0], *window, kind, pane.panes_emitted,
                         self.function.result(accumulator, ident[0], window)))
        pane.panes_emitted += 1
        pane.pending = self.function.create()
        pane.pending_records = 0
        pane.early_count = 0
        pane.timer = None

    def _merge_session(self, state: WindowState, key: Any, t: int, watermark: float) -> tuple[float, float] | None:
        """Merge the record's proto-session [t, t + gap) with the key's sessions that overlap or
        touch it; None when the result has already expired (the record is dropped)."""
        assert isinstance(self.shape, Session)
        start, end = float(t), float(t + self.shape.gap_ms)
        if not self.merge_sessions_first and self._expired((start, end), watermark):
            return None
        members: list[tuple[float, float]] = []
        changed = True
        while changed:
            changed = False
            for k, s, e in list(state.panes):
                if k == key and (s, e) not in members and start <= e and s <= end:
                    members.append((s, e))
                    start, end = min(start, s), max(end, e)
                    changed = True
        merged = (start, end)
        if not members and self._expired(merged, watermark):
            return None
        if members == [merged]:
            return merged
        combined: Pane | None = None
        for s, e in sorted(members):
            old = state.panes.pop((key, s, e))
            if combined is None:
                combined = old
                continue
            combined.total = self.function.merge(combined.total, old.total)
            combined.pending = self.function.merge(combined.pending, old.pending)
            combined.pending_records += old.pending_records
            combined.early_count += old.early_count
            combined.panes_emitted = max(combined.panes_emitted, old.panes_emitted)
            if old.timer is not None:
                combined.timer = old.timer if combined.timer is None else min(combined.timer, old.timer)
        if combined is not None:
            combined.on_time_done = False
            combined.panes_emitted = 0
            state.panes[(key, start, end)] = combined
        return merged

    def _add_counted(self, state: WindowState, key: Any, record: dict[str, Any], out: list[Fired]) -> None:
        """Count windows: every ``slide``-th record of a key emits its last ``size`` records."""
        assert isinstance(self.shape, Count)
        buffer = state.counts.setdefault(key, [])
        buffer.append(record)
        del buffer[:-self.shape.size]
        state.since[key] = state.since.get(key, 0) + 1
        if state.since[key] == self.shape.slide:
            accumulator = self.function.create()
            for item in buffer:
                accumulator = self.function.add(accumulator, item)
            pane = state.count_panes.get(key, 0)
            out.append(Fired(key, None, None, "count", pane, self.function.result(accumulator, key, (None, None))))
            state.count_panes[key] = pane + 1
            state.since[key] = 0

    def _fold_counted(self, state: WindowState, key: Any, record: dict[str, Any], out: list[Fired]) -> None:
        """Tumbling count windows of an incremental function: the same panes as ``_add_counted``,
        from one accumulator per key instead of the key's last ``size`` records."""
        accumulator = self.function.add(self._open_count_window(state, key), record)
        self._counted(state, key, accumulator, state.since.get(key, 0) + 1, out)

    def _open_count_window(self, state: WindowState, key: Any) -> Any:
        """The accumulator of the key's open tumbling count window (taken out of the state)."""
        accumulator = state.count_accs.pop(key, _NO_WINDOW)
        if accumulator is _NO_WINDOW:
            accumulator = self.function.create()
            kept = state.counts.pop(key, [])  # records kept by an older version: the last `since` are open
            for item in kept[len(kept) - state.since.get(key, 0):]:
                accumulator = self.function.add(accumulator, item)
        return accumulator

    def _counted(self, state: WindowState, key: Any, accumulator: Any, since: int, out: list[Fired]) -> None:
        """The open count window now holds ``since`` records: fire it when full, else keep it."""
        assert isinstance(self.shape, Count)
        if since == self.shape.size:
            pane = state.count_panes.get(key, 0)
            out.append(Fired(key, None, None, "count", pane, self.function.result(accumulator, key, (None, None))))
            state.count_panes[key] = pane + 1
            state.since[key] = 0
        else:
            state.count_accs[key] = accumulator
            state.since[key] = since

def _order(ident: tuple[Any, float, float]) -> tuple[str, float, float]:
    return (str(ident[0]), ident[1], ident[2])
