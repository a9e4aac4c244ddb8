"""The local runner's joins of two streams, with the rules of Spark's stream-stream join
(``StreamingSymmetricHashJoinExec``; docs/joins.md):

* each side's records of a micro-batch are judged late, dropped and counted when their event
  time (a window join: their window's end) is at or before the watermark late records are
  judged by (``Tick.late_watermark``);
* the left side's records then meet the right side's held records, and the right side's
  records meet the left side's, this micro-batch's included: each pair once;
* a record is held unless the watermark already shows that nothing can match it;
* at the end of the micro-batch the records nothing can match any more are let go, an
  unmatched one of an outer join's kept side coming out with the other side's fields null.

An interval join (``right - left`` in ``[lower, upper]``) lets a left record go once it is at or
before ``watermark - upper - 1``, a right one at or before ``watermark + lower - 1`` (Spark's
state watermarks, one ms short for each bound included); a window join lets a record go once the
watermark reaches its window's end. So Spark's watermark after an interval join trails the one
before it by ``max(upper, -lower) + 1`` ms (``held_back``), and after a window join by nothing.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from typing import Any

from headrace.plan.graph import Plan
from headrace.plan.nodes import (
    JOIN_WINDOW_FIELDS,
    DedupeNode,
    KeyedProcessNode,
    Node,
    RollingAggregateNode,
    StreamJoinNode,
    WindowAggregateNode,
)
from headrace.testing.local.operators import Operator, Tick, registered
from headrace.testing.local.values import Row, conform_row, event_millis, from_millis

SIDES = ("left", "right")
STATEFUL = (WindowAggregateNode, KeyedProcessNode, DedupeNode, RollingAggregateNode)
KEEPS = {"inner": (), "left": ("left",), "right": ("right",), "full": ("left", "right")}


def held_back(node: Node) -> int:
    """How far (ms) Spark's watermark after ``node`` trails the one before it: after an interval
    join, its state watermarks' lag, ``max(upper, -lower) + 1``; after anything else, nothing."""
    if not isinstance(node, StreamJoinNode) or node.window is not None:
        return 0
    return max(node.upper_ms + 1, 1 - node.lower_ms)


def watermark_lags(plan: Plan) -> dict[str, int]:
    """How far (ms) the watermark each step runs with trails the pipeline's: the joins before it
    hold it back (over several inputs, the most held back)."""
    lags: dict[str, int] = {}
    for name, node in plan.nodes.items():  # in the plan's order: every input before its step
        lags[name] = max((lags[i] + held_back(plan.nodes[i]) for i in node.inputs), default=0)
    return lags


def reads_a_join(plan: Plan, node: Node) -> bool:
    """Whether ``node`` reads a join of two streams' results (through stateless steps)."""
    todo, seen = list(node.inputs), set()
    while todo:
        upstream = plan.nodes[todo.pop()]
        if upstream.name in seen:
            continue
        seen.add(upstream.name)
        if isinstance(upstream, StreamJoinNode):
            return True
        if not isinstance(upstream, STATEFUL):
            todo.extend(upstream.inputs)
    return False


@dataclass
class Held:
    """A side's record in the join's state: its key, its event time (ms), whether it has met a
    record of the other side."""

    key: tuple[Any, ...]
    time: int
    row: Row
    matched: bool = False


