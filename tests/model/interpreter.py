"""The reference model: a spec's pipeline run on its bounded input in plain Python.

Written from the documented semantics, not from headrace's code (it imports nothing of
headrace):

* each input file is one micro-batch; a line that does not parse, or whose value does not fit
  its field's type, is a dead letter (``source``, ``position`` its file: Spark's reader gives no line, ``raw``);
* the watermark W is the largest event time seen (over every parsed record of the source, before
  any step) minus the maximum out-of-orderness; it moves between micro-batches, so a batch is
  judged against the W the batches before it left (docs/semantics.md); with a second source
  united, W is the smaller of the two sources' (one that sent nothing holds W back); a bounded
  source's end (its flush row, read with its last file) takes its own watermark past every time;
* windows are half-open ``[start, end)``; a record whose every window ended (``end <= W``; a
  session's ``t + gap <= W``, before merging) is late: dropped and counted once; a window fires
  once the watermark reaches its end; the end of the input fires every open window;
* a window's results have the event time of their window's end - 1 µs; a window over them
  takes every result (results are never late for the next step) and fires its own windows when
  the same watermark passes them, in the same micro-batch (docs/windows.md);
* a process step sees every record (none is late), its due event-time timers fire before the
  micro-batch's records (the watermark reached them), a timer at or behind the watermark fires
  at once after the record that set it, a key has one timer per time, and the end of the input
  fires every pending timer once (docs/process.md);
* running aggregates emit, per micro-batch, each key the batch touched with its new value;
* native filters follow SQL (a null comparison does not pass), arithmetic on null is null;
  aggregates skip nulls (``count()`` counts records), and are null when every value is null.

Outputs are rows (dicts) per sink; times are epoch milliseconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from model.spec import (
    AGGREGATE_NAMES,
    SECOND_SOURCE,
    SOURCE,
    WEIGHTS,
    BadLine,
    Event,
    NativeFilter,
    PythonFilter,
    PythonMap,
    Rolling,
    Session,
    Sliding,
    Spec,
    SqlStep,
    SqlWindow,
    TableJoin,
    Tally,
    Tumbling,
    Window,
    WithColumns,
    file_name,
)

Row = dict[str, Any]
END_OF_INPUT = math.inf


@dataclass
class Outcome:
    """What a run gives: each sink's rows, the dead letters counted and the late records dropped."""

    sinks: dict[str, list[Row]] = field(default_factory=dict)
    dead_letters: int = 0
    late_dropped: int = 0


def run(spec: Spec) -> Outcome:
    """Every sink's rows, the dead-letter count and the late-drop count of ``spec``'s pipeline."""
    outcome = Outcome(sinks={name: [] for name in spec.sink_kinds()})
    stateful = _stateful(spec)
    inputs = {SOURCE: spec.batches, **({SECOND_SOURCE: spec.union.batches} if spec.union else {})}
    delays = {SOURCE: spec.delay, **({SECOND_SOURCE: spec.union.delay} if spec.union else {})}
    max_seen = {name: -math.inf for name in inputs}
    watermark = -math.inf
    for number in range(max(len(batches) for batches in inputs.values())):
        into_stateful: list[Row] = []
        for name, batches in inputs.items():  # each source reads its next file, if it has one
            if number >= len(batches):
                continue
            events, dead = _parse(name, number, batches[number])
            outcome.dead_letters += len(dead)
            if "dead" in outcome.sinks:
                outcome.sinks["dead"].extend(dead)
            max_seen[name] = max([max_seen[name], *(event.ts for event in events)])
            if number == len(batches) - 1:
                max_seen[name] = END_OF_INPUT  # the source's flush row comes with its last file
            if name != SOURCE:  # the united source joins the stream after its steps
                into_stateful.extend(event.as_dict() for event in events)
                continue
            rows = [_stateless(spec, event.as_dict()) for event in events]
            kept = [row for row in rows if row is not None]
            if "tap" in outcome.sinks:
                outcome.sinks["tap"].extend(kept)
            into_stateful = kept + into_stateful
        results = stateful.add(into_stateful, watermark) if stateful else into_stateful
        # every source's watermark, the smallest of them; one that has sent nothing holds it back
        watermark = max(watermark, min(seen - delays[name] for name, seen in max_seen.items()))
        if stateful:
            results = results + stateful.fire(watermark)
        for name in outcome.sinks:
            if name.startswith("out_"):
                outcome.sinks[name].extend(results)
    outcome.late_dropped = stateful.late if stateful else 0
    return outcome


def _parse(source: str, number: int, batch: tuple[Event | BadLine, ...]) -> tuple[list[Event], list[Row]]:
    events, dead = [], []
    for item in batch:
        if isinstance(item, BadLine):
            dead.append({"source": source, "position": file_name(number), "raw": item.raw})  # Spark's reader: the file
        else:
            events.append(item)
    return events, dead


