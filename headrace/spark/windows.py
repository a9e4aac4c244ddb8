"""Windows Spark has no native operator for (count and global windows, triggers, allowed
lateness, discarding panes, late side output, custom window functions), on Spark's
``transformWithStateInPandas`` with the RocksDB state store.

Operator instances are keys (DESIGN.md): records are grouped by a stable hash of their key
modulo ``parallelism``; each instance keeps the :class:`~headrace.window_state.WindowState`
of all its keys in one value-state cell, loaded and stored once per micro-batch, so state
calls are batched per instance, not made per key. Control rows are copied to every
instance: they carry the test clock of processing-time triggers. The watermark comes from
Spark (``TimerValues``); an event-time timer per instance wakes it when the watermark
reaches the next window end. The input's watermark column is dropped before the operator
so that Spark does not discard late records itself: the operator judges lateness.
"""

from __future__ import annotations

import datetime
import json
import math
import pickle
from collections.abc import Iterator
from itertools import repeat
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

from headrace.connectors.base import CONTROL_COLUMN, FLUSH_TIME_MS
from headrace.errors import StepFunctionError
from headrace.window_state import Dropped, Fired, WindowLogic, WindowState

INSTANCE = "_hr_instance"
TIME = "_hr_t"
OUTPUT_KIND = "_hr_output"
LATE_COLUMNS = ("late_step", "late_key", "late_event_time", "late_window_start", "late_window_end", "late_record")
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _watermark(raw: int) -> float:
    if raw >= FLUSH_TIME_MS:
        return math.inf  # the end of a bounded input: every window, the global one too
    return raw if raw > 0 else -math.inf


def _timestamp(ms: int | None) -> Any:
    return None if ms is None else pd.Timestamp(ms, unit="ms", tz="UTC")


def _records(data: pd.DataFrame, fields: list[str]) -> list[dict[str, Any]]:
    """``data[fields].to_dict("records")`` (the same dicts, Python scalars), built a column at a time."""
    if not fields:
        return [{} for _ in range(len(data))]
    columns = data[fields].to_dict("list")
    return [dict(zip(fields, row)) for row in zip(*columns.values())]


def read_input(frame: pd.DataFrame, columns: list[str], keys: list[str], value_fields: list[str],
               untimed: Any) -> tuple[Iterator[tuple[Any, Any, dict[str, Any]]], int | None]:
    """One pandas frame of an instance's input (``prepare_input``): its data rows as (key, event
    time in ms or ``untimed``, record), and the test clock its control rows move to, if any."""
    frame.columns = columns  # pandas conversion renames columns that start with "_"
    controls = frame[CONTROL_COLUMN]
    control = controls.notna()
    data = frame.loc[~control] if control.any() else frame
    records = _records(data, value_fields)
    if not keys:
        key_values: Any = repeat(())  # a step over the whole stream: one group
    elif len(keys) == 1:
        key_values = data[keys[0]].tolist()
    else:
        key_values = zip(*(data[k].tolist() for k in keys))
    times = (int(t) for t in data[TIME].tolist()) if TIME in columns else repeat(untimed)
    clocks = controls[controls < 0]  # the test kit's clock rows, see clock_control
    clock = int(-clocks.min() - 1) if len(clocks) else None
    return zip(key_values, times, records), clock


def output_frame(rows: list[Any], columns: list[str], timestamps: list[str]) -> pd.DataFrame:
    """The pandas frame a stateful processor yields: nulls as None, timestamps in UTC."""
    frame = pd.DataFrame(rows, columns=columns, dtype=object)
    frame = frame.astype(object).where(frame.notna(), None)
    for name in timestamps:
        frame[name] = pd.to_datetime(frame[name], utc=True)
    return frame


