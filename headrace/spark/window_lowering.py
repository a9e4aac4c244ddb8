"""Windows Spark has no native operator for (count and global windows, triggers, allowed
lateness, discarding panes, late side output, custom window functions), on Spark's
``transformWithStateInPandas`` with the RocksDB state store.

Grouped by the step's key (``headrace/spark/stateful.py``): each key keeps its own
:class:`~headrace.engine.window_panes.WindowState` under its key, and one Spark event-time timer
wakes it when the watermark reaches its next window end or expiry. The watermark comes from
Spark (``TimerValues``); the input's watermark column is replaced by a plain copy so that
Spark does not discard late records itself: the operator judges lateness, and every record it
drops is reported (the late side output, when one is attached, keeps them).
"""

from __future__ import annotations

import datetime
import json
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

from headrace.aggregates import result_type
from headrace.contract import CONTROL_COLUMN, END_OF_INPUT_MS, LATE_METRIC_PREFIX
from headrace.engine.window_functions import BuiltinAggregates, ProcessWindow, ReduceWindow, UserAggregate
from headrace.engine.window_panes import Dropped, Fired, WindowLogic, WindowState
from headrace.errors import StepFunctionError
from headrace.lazy_modules import LazyModule
from headrace.plan.graph import Plan
from headrace.plan.nodes import RESULT_TIME, WindowAggregateNode
from headrace.schema import TYPE_ALIASES
from headrace.spark.clocks import uses_test_clock
from headrace.spark.expressions import aggregate_columns
from headrace.spark.specs import window_needs_processor
from headrace.spark.stateful import (
    GROUP,
    SEQUENCE,
    TIME,
    KeyCell,
    clock_keys,
    data_rows,
    exact_integers,
    group_frame,
    grouping_columns,
    integer_fields,
    key_value,
    output_frame,
    prepare_input,
    python_columns,
    timed_records,
)
from headrace.spark.stateless import without_control

if TYPE_CHECKING:
    import pandas as pd

    from headrace.spark.compilation import Compilation
else:
    pd = LazyModule("pandas")  # imported on first use: building and checking a plan needs no pandas

# A window processor's own columns have internal names, so that no result field can meet them
# (the API refuses results named like a column the window adds: keys, bounds, pane columns).
OUTPUT_KIND = "_hr_output"
PANE_KIND, PANE_INDEX = "_hr_pane_kind", "_hr_pane_index"
LATE_STEP, LATE_KEY, LATE_RECORD = "_hr_late_step", "_hr_late_key", "_hr_late_record"
LATE_TIME, LATE_START, LATE_END = "_hr_late_event_time", "_hr_late_window_start", "_hr_late_window_end"
LATE_COLUMNS = (LATE_STEP, LATE_KEY, LATE_TIME, LATE_START, LATE_END, LATE_RECORD)
TIMESTAMP_COLUMNS = ("window_start", "window_end", LATE_TIME, LATE_START, LATE_END)


def raw_columns(keys: list[str], result_fields: list[str], late: bool) -> list[str]:
    """The columns of a window processor's output: the panes', then the late records' when a
    record can be late or a late side output is attached."""
    panes = [*keys, "window_start", "window_end", PANE_KIND, PANE_INDEX, *result_fields]
    return [*panes, OUTPUT_KIND, *LATE_COLUMNS] if late else panes
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _watermark(raw: int) -> float:
    if raw >= END_OF_INPUT_MS:
        return math.inf  # the end of a bounded input: every window, the global one too
    return raw if raw > 0 else -math.inf


def _timestamp(ms: int | None) -> Any:
    return None if ms is None else pd.Timestamp(ms, unit="ms", tz="UTC")


