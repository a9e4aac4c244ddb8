"""The local runner: a pipeline of fluent steps run in plain Python, micro-batch by micro-batch,
with Spark's watermark (see docs/testing.md, "Testing without a JVM").

Step ``n`` of every TestSource is micro-batch ``n``, run through the plan's steps in order with
the watermark the batches before it left. The watermark is each event-time step's largest event
time seen minus its max out-of-orderness (0 until it has seen a row), the smallest of them,
never moving back. After a batch that moved it, a batch without data runs with the new
watermark, as Spark's does: it fires the windows and timers the watermark passed. A step after
an interval join runs with that watermark held back by the join (``joins.watermark_lags``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from headrace.connectors.scripted import ProcessingTime, TestSink, TestSource, Watermark
from headrace.contract import FLUSH_TIME_MS
from headrace.plan.graph import Plan
from headrace.testing.local import joins, process, stateless, windows  # noqa: F401 - they register their operators
from headrace.testing.local.joins import watermark_lags
from headrace.testing.local.operators import OPERATORS, Operator, Tick
from headrace.testing.local.refusals import refuse
from headrace.testing.local.stateless import EventTimeStep, SourceStep
from headrace.testing.local.values import Row


@dataclass
class BatchReport:
    """One micro-batch the local runner ran: the watermark it ran with (ms), whether it carried
    data (a step of the sources) and the records each step dropped as late."""

    watermark: int
    data: bool
    late_dropped: dict[str, int] = field(default_factory=dict)


class LocalRun:
    """A pipeline's run in plain Python: its sinks' rows, its micro-batches, its late drops."""

    def __init__(self, pipeline: Any) -> None:
        self.plan: Plan = pipeline.plan
        refuse(self.plan)
        self.operators: dict[str, Operator] = {}
        for node in self.plan.nodes.values():
            self.operators[node.name] = OPERATORS[type(node)](node, self.plan, self.operators)
        self.sources = {n.name: n.connector for n in self.plan.sources()}
        self.watermark = 0
        self.lags = watermark_lags(self.plan)
        self.clock = 0
        self.batches: list[BatchReport] = []

    @property
    def late_rows_dropped(self) -> int:
        return sum(sum(b.late_dropped.values()) for b in self.batches)

    def steps(self) -> int:
        return max((c.total_steps for c in self.sources.values() if isinstance(c, TestSource)), default=0)

    def run(self, on_step: Callable[[LocalRun], None] | None = None) -> LocalRun:
        """Every step of the sources, each settled (its batch without data run) before the next."""
        for number in range(self.steps()):
            self.step(number)
            if on_step is not None:
                on_step(self)
        return self

    def step(self, number: int) -> None:
        tick = Tick(self.watermark, self.clock, len(self.batches))
        for name, connector in self.sources.items():
            steps: list[Any] = list(connector.steps) + ([Watermark(FLUSH_TIME_MS)] if connector.flush else [])
            if number >= len(steps):
                continue
            item = steps[number]
            source = self.operators[name]
            assert isinstance(source, SourceStep)
            if isinstance(item, Watermark):
                tick.controls.setdefault(name, []).append(item.millis())
            elif isinstance(item, ProcessingTime):
                tick.controls.setdefault(name, []).append(0)  # a clock row counts as time 0 for the watermark
                if item.time > tick.clock:
                    tick.clock, tick.clock_moved = item.time, True
            else:
                source.pending = list(item)
        self.clock = tick.clock
        self._batch(tick, data=True)
        moved = self._next_watermark()
        if moved > self.watermark:
            self.watermark = moved
            self._batch(Tick(self.watermark, self.clock, len(self.batches)), data=False)

    def _batch(self, tick: Tick, data: bool) -> None:
        outputs: dict[str, list[Row]] = {}
        previous = self.batches[-1].watermark if self.batches else tick.watermark
        for name, node in self.plan.nodes.items():
            inputs = [outputs.get(i, []) for i in node.inputs]
            outputs[name] = self.operators[name].run(inputs, self._tick_of(name, tick, previous))
        self.batches.append(BatchReport(tick.watermark, data, dict(tick.late_dropped)))

    def _tick_of(self, name: str, tick: Tick, previous: int) -> Tick:
        """The micro-batch as step ``name`` sees it: the watermarks held back by the joins before it
        (one not yet set stays unset)."""
        lag = self.lags[name]
        return replace(tick, watermark=tick.watermark - lag if tick.watermark > 0 else 0,
                       previous=previous - lag if previous > 0 else 0)

    def _next_watermark(self) -> int:
        proposed = [op.proposed_watermark() for op in self.operators.values() if isinstance(op, EventTimeStep)]
        return max(self.watermark, min(proposed)) if proposed else self.watermark

    def sink_rows(self) -> dict[str, list[dict[str, Any]]]:
        """Each TestSink's rows by sink name, as ``run_to_completion`` returns them."""
        return {node.name: node.connector.rows() for node in self.plan.sinks() if isinstance(node.connector, TestSink)}


def run_locally(pipeline: Any, *, on_step: Callable[[LocalRun], None] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Run ``pipeline`` in plain Python, without Spark, to the end of its TestSources; returns each
    TestSink's rows by sink name, as ``run_to_completion`` does. A step the local runner cannot run
    is refused before anything runs. ``on_step(run)`` is called after each step of the sources
    settles (``run`` is the :class:`LocalRun`)."""
    return LocalRun(pipeline).run(on_step).sink_rows()