class WindowProcessor(StatefulProcessor):
    """Drives one instance's WindowState through a micro-batch or a timer."""

    def __init__(self, step: str, logic: WindowLogic, keys: list[str], value_fields: list[str],
                 result_fields: list[str], late_output: bool, event_time: str | None, columns: list[str],
                 test_clock: bool) -> None:
        self.step, self.logic, self.keys, self.event_time, self.columns = step, logic, keys, event_time, columns
        self.value_fields, self.result_fields, self.late_output = value_fields, result_fields, late_output
        self.test_clock = test_clock

    def _wall_clock(self, state: WindowState, timer_values: Any, fired: list[Fired]) -> None:
        """Outside tests, processing time is the micro-batch's timestamp (the same on a replay)."""
        now = timer_values.getCurrentProcessingTimeInMs()
        if not self.test_clock and now > 0:
            self.logic.on_clock(state, now, fired)

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.cell = handle.getValueState("window_state", "state binary")

    def _load(self) -> WindowState:
        return pickle.loads(self.cell.get()[0]) if self.cell.exists() else WindowState()

    def _store(self, state: WindowState, watermark: float) -> None:
        self.cell.update((pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL),))
        if self.event_time is None:
            return  # no event time: count windows and count triggers need no timer
        upcoming = self.logic.next_event_time(state)
        if upcoming is None and state.panes:
            upcoming = FLUSH_TIME_MS  # a global window: it fires at the end of a bounded input
        if upcoming is not None:
            existing = set(self.handle.listTimers())
            timer = int(max(upcoming, 0))
            if timer not in existing:
                self.handle.registerTimer(timer)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
        watermark = _watermark(timerValues.getCurrentWatermarkInMs())
        state = self._load()
        fired: list[Fired] = []
        dropped: list[Dropped] = []
        try:
            self.logic.on_watermark(state, watermark, fired)
            self._wall_clock(state, timerValues, fired)
            for frame in rows:
                records, clock = read_input(frame, self.columns, self.keys, self.value_fields, untimed=0)
                self.logic.process(state, records, watermark, fired, dropped)
                if clock is not None:
                    self.logic.on_clock(state, clock, fired)
        except StepFunctionError:
            raise
        except Exception as exc:
            raise StepFunctionError(f"step '{self.step}' failed: {type(exc).__name__}: {exc}") from exc
        self._store(state, watermark)
        yield self._output(fired, dropped)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        watermark = _watermark(timerValues.getCurrentWatermarkInMs())
        state = self._load()
        fired: list[Fired] = []
        self.logic.on_watermark(state, watermark, fired)
        self._wall_clock(state, timerValues, fired)
        self._store(state, watermark)
        yield self._output(fired, [])

    def _output(self, fired: list[Fired], dropped: list[Dropped]) -> pd.DataFrame:
        rows: list[dict[str, Any]] = []
        for pane in fired:
            keys = pane.key if len(self.keys) > 1 else (pane.key,)
            for result in pane.results:
                row = dict(zip(self.keys, keys))
                row.update(window_start=_timestamp(pane.start), window_end=_timestamp(pane.end),
                           pane_kind=pane.kind, pane_index=pane.pane, **{f: result.get(f) for f in self.result_fields})
                row[OUTPUT_KIND] = "pane"
                rows.append(row)
        if self.late_output:
            for late in dropped:
                rows.append({OUTPUT_KIND: "late", "late_step": self.step, "late_key": str(late.key),
                             "late_event_time": late.record.get(self.event_time) if self.event_time else None,
                             "late_window_start": _timestamp(late.window_start),
                             "late_window_end": _timestamp(late.window_end),
                             "late_record": json.dumps(late.record, default=str, sort_keys=True)})
        columns = [*self.keys, "window_start", "window_end", "pane_kind", "pane_index", *self.result_fields,
                   OUTPUT_KIND, *LATE_COLUMNS]
        return output_frame(rows, columns, ["window_start", "window_end", "late_event_time", "late_window_start",
                                            "late_window_end"])

    def close(self) -> None:
        pass


def prepare_input(df: DataFrame, keys: list[str], event_time: str | None, parallelism: int) -> DataFrame:
    """Add the instance and, with event time, the event time in ms; copy control rows (which
    carry the test clock and the end of input) to every instance."""
    if CONTROL_COLUMN not in df.columns:
        df = df.withColumn(CONTROL_COLUMN, F.lit(None).cast("long"))
    if event_time:
        df = df.withColumn(TIME, F.unix_millis(F.col(f"`{event_time}`")))
        # a plain copy, not the watermark column; control rows carry no event time (theirs can be year 9999)
        plain = F.when(F.col(CONTROL_COLUMN).isNull(), F.timestamp_millis(F.col(TIME)))
        df = df.drop(event_time).withColumn(event_time, plain)
    instance = F.pmod(F.xxhash64(*[F.col(f"`{k}`") for k in keys]), F.lit(parallelism)) if keys else F.lit(0)
    every = F.sequence(F.lit(0).cast("long"), F.lit(parallelism - 1).cast("long"))
    instances = F.when(F.col(CONTROL_COLUMN).isNull(), F.array(instance.cast("long"))).otherwise(every)
    return df.withColumn(INSTANCE, F.explode(instances))


