"""What every step of the local runner shares: the :class:`Tick` a micro-batch runs with, the
:class:`Operator` base class and the registry of operators by node class."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headrace.contract import END_OF_INPUT_MS
from headrace.plan.graph import Plan
from headrace.plan.nodes import Node
from headrace.testing.local.values import Row


@dataclass
class Tick:
    """One micro-batch: the watermark it runs with (Spark's, in ms: 0 before the first), the test
    clock, and the control rows (event times in ms) each source sent in it. A step after a join of
    two streams gets the watermark the join holds back (``joins.watermark_lags``)."""

    watermark: int
    clock: int
    batch_id: int = 0
    clock_moved: bool = False
    controls: dict[str, list[int]] = field(default_factory=dict)
    late_dropped: dict[str, int] = field(default_factory=dict)  # step -> records it dropped as late
    previous: int | None = None  # the watermark of the micro-batch before (None: the same)

    @property
    def late_watermark(self) -> int:
        """The watermark Spark judges a stateful step's input late by: the micro-batch before's
        (Spark's ``eventTimeWatermarkForLateEvents`` in a query of several stateful steps). In a
        micro-batch with data it equals the batch's own; in one without, the step reads only the
        results an earlier step let out, which the batch's watermark must not judge."""
        return self.watermark if self.previous is None else self.previous

    @property
    def event_watermark(self) -> float:
        """The watermark as the engine reads it: -inf before the first, inf at the end of the input."""
        if self.watermark >= END_OF_INPUT_MS:
            return math.inf
        return self.watermark if self.watermark > 0 else -math.inf

    @property
    def ended(self) -> bool:
        return self.watermark >= END_OF_INPUT_MS


class Operator:
    """One step of the plan, with whatever it keeps between micro-batches."""

    def __init__(self, node: Any, plan: Plan, operators: dict[str, Operator]) -> None:
        self.node, self.plan, self.operators = node, plan, operators

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        raise NotImplementedError

    def event_time_of(self, index: int = 0) -> str | None:
        """The event-time field of the step's ``index``-th input."""
        return self.plan.nodes[self.node.inputs[index]].event_time


OPERATORS: dict[type[Node], type[Operator]] = {}


def registered(*kinds: type[Node]) -> Callable[[type[Operator]], type[Operator]]:
    """Class decorator: the operator that runs nodes of ``kinds``."""
    def register(operator: type[Operator]) -> type[Operator]:
        for kind in kinds:
            OPERATORS[kind] = operator
        return operator
    return register