class WindowProcessor(StatefulProcessor):
    """Drives one key's WindowState through its records of a micro-batch or a timer."""

    def __init__(self, step: str, logic: WindowLogic, keys: list[str], value_fields: list[str],
                 integers: frozenset[str], result_fields: list[str], event_time: str | None, columns: list[str],
                 test_clock: bool, late_columns: bool, timed: bool = False, chained: bool = False) -> None:
        self.step, self.logic, self.keys, self.event_time = step, logic, keys, event_time
        self.chained = chained  # the records are an earlier stateful step's results
        self.columns = pd.Index(columns)
        self.value_fields, self.integers, self.result_fields = value_fields, integers, result_fields
        self.test_clock = test_clock
        self.output_columns = raw_columns(keys, result_fields, late_columns) + ([RESULT_TIME] if timed else [])
        self.timestamps = [c for c in self.output_columns if c in TIMESTAMP_COLUMNS or c == RESULT_TIME]
        self.timed = timed

    def init(self, handle: Any) -> None:
        self.cell = KeyCell(handle, "window_state")

    def _wall_clock(self, state: WindowState, timer_values: Any, fired: list[Fired]) -> None:
        """Outside tests, processing time is the micro-batch's timestamp (the same on a replay)."""
        now = timer_values.getCurrentProcessingTimeInMs()
        if not self.test_clock and now > 0:
            self.logic.on_clock(state, now, fired)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
        self.raw_watermark = timerValues.getCurrentWatermarkInMs()  # a late record's row goes out at it
        watermark = _watermark(self.raw_watermark)
        state = self.cell.load() or WindowState()
        fired: list[Fired] = []
        dropped: list[Dropped] = []
        data, clock = data_rows(group_frame(rows, self.columns))
        try:
            if not self.chained:
                self.logic.on_watermark(state, watermark, fired)
            self._wall_clock(state, timerValues, fired)
            self._process(state, key_value(key, self.keys, self.integers), data, watermark, fired, dropped)
            if clock is not None:
                self.logic.on_clock(state, clock, fired)
        except StepFunctionError:
            raise
        except Exception as exc:
            raise StepFunctionError(f"step '{self.step}' failed: {type(exc).__name__}: {exc}") from exc
        self._save(state, self.raw_watermark)
        if fired or dropped:
            yield self._output(fired, dropped)

    def _process(self, state: WindowState, key: Any, data: pd.DataFrame, watermark: float, fired: list[Fired],
                 dropped: list[Dropped]) -> None:
        if self.logic.counts_columns:
            columns = dict(zip(self.value_fields, python_columns(data, self.value_fields, self.integers)))
            self.logic.process_counted_columns(state, key, columns, len(data), fired)
            return
        records = timed_records(data, self.value_fields, self.integers, key, untimed=0)
        if self.chained:
            self.logic.process_results(state, records, watermark, fired, dropped)
        else:
            self.logic.process(state, records, watermark, fired, dropped)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        state = self.cell.load(fired_timer=expiredTimerInfo.getExpiryTimeInMs())
        if state is None:
            return
        fired: list[Fired] = []
        raw_watermark = timerValues.getCurrentWatermarkInMs()
        self.logic.on_watermark(state, _watermark(raw_watermark), fired)
        self._wall_clock(state, timerValues, fired)
        self._save(state, raw_watermark)
        if fired:
            yield self._output(fired, [])

    def _save(self, state: WindowState, raw_watermark: int) -> None:
        upcoming = None
        if self.event_time is not None:  # without event time (count windows, count triggers) no timer
            upcoming = self.logic.next_event_time(state)
            if upcoming is None and state.panes:
                upcoming = END_OF_INPUT_MS  # a global window: it fires at the end of a bounded input
        # Under the test clock a key keeps the clock it has seen, so its state is kept.
        forget = state.is_empty() and not self.test_clock
        self.cell.save(None if forget else state, upcoming, raw_watermark)

    def _output(self, fired: list[Fired], dropped: list[Dropped]) -> pd.DataFrame:
        rows: list[dict[str, Any]] = []
        for pane in fired:
            keys = pane.key if len(self.keys) > 1 else (pane.key,)
            for result in pane.results:
                row = dict(zip(self.keys, keys))
                row.update({f: result.get(f) for f in self.result_fields})
                row.update({"window_start": _timestamp(pane.start), "window_end": _timestamp(pane.end),
                            PANE_KIND: pane.kind, PANE_INDEX: pane.pane})
                if self.timed:  # the last instant of the window (Spark's window_time)
                    row[RESULT_TIME] = _timestamp(pane.end) - pd.Timedelta(microseconds=1)
                row[OUTPUT_KIND] = "pane"  # (no such column without late columns: then it goes unused)
                rows.append(row)
        for late in dropped:  # always: the late records are counted, and kept if a late output is attached
            # (a late record's row never reaches a later step; Spark wants its time past the watermark)
            rows.append({OUTPUT_KIND: "late", RESULT_TIME: _timestamp(max(self.raw_watermark, 0) + 1),
                         LATE_STEP: self.step, LATE_KEY: str(late.key),
                         LATE_TIME: late.record.get(self.event_time) if self.event_time else None,
                         LATE_START: _timestamp(late.window_start), LATE_END: _timestamp(late.window_end),
                         LATE_RECORD: json.dumps(late.record, default=str, sort_keys=True)})
        return output_frame(rows, self.output_columns, self.timestamps)

    def close(self) -> None:
        pass