_SPARK_RESULT_TYPES = {"long": "bigint", "int": "int", "double": "double", "float": "float", "string": "string",
                       "boolean": "boolean", "timestamp": "timestamp", "date": "date", "binary": "binary"}


def _result_fields(node: Any, types: dict[str, str]) -> list[tuple[str, str]]:
    """(name, Spark type) of the result columns of a window step."""
    from headrace.aggregates import result_type

    if node.function == "aggregates":
        fields = []
        for name, agg in node.aggs:
            input_type = {"bigint": "long", "int": "int", "double": "double", "float": "float"}.get(
                types.get(agg.column or "", ""), "string" if agg.column else None)
            fields.append((name, _SPARK_RESULT_TYPES.get(result_type(agg, input_type) or "double", "double")))
        return fields
    assert node.result_schema is not None
    return [(name, _SPARK_RESULT_TYPES[type_name]) for name, type_name in node.result_schema]


def _logic(node: Any, value_fields: list[str]) -> WindowLogic:
    from headrace.window_functions import BuiltinAggregates, ProcessWindow, ReduceWindow, UserAggregate

    function: Any = {
        "aggregates": lambda: BuiltinAggregates(node.aggs),
        "reduce": lambda: ReduceWindow(node.fn, [n for n, _ in node.result_schema]),
        "aggregate_function": lambda: UserAggregate(node.fn),
        "process": lambda: ProcessWindow(node.fn),
    }[node.function]()
    return WindowLogic(node.window, node.emission, function)


def uses_test_clock(plan: Any) -> bool:
    """Processing time comes from the test kit's clock when a source says so (TestSource)."""
    return any(getattr(source.connector, "test_clock", False) for source in plan.sources())


def lower_window_processor(node: Any, df: DataFrame, plan: Any) -> DataFrame:
    """The window step as a stateful processor; returns its raw output (panes and late records)."""
    keys = list(node.keys or ())
    event_time = node.event_time or plan.nodes[node.inputs[0]].event_time
    prepared = prepare_input(df, keys, event_time, node.parallelism)
    hidden = {CONTROL_COLUMN, INSTANCE, TIME}
    value_fields = [c for c in prepared.columns if c not in hidden]
    types = dict(prepared.dtypes)
    late = any(c.kind == "late_records" for c in plan.consumers(node.name))
    if node.function == "aggregates" and not late:
        # The records only feed built-in aggregates (no late side output shows them): the
        # processor needs the fields the aggregates read, nothing else.
        read = {agg.column for _, agg in node.aggs if agg.column}
        value_fields = [c for c in value_fields if c in read]
    # Ship the processor only what it reads (each column costs per record in Spark's Python
    # worker): the keys, the records' fields, the control column (it carries the test clock
    # too), the event time in ms when there is one, and the instance.
    needed = {*keys, *value_fields, CONTROL_COLUMN, INSTANCE, TIME}
    prepared = prepared.select(*[F.col(f"`{c}`") for c in prepared.columns if c in needed])
    results = _result_fields(node, types)
    columns = ([f"`{k}` {types[k]}" for k in keys] + ["window_start timestamp", "window_end timestamp",
               "pane_kind string", "pane_index bigint"] + [f"`{n}` {t}" for n, t in results]
               + [f"{OUTPUT_KIND} string", "late_step string", "late_key string", "late_event_time timestamp",
                  "late_window_start timestamp", "late_window_end timestamp", "late_record string"])
    processor = WindowProcessor(node.name, _logic(node, value_fields), keys, value_fields, [n for n, _ in results],
                                late, event_time, prepared.columns, uses_test_clock(plan))
    return prepared.groupBy(INSTANCE).transformWithStateInPandas(
        statefulProcessor=processor, outputStructType=", ".join(columns), outputMode="Append",
        timeMode="EventTime" if event_time else "None")


def window_panes(raw: DataFrame) -> DataFrame:
    """The panes of a window processor's output."""
    return raw.filter(F.col(OUTPUT_KIND) == "pane").drop(OUTPUT_KIND, *LATE_COLUMNS)


def window_late_records(raw: DataFrame) -> DataFrame:
    """The late side output: step, key, event time, the window missed, the record."""
    return raw.filter(F.col(OUTPUT_KIND) == "late").select(
        F.col("late_step").alias("step"), F.col("late_key").alias("key"),
        F.col("late_event_time").alias("event_time"), F.col("late_window_start").alias("window_start"),
        F.col("late_window_end").alias("window_end"), F.col("late_record").alias("record"))
