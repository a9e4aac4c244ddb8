"""The keyed process step on Spark's ``transformWithStateInPandas`` with the RocksDB state store.

As for windows (``headrace/spark/windows.py``), records are grouped by operator instance (a
stable hash of the key modulo ``parallelism``) and each instance keeps the
:class:`~headrace.process.ProcessState` of all its keys in one value-state cell, loaded and
stored once per micro-batch, so Spark checkpoints it with the batch. When the stream has
event time, one Spark event-time timer per instance wakes it for its earliest event-time
timer. Spark's processing-time mode is not used: it runs a micro-batch after every
micro-batch, forever, so a bounded input would never settle; processing-time timers are
checked whenever an instance runs. Processing time is the micro-batch's timestamp (Spark
keeps it on a replay), or the test clock when a ``TestSource`` feeds the pipeline.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor

from headrace.connectors.base import CONTROL_COLUMN, FLUSH_TIME_MS
from headrace.plan.nodes import function_label
from headrace.process import EVENT_TIME, ProcessLogic, ProcessState, to_watermark
from headrace.schema import to_ddl
from headrace.spark.windows import INSTANCE, TIME, output_frame, prepare_input, read_input, uses_test_clock

NOW = "_hr_now"


class KeyedProcessDriver(StatefulProcessor):
    """Feeds one instance's micro-batch, or its timer, to the process function."""

    def __init__(self, logic: ProcessLogic, keys: list[str], value_fields: list[str], event_time: str | None,
                 columns: list[str], test_clock: bool) -> None:
        self.logic, self.keys, self.value_fields, self.event_time = logic, keys, value_fields, event_time
        self.columns, self.test_clock = columns, test_clock
        self.timestamps = [f for f, kind in logic.output if kind == "timestamp"]

    def init(self, handle: Any) -> None:
        self.handle = handle
        self.cell = handle.getValueState("process_state", "state binary")

    def _load(self) -> ProcessState:
        return pickle.loads(self.cell.get()[0]) if self.cell.exists() else ProcessState()

    def _clock(self, state: ProcessState, timer_values: Any, batch_time: int) -> int:
        if self.test_clock:
            return state.clock
        return max(timer_values.getCurrentProcessingTimeInMs(), batch_time, 0)  # Spark gives -1 without event time

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
        state = self._load()
        records: list[tuple[Any, int | None, dict[str, Any]]] = []
        batch_time = 0
        for frame in rows:
            read, clock = read_input(frame, self.columns, self.keys, self.value_fields, untimed=None)
            batch_time = max(batch_time, int(frame[NOW].max()))  # read_input named the columns
            records.extend(read)
            if clock is not None and self.test_clock:
                state.clock = max(state.clock, clock)
        yield self._run(state, records, timerValues, batch_time)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        yield self._run(self._load(), [], timerValues, 0)

    def _run(self, state: ProcessState, records: list[Any], timer_values: Any, batch_time: int) -> pd.DataFrame:
        watermark, ended = (to_watermark(timer_values.getCurrentWatermarkInMs(), FLUSH_TIME_MS)
                            if self.event_time else (None, False))
        rows = self.logic.run(state, records, watermark, self._clock(state, timer_values, batch_time), ended)
        self.cell.update((pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL),))
        self._wake(state)
        return output_frame(rows, self.logic.fields, self.timestamps)

    def _wake(self, state: ProcessState) -> None:
        """Register the Spark timer of the instance's earliest event-time timer."""
        if not self.event_time:
            return  # Spark has no timers without event time (see the module's docstring)
        upcoming = self.logic.next_timer(state, EVENT_TIME)
        if upcoming is not None and upcoming not in set(self.handle.listTimers()):
            self.handle.registerTimer(max(upcoming, 0))

    def close(self) -> None:
        pass


def lower_keyed_process(node: Any, df: DataFrame, plan: Any) -> DataFrame:
    """The keyed process step as a stateful processor; returns its output records."""
    keyed = plan.nodes[node.inputs[0]]
    keys, event_time = list(keyed.keys or ()), keyed.event_time
    prepared = prepare_input(df, keys, event_time, node.parallelism)
    prepared = prepared.withColumn(NOW, F.unix_millis(F.current_timestamp()))  # the batch's, kept on replay
    hidden = {CONTROL_COLUMN, INSTANCE, TIME, NOW}
    value_fields = [c for c in prepared.columns if c not in hidden]
    label = function_label(type(node.fn).process)
    logic = ProcessLogic(node.name, node.fn, node.schema, event_time is not None, label)
    driver = KeyedProcessDriver(logic, keys, value_fields, event_time, prepared.columns, uses_test_clock(plan))
    return prepared.groupBy(INSTANCE).transformWithStateInPandas(
        statefulProcessor=driver, outputStructType=to_ddl(node.schema), outputMode="Append",
        timeMode="EventTime" if event_time else "None")