def _result_fields(node: Any, types: dict[str, str]) -> list[tuple[str, str]]:
    """(name, Spark type) of the result columns of a window step, as the plan types them (an
    aggregate keeps its column's type: min of a timestamp is a timestamp)."""
    if node.function == "aggregates":
        planned = dict(node.schema or ())
        fields = []
        for name, agg in node.aggs:
            kind = planned.get(name) or result_type(agg, TYPE_ALIASES.get(types.get(agg.column or "", "")))
            fields.append((name, kind if kind in TYPE_ALIASES else "double"))
        return fields
    assert node.result_schema is not None
    return list(node.result_schema)  # canonical type names are Spark DDL types too


def _logic(node: Any, late_output: bool) -> WindowLogic:
    function: Any = {
        "aggregates": lambda: BuiltinAggregates(node.aggs),
        "reduce": lambda: ReduceWindow(node.fn, [n for n, _ in node.result_schema]),
        "aggregate_function": lambda: UserAggregate(node.fn),
        "process": lambda: ProcessWindow(node.fn),
    }[node.function]()
    # A window with Spark's semantics (default emission, no late side output) judges a late
    # record's session as Spark's operator does, whichever runs it; the others as Flink does.
    spark_rule = node.emission.is_default() and not late_output
    return WindowLogic(node.window, node.emission, function, updates=node.emit == "updates",
                       merge_sessions_first=not spark_rule)


def _lower_processor(node: WindowAggregateNode, df: DataFrame, plan: Plan, timed: bool) -> DataFrame:
    """The window step as a stateful processor; returns its raw output (panes and late records)."""
    keys = list(node.keys or ())
    event_time = plan.nodes[node.inputs[0]].event_time
    prepared = prepare_input(df, keys, event_time, clock_keys(plan, keys))
    hidden = {CONTROL_COLUMN, TIME, SEQUENCE, GROUP, RESULT_TIME}
    value_fields = [c for c in prepared.columns if c not in hidden]
    types = dict(prepared.dtypes)
    late = plan.late_output_asked(node.name)
    if node.function == "aggregates" and not late:
        # The records only feed built-in aggregates (no late side output shows them): the
        # processor needs the fields the aggregates read, nothing else.
        read = {agg.column for _, agg in node.aggs if agg.column}
        value_fields = [c for c in value_fields if c in read]
    # Ship the processor only what it reads (each column costs per record in Spark's Python
    # worker): the grouping columns, the records' fields, the control column when it carries
    # the test clock, the event time in ms when there is one, and the sequence number when
    # the records' order can matter (records with neither fields nor event time are only counted).
    needed = {*grouping_columns(keys), *value_fields, TIME}
    if value_fields or event_time:
        needed.add(SEQUENCE)
    if uses_test_clock(plan):
        needed.add(CONTROL_COLUMN)
    prepared = prepared.select(*[F.col(f"`{c}`") for c in prepared.columns if c in needed])
    results = _result_fields(node, types)
    late_columns = event_time is not None or late
    columns = ([f"`{k}` {types[k]}" for k in keys] + ["window_start timestamp", "window_end timestamp",
               f"{PANE_KIND} string", f"{PANE_INDEX} bigint"] + [f"`{n}` {t}" for n, t in results])
    if late_columns:
        columns += [f"{OUTPUT_KIND} string", f"{LATE_STEP} string", f"{LATE_KEY} string", f"{LATE_TIME} timestamp",
                    f"{LATE_START} timestamp", f"{LATE_END} timestamp", f"{LATE_RECORD} string"]
    if timed:  # a later stateful step reads the results with their event time
        columns.append(f"{RESULT_TIME} timestamp")
    integers = integer_fields(prepared, value_fields)
    prepared = exact_integers(prepared, integers)
    processor = WindowProcessor(node.name, _logic(node, late), keys, value_fields, integers,
                                [n for n, _ in results], event_time, prepared.columns, uses_test_clock(plan),
                                late_columns, timed, chained=event_time == RESULT_TIME)
    return prepared.groupBy(*[F.col(f"`{c}`") for c in grouping_columns(keys)]).transformWithStateInPandas(
        statefulProcessor=processor, outputStructType=", ".join(columns),
        outputMode="Update" if node.emit == "updates" else "Append",
        timeMode="EventTime" if event_time else "None", eventTimeColumnName=RESULT_TIME if timed else "")