def _stateless(spec: Spec, row: Row, steps: tuple[Any, ...] | None = None) -> Row | None:
    for step in spec.steps if steps is None else steps:
        if isinstance(step, NativeFilter):
            if row["value"] is None or not row["value"] > step.above:
                return None
        elif isinstance(step, PythonFilter):
            if not step(dict(row)):
                return None
        elif isinstance(step, PythonMap):
            row = step(dict(row))
        elif isinstance(step, WithColumns):
            row = {**row, "value": None if row["value"] is None else row["value"] * step.times}
        elif isinstance(step, SqlStep):
            row = {**row, "value": None if row["value"] is None else row["value"] + step.add}
        elif isinstance(step, TableJoin):
            weight = WEIGHTS.get(row["key"]) if row["key"] is not None else None
            if weight is None and step.how == "inner":
                return None
            row = {**row, "value": None if row["value"] is None or weight is None else row["value"] * weight}
        else:
            raise TypeError(f"no model for step {step!r}")
    return row


# -- aggregates -------------------------------------------------------------------------------

def aggregate(name: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if name == "count":
        return len(values)
    if not present:
        return None
    return {"sum": sum, "min": min, "max": max}[name](present)


def _results(aggregates: tuple[str, ...], values: list[Any]) -> Row:
    return {AGGREGATE_NAMES[a]: aggregate(a, values) for a in aggregates}


# -- stateful steps ---------------------------------------------------------------------------

def _stateful(spec: Spec) -> Any:
    if isinstance(spec.stateful, Window):
        return PaneWindowModel(spec.stateful) if spec.stateful.panes else WindowModel(spec.stateful)
    if isinstance(spec.stateful, Rolling):
        return RollingModel(spec.stateful)
    if isinstance(spec.stateful, Tally):
        return TallyModel(spec.stateful)
    if isinstance(spec.stateful, SqlWindow):  # the same as a fluent window counting and summing
        return WindowModel(Window(Tumbling(spec.stateful.seconds * 1000), True, ("count", "sum")))
    return None


class WindowModel:
    """Event-time windows, emit="final", no allowed lateness; maybe a second window after."""

    def __init__(self, step: Window) -> None:
        self.step = step
        self.panes: dict[tuple[Any, float, float], list[Any]] = {}   # (key, start, end) -> values
        self.late = 0
        self.then = SecondWindowModel(step.then.size, step.keyed) if step.then else None

    def _key(self, row: Row) -> Any:
        return row["key"] if self.step.keyed else None

    def add(self, rows: list[Row], watermark: float) -> list[Row]:
        for row in rows:
            if isinstance(self.step.shape, Session):
                self._add_to_session(row, watermark)
                continue
            live = [w for w in assign(self.step.shape, row["ts"]) if w[1] > watermark]
            if not live:
                self.late += 1
            for start, end in live:
                self.panes.setdefault((self._key(row), start, end), []).append(row["value"])
        return []

    def _add_to_session(self, row: Row, watermark: float) -> None:
        assert isinstance(self.step.shape, Session)
        start, end = row["ts"], row["ts"] + self.step.shape.gap
        if end <= watermark:
            self.late += 1
            return
        key, values = self._key(row), [row["value"]]
        for other in [k for k in self.panes if k[0] == key]:
            if other[1] <= end and start <= other[2]:  # overlap or touch: merge into the cover
                values.extend(self.panes.pop(other))
                start, end = min(start, other[1]), max(end, other[2])
        self.panes[(key, start, end)] = values

    def fire(self, watermark: float) -> list[Row]:
        out = self._fire(watermark)
        if self.then is None:
            return out
        for row in out:
            self.then.add(row)
        return self.then.fire(watermark)

    def _fire(self, watermark: float) -> list[Row]:
        out = []
        for pane in sorted((k for k in self.panes if k[2] <= watermark), key=repr):
            key, start, end = pane
            row: Row = {"key": key} if self.step.keyed else {}
            row.update(window_start=start, window_end=end, **_results(self.step.aggregates, self.panes.pop(pane)))
            out.append(row)
        return out


@dataclass
class Pane:
    total: list[Any] = field(default_factory=list)
    pending: list[Any] = field(default_factory=list)
    emitted: int = 0
    on_time_done: bool = False
    since_early: int = 0


class PaneWindowModel:
    """Tumbling or sliding windows with allowed lateness L, an early trigger every N records and
    accumulating or discarding panes (docs/windows.md): the on-time pane when the watermark
    reaches the end; a record for a window whose end the watermark reached but end + L not yet
    updates it and fires a late pane at once; at end + L the window is forgotten and records for
    it are dropped. A pane with nothing new is skipped."""

    def __init__(self, step: Window) -> None:
        self.step = step
        self.panes: dict[tuple[Any, int, int], Pane] = {}
        self.late = 0
        self.out: list[Row] = []

    def add(self, rows: list[Row], watermark: float) -> list[Row]:
        for row in rows:
            key = row["key"] if self.step.keyed else None
            live = [w for w in assign(self.step.shape, row["ts"]) if watermark < w[1] + self.step.lateness]
            if not live:
                self.late += 1
            for start, end in live:
                pane = self.panes.setdefault((key, start, end), Pane())
                pane.total.append(row["value"])
                pane.pending.append(row["value"])
                if watermark >= end:
                    pane.on_time_done = True
                    self._fire((key, start, end), "late")
                elif self.step.early:
                    pane.since_early += 1
                    if pane.since_early >= self.step.early:
                        self._fire((key, start, end), "early")
        out, self.out = self.out, []
        return out

    def _fire(self, ident: tuple[Any, int, int], kind: str) -> None:
        pane = self.panes[ident]
        if not pane.pending:
            return
        key, start, end = ident
        row: Row = {"key": key} if self.step.keyed else {}
        values = pane.total if self.step.accumulating else pane.pending
        row.update(window_start=start, window_end=end, pane_kind=kind, pane_index=pane.emitted,
                   **_results(self.step.aggregates, values))
        self.out.append(row)
        pane.emitted += 1
        pane.pending = []
        pane.since_early = 0

    def fire(self, watermark: float) -> list[Row]:
        for ident in sorted(self.panes, key=repr):
            pane = self.panes[ident]
            if not pane.on_time_done and watermark >= ident[2]:
                pane.on_time_done = True
                self._fire(ident, "on_time")
        for ident in [i for i in self.panes if watermark >= i[2] + self.step.lateness]:
            del self.panes[ident]
        out, self.out = self.out, []
        return out


class SecondWindowModel:
    """A tumbling window over a window's results: each result at its window's end - 1 µs."""

    def __init__(self, size: int, keyed: bool) -> None:
        self.size, self.keyed = size, keyed
        self.panes: dict[tuple[Any, int], list[int]] = {}   # (key, start) -> the counts

    def add(self, result: Row) -> None:
        [(start, _)] = assign(Tumbling(self.size), result["window_end"] - 0.001)
        self.panes.setdefault((result.get("key"), int(start)), []).append(result["n"])

    def fire(self, watermark: float) -> list[Row]:
        out = []
        for key, start in sorted((k for k in self.panes if k[1] + self.size <= watermark), key=repr):
            counts = self.panes.pop((key, start))
            row: Row = {"key": key} if self.keyed else {}
            row.update(window_start=start, window_end=start + self.size, sum_n=sum(counts), windows=len(counts))
            out.append(row)
        return out


def assign(shape: Tumbling | Sliding | Session, t: int) -> list[tuple[int, int]]:
    """The windows ``[start, end)`` holding time ``t`` (docs/semantics.md, offset 0)."""
    if isinstance(shape, Tumbling):
        start = t - t % shape.size  # t may be a fraction of a millisecond
        return [(start, start + shape.size)]
    if isinstance(shape, Sliding):
        last = t - t % shape.slide
        return [(s, s + shape.size) for s in range(last, t - shape.size, -shape.slide)]
    raise TypeError(f"sessions merge; no fixed windows for {shape!r}")


class RollingModel:
    """Running aggregates per key: each micro-batch emits each key it touched, with its new value."""

    def __init__(self, step: Rolling) -> None:
        self.step = step
        self.values: dict[Any, list[Any]] = {}
        self.late = 0

    def add(self, rows: list[Row], watermark: float) -> list[Row]:
        touched = []
        for row in rows:
            if row["key"] not in self.values:
                self.values[row["key"]] = []
            if row["key"] not in touched:
                touched.append(row["key"])
            self.values[row["key"]].append(row["value"])
        return [{"key": key, **_results(self.step.aggregates, self.values[key])} for key in touched]

    def fire(self, watermark: float) -> list[Row]:
        return []


class TallyModel:
    """The ``Tally`` process function (model/spec.py) under the documented timer rules."""

    def __init__(self, step: Tally) -> None:
        self.step = step
        self.seen: dict[Any, int] = {}
        self.timers: dict[Any, set[int]] = {}
        self.late = 0

    def add(self, rows: list[Row], watermark: float) -> list[Row]:
        out = []
        for row in rows:
            key = row["key"]
            self.seen[key] = self.seen.get(key, 0) + 1
            out.append({"key": key, "kind": "record", "n": self.seen[key], "at": row["ts"]})
            timer = row["ts"] + self.step.after
            if timer <= watermark:  # at or behind its clock: fires at once
                out.append(self._timer(key, timer))
            else:
                self.timers.setdefault(key, set()).add(timer)
        return out

    def _timer(self, key: Any, time: int) -> Row:
        return {"key": key, "kind": "timer", "n": self.seen.get(key, 0), "at": time}

    def fire(self, watermark: float) -> list[Row]:
        out = []
        for key, times in self.timers.items():
            for time in sorted(t for t in times if t <= watermark):
                times.discard(time)
                out.append(self._timer(key, time))
        return out