@registered(StreamJoinNode)
class StreamJoinStep(Operator):
    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.times: dict[str, str] = {}
        for number, side in enumerate(SIDES):
            time = self.event_time_of(number)
            assert time is not None  # the plan refuses a join of a stream without event time
            self.times[side] = time
        self.keys = {"left": self.node.left_on, "right": self.node.right_on}
        self.fields = {side: [n for n, _ in self.plan.nodes[self.node.inputs[number]].schema or ()]
                       for number, side in enumerate(SIDES)}
        self.types = {side: dict(self.plan.nodes[self.node.inputs[number]].schema or ())
                      for number, side in enumerate(SIDES)}
        self.held: dict[str, list[Held]] = {"left": [], "right": []}
        self.late_rows: list[Row] = []

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        self.late_rows = []
        out: list[Row] = []
        for number, side in enumerate(SIDES):
            for row in inputs[number]:
                self._arrive(side, row, tick, out)
        for side in SIDES:
            self._let_go(side, tick.watermark, out)
        return out

    # -- a record arrives ---------------------------------------------------------------------------
    def _arrive(self, side: str, row: Row, tick: Tick, out: list[Row]) -> None:
        time = event_millis(row.get(self.times[side]))
        if time is None:
            return
        if tick.late_watermark > 0 and self._judged_time(time) <= tick.late_watermark:
            tick.late_dropped[self.node.name] = tick.late_dropped.get(self.node.name, 0) + 1
            self.late_rows.append(self._late_row(side, row))
            return
        record = Held(tuple(row.get(k) for k in self.keys[side]), time, row)
        other = "right" if side == "left" else "left"
        if None not in record.key:  # SQL's equality: a null key matches nothing
            for held in self.held[other]:
                if held.key == record.key and self._match(record, held, side):
                    held.matched = record.matched = True
                    out.append(self._pair(record.row, held.row) if side == "left" else self._pair(held.row, record.row))
        if not self._gone(side, record.time, tick.watermark):
            self.held[side].append(record)

    def _match(self, record: Held, held: Held, side: str) -> bool:
        left, right = (record, held) if side == "left" else (held, record)
        window = self.node.window
        if window is not None:
            return window.assign(left.time) == window.assign(right.time)
        return self.node.lower_ms <= right.time - left.time <= self.node.upper_ms

    def _judged_time(self, time: int) -> int:
        """What Spark compares with the watermark: the event time, or in a window join its window's end."""
        window = self.node.window
        return time if window is None else window.assign(time)[0][1]

    def _gone(self, side: str, time: int, watermark: int) -> bool:
        """Whether nothing can match a record of ``side`` at ``time`` any more (Spark's state watermarks)."""
        if self.node.window is not None:
            return self._judged_time(time) <= watermark
        if side == "left":
            return time <= watermark - self.node.upper_ms - 1
        return time <= watermark + self.node.lower_ms - 1

    # -- the end of a micro-batch ---------------------------------------------------------------------
    def _let_go(self, side: str, watermark: int, out: list[Row]) -> None:
        kept = []
        for held in self.held[side]:
            if not self._gone(side, held.time, watermark):
                kept.append(held)
            elif not held.matched and side in KEEPS[self.node.how]:
                out.append(self._pair(held.row, None) if side == "left" else self._pair(None, held.row))
        self.held[side] = kept

    # -- what comes out -------------------------------------------------------------------------------
    def _pair(self, left: Row | None, right: Row | None) -> Row:
        """The left record's fields, then the right's (a key of the same name on both sides once,
        from the side the record came from), then a window join's window."""
        shared = {a for a, b in zip(self.node.left_on, self.node.right_on) if a == b}
        row: Row = {name: None if left is None else left.get(name) for name in self.fields["left"]}
        for name in shared:
            if right is not None and (left is None or self.node.how == "right"):
                row[name] = right.get(name)
        row.update({name: None if right is None else right.get(name)
                    for name in self.fields["right"] if name not in shared})
        window = self.node.window
        if window is not None:
            side, record = ("left", left) if left is not None else ("right", right)
            assert record is not None
            start, end = window.assign(event_millis(record[self.times[side]]) or 0)[0]
            row.update(zip(JOIN_WINDOW_FIELDS, (from_millis(start), from_millis(end))))
        return conform_row(row, self.node.schema)

    def _late_row(self, side: str, row: Row) -> Row:
        keys, types = self.keys[side], self.types[side]
        key = (spark_text(row.get(keys[0])) if len(keys) == 1
               else spark_json([(k, row.get(k), types.get(k)) for k in keys]))
        return {"step": self.node.name, "side": side, "key": key, "event_time": row.get(self.times[side]),
                "record": spark_json([(n, row.get(n), types.get(n)) for n in self.fields[side]])}


def spark_text(value: Any) -> str | None:
    """``value`` cast to a string as Spark casts it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        text = value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
        return text + (f".{value.microsecond:06d}".rstrip("0") if value.microsecond else "")
    return str(value)


def spark_json(fields: list[tuple[str, Any, str | None]]) -> str:
    """A struct of ``(name, value, type)`` as Spark's ``to_json`` writes it (null fields left out,
    a timestamp in ISO 8601 with milliseconds, in UTC)."""
    def plain(value: Any) -> Any:
        if isinstance(value, datetime.datetime):
            moment = value.astimezone(datetime.UTC)
            return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
        return value

    return json.dumps({name: plain(value) for name, value, _ in fields if value is not None},
                      separators=(",", ":"), ensure_ascii=False)