def lower_window(node: WindowAggregateNode, lowering: Compilation) -> DataFrame:
    """The window step: Spark's native window aggregate where its semantics match, otherwise
    the stateful processor (whose raw output, panes and late records, the compilation keeps)."""
    if window_needs_processor(lowering.plan, node):
        raw = _lower_processor(node, lowering.input(node), lowering.plan, lowering.result_time(node))
        if OUTPUT_KIND in raw.columns:
            late = F.count(F.when(F.col(OUTPUT_KIND) == "late", 1)).alias("late_dropped")
            raw = raw.observe(f"{LATE_METRIC_PREFIX}{node.name}", late)
        lowering.raw_outputs[node.name] = raw
        return window_panes(raw, node)
    df = without_control(lowering.input(node))
    shape = node.window
    event_time = F.col(f"`{lowering.plan.nodes[node.inputs[0]].event_time}`")
    durations = [f"{ms} milliseconds" for ms in shape.spark_durations()]
    window = getattr(F, str(shape.spark_function))(event_time, *durations)
    keys = [F.col(f"`{k}`") for k in node.keys or ()]
    # Spark refuses a session window over the whole stream (a global aggregation); one hidden key,
    # 0 for every record, groups the stream instead, and the select below drops it. Not a literal,
    # which Spark's optimizer removes from the grouping (and then refuses the query again).
    whole_stream = [(F.unix_micros(event_time) * 0).alias("_hr_whole_stream")] if (
        shape.spark_function == "session_window" and not keys) else []
    grouped = df.groupBy(*keys, *whole_stream, window.alias("_hr_window")).agg(*aggregate_columns(node.aggs))
    # window_time keeps the watermark's mark on the column, so a later stateful step can read it
    timed = [F.window_time("_hr_window").alias(RESULT_TIME)] if lowering.result_time(node) else []
    return grouped.select(*keys, F.col("_hr_window.start").alias("window_start"),
                          F.col("_hr_window.end").alias("window_end"),
                          *[F.col(f"`{name}`") for name, _ in node.aggs], *timed)


def window_panes(raw: DataFrame, node: WindowAggregateNode) -> DataFrame:
    """The panes of a window processor's output, with exactly the columns of the step's planned
    schema (and the hidden event time a later stateful step reads): never a late record's row
    or the processor's own columns."""
    panes = raw.filter(F.col(OUTPUT_KIND) == "pane") if OUTPUT_KIND in raw.columns else raw  # see raw_columns
    added = {"pane_kind": PANE_KIND, "pane_index": PANE_INDEX} if node.emission.has_panes(
        by_count=node.window.by_count) else {}
    internal = {PANE_KIND, PANE_INDEX, OUTPUT_KIND, *LATE_COLUMNS, RESULT_TIME}
    names = [name for name, _ in node.schema] if node.schema else [
        c for c in panes.columns if c not in internal] + list(added)
    timed = [F.col(RESULT_TIME)] if RESULT_TIME in panes.columns else []
    return panes.select(*[F.col(added[name]).alias(name) if name in added else F.col(f"`{name}`") for name in names],
                        *timed)


def window_late_records(raw: DataFrame) -> DataFrame:
    """The late side output: step, key, event time, the window missed, the record."""
    return raw.filter(F.col(OUTPUT_KIND) == "late").select(
        F.col(LATE_STEP).alias("step"), F.col(LATE_KEY).alias("key"), F.col(LATE_TIME).alias("event_time"),
        F.col(LATE_START).alias("window_start"), F.col(LATE_END).alias("window_end"),
        F.col(LATE_RECORD).alias("record"))
