"""The keyed process step on Spark's ``transformWithStateInPandas`` with the RocksDB state store.

Grouped by the step's key (``headrace/spark/stateful.py``): each key keeps its own
:class:`~headrace.engine.process_logic.ProcessState` (its state cells and timers) under its key. When the
stream has event time, one Spark event-time timer per key wakes it for its earliest
event-time timer. Spark's processing-time mode is not used: it cannot be combined with
event-time timers; processing-time timers fire when their key next runs (a record or an
event-time timer of the key) once processing time has passed them. Processing time is the
micro-batch's timestamp (Spark keeps it on a replay), or the test clock when a
``TestSource`` feeds the pipeline. When every declared state has a time-to-live, Spark's own
TTL evicts the state of a key that goes quiet, so keys that stop coming cost nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

from headrace.code_locations import function_label
from headrace.contract import CONTROL_COLUMN, DRIFT_METRIC_PREFIX, END_OF_INPUT_MS
from headrace.engine.process_logic import ProcessLogic, ProcessState, to_watermark
from headrace.lazy_modules import LazyModule
from headrace.ml.online import DRIFT, OnlineLearner
from headrace.plan.nodes import RESULT_TIME, KeyedProcessNode
from headrace.process import EVENT_TIME
from headrace.schema import to_ddl
from headrace.spark.clocks import spark_ttl, uses_test_clock
from headrace.spark.stateful import (
    GROUP,
    SEQUENCE,
    TIME,
    KeyCell,
    clock_keys,
    exact_integers,
    group_frame,
    grouping_columns,
    integer_fields,
    key_value,
    output_frame,
    prepare_input,
    read_group,
)

if TYPE_CHECKING:
    import pandas as pd

    from headrace.spark.compilation import Compilation
else:
    pd = LazyModule("pandas")  # imported on first use: building and checking a plan needs no pandas

NOW = "_hr_now"


class KeyedProcessDriver(StatefulProcessor):
    """Feeds one key's records of a micro-batch, or its timer, to the process function."""

    def __init__(self, logic: ProcessLogic, keys: list[str], value_fields: list[str], integers: frozenset[str],
                 event_time: str | None, columns: list[str], test_clock: bool, ttl_ms: int | None) -> None:
        self.logic, self.keys, self.value_fields, self.event_time = logic, keys, value_fields, event_time
        self.integers, self.test_clock, self.ttl_ms = integers, test_clock, ttl_ms
        self.columns = pd.Index(columns)
        timed = [RESULT_TIME] if logic.timed else []  # the event time of each record, last
        self.timestamps = [f for f, kind in logic.output if kind == "timestamp"] + timed
        self.fields = logic.fields + timed

    def init(self, handle: Any) -> None:
        self.cell = KeyCell(handle, "process_state", self.ttl_ms)

    def _clock(self, state: ProcessState, timer_values: Any, batch_time: int) -> int:
        if self.test_clock:
            return state.clock
        return max(timer_values.getCurrentProcessingTimeInMs(), batch_time, 0)  # Spark gives -1 without event time

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
        state = self.cell.load() or ProcessState()
        frame = group_frame(rows, self.columns)
        records, clock = read_group(frame, self.value_fields, self.integers, key_value(key, self.keys, self.integers),
                                     untimed=None)
        batch_time = int(frame[NOW].max())
        if clock is not None and self.test_clock:
            state.clock = max(state.clock, clock)
        out = self._run(state, list(records), timerValues, batch_time)
        if out is not None:
            yield out

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        state = self.cell.load(fired_timer=expiredTimerInfo.getExpiryTimeInMs())
        if state is None:
            return
        out = self._run(state, [], timerValues, 0)
        if out is not None:
            yield out

    def _run(self, state: ProcessState, records: list[Any], timer_values: Any, batch_time: int) -> pd.DataFrame | None:
        raw_watermark = timer_values.getCurrentWatermarkInMs()
        watermark, ended = to_watermark(raw_watermark, END_OF_INPUT_MS) if self.event_time else (None, False)
        rows = self.logic.run(state, records, watermark, self._clock(state, timer_values, batch_time), ended)
        upcoming = self.logic.next_timer(state, EVENT_TIME) if self.event_time else None
        forget = not state.cells and not state.timers and not self.test_clock
        self.cell.save(None if forget else state, upcoming, raw_watermark)
        return output_frame(rows, self.fields, self.timestamps) if rows else None

    def close(self) -> None:
        pass


def lower_process(node: KeyedProcessNode, lowering: Compilation) -> DataFrame:
    """The keyed process step as a stateful processor; returns its output records."""
    df, plan = lowering.input(node), lowering.plan
    assert node.schema is not None  # a process step declares its output schema
    keyed = plan.nodes[node.inputs[0]]
    keys, event_time = list(keyed.keys or ()), keyed.event_time
    prepared = prepare_input(df, keys, event_time, clock_keys(plan, keys))
    prepared = prepared.withColumn(NOW, F.unix_millis(F.current_timestamp()))  # the batch's, kept on replay
    hidden = {CONTROL_COLUMN, TIME, NOW, SEQUENCE, GROUP, RESULT_TIME}
    value_fields = [c for c in prepared.columns if c not in hidden]
    integers = integer_fields(prepared, value_fields)
    prepared = exact_integers(prepared, integers)
    label = function_label(type(node.fn).process)
    timed = lowering.result_time(node)  # a later stateful step reads the records with their event time
    logic = ProcessLogic(node.name, node.fn, node.schema, event_time is not None, label, timed)
    test_clock = uses_test_clock(plan)
    ttl_ms = spark_ttl(plan, node)
    driver = KeyedProcessDriver(logic, keys, value_fields, integers, event_time, prepared.columns, test_clock,
                                ttl_ms)
    time_mode = "EventTime" if event_time else "ProcessingTime" if ttl_ms is not None else "None"
    output = to_ddl(node.schema) + (f", {RESULT_TIME} timestamp" if timed else "")
    result = prepared.groupBy(*[F.col(f"`{c}`") for c in grouping_columns(keys)]).transformWithStateInPandas(
        statefulProcessor=driver, outputStructType=output, outputMode="Append", timeMode=time_mode,
        eventTimeColumnName=RESULT_TIME if timed else "")
    if isinstance(node.fn, OnlineLearner) and node.fn.detect_drift:  # each batch's drift flags, for the metrics
        flags = F.sum(F.col(DRIFT).cast("long")).alias("drift_flags")
        result = result.observe(f"{DRIFT_METRIC_PREFIX}{node.name}", flags)
    return result
