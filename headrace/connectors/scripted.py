"""The test kit's connectors: :class:`TestSource` replays explicit micro-batches (with
:class:`Watermark` and :class:`ProcessingTime` markers), :class:`TestSink` collects the rows it
receives. Users import them from ``headrace.testing``, which also runs a pipeline to completion."""

from __future__ import annotations

import datetime
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headrace.contract import (
    FLUSH_TIME_MS,
    Guarantee,
    SinkConnector,
    SourceConnector,
    SourceContext,
)
from headrace.errors import PlanError
from headrace.schema import Schema, schema_of

__all__ = ["ProcessingTime", "TestSink", "TestSource", "Watermark"]


@dataclass(frozen=True)
class ProcessingTime:
    """A marker: move the test clock to ``time`` (ms). A pipeline fed by a TestSource reads
    processing time from this clock (processing-time triggers and timers, state TTL)."""

    time: int


@dataclass(frozen=True)
class Watermark:
    """A marker: move the watermark to ``time`` (epoch ms or a datetime) at this point of the input."""

    time: int | datetime.datetime

    def millis(self) -> int:
        if isinstance(self.time, datetime.datetime):
            moment = self.time if self.time.tzinfo else self.time.replace(tzinfo=datetime.UTC)
            return int(moment.timestamp() * 1000)
        return int(self.time)


def steps_folder(run_dir: str) -> str:
    return os.path.join(run_dir, "test_source")


def released_steps(run_dir: str) -> int:
    """How many steps of the run's TestSources are offered. One count for all of them, written
    at once, so that every micro-batch takes step n of each source together: released source
    by source, a micro-batch planned in between took one source's step without the other's, and
    moved the watermark past records still to come."""
    try:
        with open(os.path.join(steps_folder(run_dir), "steps.released")) as handle:
            return int(handle.read().strip() or 0)
    except FileNotFoundError:
        return 0


def release_step(run_dir: str, sources: Sequence[TestSource]) -> bool:
    """Offer the next step of every TestSource of the run; False when none has a step left."""
    current = released_steps(run_dir)
    if current >= max((source.total_steps for source in sources), default=0):
        return False
    os.makedirs(steps_folder(run_dir), exist_ok=True)
    path = os.path.join(steps_folder(run_dir), "steps.released")
    with open(path + ".tmp", "w") as handle:
        handle.write(str(current + 1))
    os.replace(path + ".tmp", path)
    return True


class TestSource(SourceConnector):
    """A bounded source that replays explicit micro-batches (lists of dicts) and
    :class:`Watermark` markers, one micro-batch per step of the run. Timestamps may be
    given as datetimes or epoch milliseconds. With ``flush=True`` (the default) the input
    ends like any bounded input: every open window fires."""

    __test__ = False  # not a pytest test class
    guarantee = Guarantee.EXACTLY_ONCE
    paced = True
    test_clock = True
    spark_data_source = "headrace.connectors.spark_readers.scripted:TestDataSource"
    other_control_rows = True  # a watermark or clock step is a control row

    @property
    def bounded(self) -> bool:
        return True

    def __init__(self, batches: Sequence[Sequence[dict[str, Any]] | Watermark], *, schema: Any,
                 flush: bool = True) -> None:
        self._schema = schema_of(schema, "TestSource schema")
        self.flush = flush
        self.steps: list[list[dict[str, Any]] | Watermark] = []
        names = dict(self._schema)
        for number, batch in enumerate(batches):
            if isinstance(batch, (Watermark, ProcessingTime)):
                self.steps.append(batch)
                continue
            if isinstance(batch, dict) or not isinstance(batch, Sequence):
                raise PlanError(f"TestSource batch {number}: expected a list of records or a Watermark, got "
                                f"{type(batch).__name__} (wrap single records in a list per micro-batch)")
            rows = []
            for row in batch:
                unknown = set(row) - set(names)
                if unknown:
                    raise PlanError(f"TestSource batch {number}: record {row!r} has fields {sorted(unknown)} that "
                                    f"are not in the schema {list(names)}")
                rows.append({n: _coerce(row.get(n), t) for n, t in self._schema})
            self.steps.append(rows)

    @property
    def total_steps(self) -> int:
        return len(self.steps) + (1 if self.flush else 0)

    def schema(self) -> Schema:
        return self._schema

    def options(self) -> dict[str, str]:
        return {"steps": str(self.total_steps)}

    def describe(self) -> dict[str, Any]:
        return {"type": "TestSource", "batches": len(self.steps), "flush": self.flush}

    def prepare(self, context: SourceContext) -> None:
        os.makedirs(steps_folder(context.run_dir), exist_ok=True)
        steps: list[Any] = list(self.steps) + ([Watermark(FLUSH_TIME_MS)] if self.flush else [])
        with open(os.path.join(steps_folder(context.run_dir), f"{context.source_name}.pickle"), "wb") as handle:
            pickle.dump({"schema": self._schema, "steps": steps}, handle)



def _coerce(value: Any, type_name: str) -> Any:
    if type_name == "timestamp" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    return value


class TestSink(SinkConnector):
    """Collects every row it receives, by batch id (a replayed batch replaces itself), in the
    driver's memory. Timestamps come back as timezone-aware UTC datetimes."""

    __test__ = False
    guarantee = Guarantee.EXACTLY_ONCE
    reads_batch_once = True  # one toArrow()

    def __init__(self) -> None:
        self.batches: dict[int, list[dict[str, Any]]] = {}

    def write_batch(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = df.toArrow().to_pylist()

    def rows(self) -> list[dict[str, Any]]:
        return [row for batch_id in sorted(self.batches) for row in self.batches[batch_id]]

    def describe(self) -> dict[str, Any]:
        return {"type": "TestSink"}
