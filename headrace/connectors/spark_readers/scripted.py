"""TestSource's Spark data source (``headrace_test``): step ``n`` of the script is offset ``n``;
a step is read once the runner has released it (``headrace/connectors/scripted.py``)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.connectors.base import mark_exhausted
from headrace.connectors.scripted import ProcessingTime, Watermark, released_steps, steps_folder
from headrace.contract import CONTROL_COLUMN, clock_control
from headrace.schema import arrow_schema, to_ddl


class TestDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "headrace_test"

    def schema(self) -> str:
        with open(self._data_path(), "rb") as handle:
            schema = pickle.load(handle)["schema"]
        return f"{to_ddl(schema)}, `{CONTROL_COLUMN}` long"

    def _data_path(self) -> str:
        return os.path.join(steps_folder(self.options["hr_run_dir"]), f"{self.options['hr_source']}.pickle")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return TestReader(dict(self.options), self._data_path())


class TestReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str], path: str) -> None:
        self.options, self.path = options, path
        self.total = int(options["steps"])
        self._clocks: list[tuple[int, int]] | None = None

    def initialOffset(self) -> dict[str, int]:
        return {"step": 0}

    def latestOffset(self) -> dict[str, int]:  # type: ignore[override]
        released = min(released_steps(self.options["hr_run_dir"]), self.total)
        if released >= self.total:
            mark_exhausted(self.options)
        offset = {"step": released}
        if self._clocks is None:  # (step, time) of each ProcessingTime marker
            with open(self.path, "rb") as handle:
                steps = pickle.load(handle)["steps"]
            self._clocks = [(n, s.time) for n, s in enumerate(steps) if isinstance(s, ProcessingTime)]
        clocks = [time for step, time in self._clocks if step < released]
        if clocks:  # the test clock so far, for operators' processing time (spark/operator_stage.py)
            offset["clock"] = clocks[-1]
        return offset

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(step) for step in range(start["step"], end["step"])]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        with open(self.path, "rb") as handle:
            data = pickle.load(handle)
        schema = arrow_schema(data["schema"]).append(pa.field(CONTROL_COLUMN, pa.int64()))
        step = data["steps"][partition.value]
        if isinstance(step, Watermark):
            rows = [{CONTROL_COLUMN: step.millis()}]
        elif isinstance(step, ProcessingTime):
            rows = [{CONTROL_COLUMN: clock_control(step.time)}]
        else:
            rows = step
        yield pa.RecordBatch.from_pylist(rows, schema=schema)

    def commit(self, end: dict[str, int]) -> None:
        pass
