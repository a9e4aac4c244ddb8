"""The local runner's keyed process steps (on the engine's ``ProcessLogic``) and ``dedupe``
(keep the first record of a key, as Spark's ``dropDuplicatesWithinWatermark``)."""

from __future__ import annotations

from typing import Any

from headrace.code_locations import function_label
from headrace.engine.process_logic import ProcessLogic, ProcessState
from headrace.plan.nodes import RESULT_TIME, DedupeNode, EventTimeNode, KeyedProcessNode
from headrace.testing.local.operators import Operator, Tick, registered
from headrace.testing.local.values import Row, event_millis, visible
from headrace.testing.local.windows import key_of


@registered(KeyedProcessNode)
class ProcessStep(Operator):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        keyed = self.plan.nodes[self.node.inputs[0]]
        self.keys, self.field = tuple(keyed.keys or ()), keyed.event_time
        timed = any(self.plan.nodes[c.name].event_time == RESULT_TIME for c in self.plan.consumers(self.node.name))
        self.logic = ProcessLogic(self.node.name, self.node.fn, self.node.schema, self.field is not None,
                                  function_label(type(self.node.fn).process), timed=True)
        self.timed = timed
        self.state = ProcessState()

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        records = []
        for row in inputs[0]:
            record = visible(row)
            records.append((key_of(record, self.keys), event_millis(row.get(self.field)) if self.field else None,
                            record))
        if self.field is None:
            watermark, ended = None, False
        else:
            watermark, ended = (tick.watermark if tick.watermark > 0 else None), tick.ended
        self.state.clock = max(self.state.clock, tick.clock)
        out = self.logic.run(self.state, records, watermark, self.state.clock, ended)
        names = [n for n, _ in self.node.schema or ()]
        rows = []
        for values in out:
            row = dict(zip(names, values[:-1]))
            if values[-1] is not None:
                row[RESULT_TIME] = values[-1]
            rows.append(row)
        return rows


@registered(DedupeNode)
class DedupeStep(Operator):
    """The first record of each key passes; the key is remembered until a micro-batch runs with the
    watermark at or past its first record's time + ``within``; a record behind the watermark is late
    and dropped (docs/dedupe.md)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        field = self.event_time_of()
        assert field is not None  # the plan refuses a dedupe without event time
        self.field: str = field
        self.within = self.node.within_ms if self.node.within_ms is not None else self._delay()
        self.expiries: dict[tuple[Any, ...], int] = {}

    def _delay(self) -> int:
        for name in [self.node.inputs[0], *self.plan.upstream(self.node.inputs[0])]:
            node = self.plan.nodes[name]
            if isinstance(node, EventTimeNode) and node.event_time == self.field:
                return node.delay_ms
        return 0

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        out = []
        for row in inputs[0]:
            t = event_millis(row.get(self.field))
            if t is None:
                continue
            if tick.late_watermark > 0 and row[self.field].timestamp() * 1000 <= tick.late_watermark:
                tick.late_dropped[self.node.name] = tick.late_dropped.get(self.node.name, 0) + 1
                continue
            key = tuple(row.get(k) for k in self.node.on)
            if key in self.expiries:
                continue
            self.expiries[key] = t + self.within
            out.append(row)
        if tick.watermark > 0:
            self.expiries = {k: e for k, e in self.expiries.items() if e > tick.watermark}
        return out
