"""The local runner's windows, their late side output and rolling per-key aggregates, on the
engine's window logic (``headrace/engine/window_panes.py``), one :class:`WindowState` per key
as on Spark."""

from __future__ import annotations

import datetime
import json
from typing import Any

from headrace.engine.rolling import reduce_fold
from headrace.engine.window_functions import BuiltinAggregates, ProcessWindow, ReduceWindow, UserAggregate
from headrace.engine.window_panes import Dropped, Fired, WindowLogic, WindowState
from headrace.errors import StepFunctionError
from headrace.plan.nodes import RESULT_TIME, LateRecordsNode, RollingAggregateNode, WindowAggregateNode
from headrace.testing.local.joins import reads_a_join
from headrace.testing.local.operators import Operator, Tick, registered
from headrace.testing.local.values import Row, event_millis, from_millis, visible


def key_of(row: Row, keys: tuple[str, ...]) -> Any:
    """The key as the engine sees it: the value of one key field, a tuple of several, () for none."""
    if not keys:
        return ()
    values = tuple(row[k] for k in keys)
    return values[0] if len(keys) == 1 else values


def key_fields(key: Any, keys: tuple[str, ...]) -> Row:
    return dict(zip(keys, key if len(keys) > 1 else (key,))) if keys else {}


def window_logic(node: WindowAggregateNode, late_output: bool) -> WindowLogic:
    """The engine's logic for the step, built as Spark's window processor builds it."""
    function: Any = {
        "aggregates": lambda: BuiltinAggregates(node.aggs),
        "reduce": lambda: ReduceWindow(node.fn, [n for n, _ in node.result_schema or ()]),
        "aggregate_function": lambda: UserAggregate(node.fn),
        "process": lambda: ProcessWindow(node.fn),
    }[node.function]()
    spark_rule = node.emission.is_default() and not late_output  # see spark/window_lowering.py
    return WindowLogic(node.window, node.emission, function, updates=node.emit == "updates",
                       merge_sessions_first=not spark_rule)


@registered(WindowAggregateNode)
class WindowStep(Operator):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.logic = window_logic(self.node, self.plan.late_output_asked(self.node.name))
        self.states: dict[Any, WindowState] = {}
        self.keys = tuple(self.node.keys or ())
        # it reads an earlier stateful step's results: judged by the watermark before the micro-batch
        self.chained = self.event_time_of() == RESULT_TIME or reads_a_join(self.plan, self.node)
        self.late_rows: list[Row] = []

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        field, watermark = self.event_time_of(), tick.event_watermark
        by_key: dict[Any, list[tuple[Any, int, Row]]] = {}
        for row in inputs[0]:
            key = key_of(row, self.keys)
            t = event_millis(row.get(field)) if field else 0
            by_key.setdefault(key, []).append((key, t or 0, visible(row)))
        fired: list[Fired] = []
        dropped: list[Dropped] = []
        try:
            for key in list(self.states) + [k for k in by_key if k not in self.states]:
                self._run_key(key, by_key.get(key), watermark, tick, fired, dropped)
        except StepFunctionError:
            raise
        except Exception as exc:
            raise StepFunctionError(f"step '{self.node.name}' failed: {type(exc).__name__}: {exc}") from exc
        self.late_rows = [self._late_row(d, field) for d in dropped]
        if dropped:
            tick.late_dropped[self.node.name] = tick.late_dropped.get(self.node.name, 0) + len(dropped)
        return [row for pane in fired for row in self._pane_rows(pane)]

    def _run_key(self, key: Any, records: list[tuple[Any, int, Row]] | None, watermark: float, tick: Tick,
                 fired: list[Fired], dropped: list[Dropped]) -> None:
        state = self.states.setdefault(key, WindowState())
        if self.chained and records:
            self.logic.process_results(state, records, watermark, fired, dropped)
        else:
            self.logic.on_watermark(state, watermark, fired)
            if records:
                self.logic.process(state, records, watermark, fired, dropped)
        if tick.clock_moved:
            self.logic.on_clock(state, tick.clock, fired)

    def _pane_rows(self, pane: Fired) -> list[Row]:
        rows = []
        for result in pane.results:
            row: Row = {}
            for name, _ in self.node.schema or ():
                if name in self.keys:
                    row[name] = key_fields(pane.key, self.keys)[name]
                elif name in ("window_start", "window_end"):
                    row[name] = from_millis(pane.start if name == "window_start" else pane.end)
                elif name == "pane_kind" and self.node.emission.has_panes(self.node.window.by_count):
                    row[name] = pane.kind
                elif name == "pane_index" and self.node.emission.has_panes(self.node.window.by_count):
                    row[name] = pane.pane
                else:
                    value = result.get(name)
                    row[name] = float(value) if isinstance(value, int) and self._is_double(name) else value
            if pane.end is not None:  # the window's last instant, its results' event time
                end = from_millis(pane.end)
                assert end is not None
                row[RESULT_TIME] = end - datetime.timedelta(microseconds=1)
            rows.append(row)
        return rows

    def _is_double(self, name: str) -> bool:
        return dict(self.node.schema or ()).get(name) in ("double", "float")

    def _late_row(self, late: Dropped, field: str | None) -> Row:
        return {"step": self.node.name, "key": str(late.key),
                "event_time": late.record.get(field) if field else None,
                "window_start": from_millis(late.window_start), "window_end": from_millis(late.window_end),
                "record": json.dumps(late.record, default=str, sort_keys=True)}


@registered(LateRecordsNode)
class LateRecordsStep(Operator):
    """The late side output of the window (or join) before it: what it dropped in this micro-batch."""

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        return list(getattr(self.operators[self.node.inputs[0]], "late_rows", []))


@registered(RollingAggregateNode)
class RollingStep(Operator):
    """Running aggregates per key: each micro-batch emits every key it touched with its new value.
    With ``ttl``, a key quiet for that long (of the test clock) starts again from nothing."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.keys = tuple(self.node.keys or ())
        self.aggregates = BuiltinAggregates(self.node.aggs)
        self.accumulators: dict[Any, Any] = {}
        self.written: dict[Any, int] = {}

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        touched: list[Any] = []
        for row in inputs[0]:
            key = key_of(row, self.keys)
            ttl = self.node.ttl_ms
            if ttl is not None and key in self.written and tick.clock - self.written[key] >= ttl:
                del self.accumulators[key]
            self.accumulators[key] = self._fold(self.accumulators.get(key), visible(row))
            self.written[key] = tick.clock
            if key not in touched:
                touched.append(key)
        return [self._result(key) for key in touched]

    def _fold(self, accumulated: Any, record: Row) -> Any:
        if self.node.reduce_fn is None:
            return self.aggregates.add(self.aggregates.create() if accumulated is None else accumulated, record)
        names = [n for n, _ in self.node.schema or ()]
        fold = reduce_fold(self.node.name, self.node.reduce_fn, names)
        return fold(accumulated, {n: record.get(n) for n in names})

    def _result(self, key: Any) -> Row:
        accumulated = self.accumulators[key]
        if self.node.reduce_fn is not None:
            return dict(accumulated)
        values = self.aggregates.result(accumulated, key, (None, None))[0]
        row = {**key_fields(key, self.keys), **values}
        types = dict(self.node.schema or ())
        return {n: float(v) if types.get(n) == "double" and isinstance(v, int) else v for n, v in row.items()}
