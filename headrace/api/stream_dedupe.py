"""De-duplication (``Stream.dedupe``): the checks it must pass as the pipeline is built, and its
node. Spark's ``dropDuplicatesWithinWatermark`` remembers each key from its first record until
the watermark passes that record's event time plus a bound, so a dedupe needs event time; with
``within`` the bound is ``within``, otherwise the watermark's delay. ``keep="last"`` holds each
key's latest record for that long instead, on a process step (``KeepLast``). See docs/dedupe.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headrace.durations import to_millis
from headrace.errors import step_error
from headrace.plan.graph import Plan
from headrace.plan.nodes import DedupeNode, Node
from headrace.process import KeyedProcessFunction
from headrace.schema import UNKNOWN
from headrace.spark.stages import why_no_event_time
from headrace.spark.watermarks import WatermarkPlacement
from headrace.state import ValueState

DECLARE = ("declare it with .with_event_time('field', max_out_of_orderness) (or event_time= on the source) "
           "before the dedupe")


class KeepLast(KeyedProcessFunction):
    """``dedupe(keep="last")``: a key's first record opens a period that ends when the watermark
    passes its event time + ``within``; the key's records that arrive in it are held, the one with
    the latest event time (of equal ones, the last to arrive) replacing the others, and emitted
    when the period ends, at its end. A record after that opens the next period; a late one (at or
    before the watermark) is dropped."""

    kept = ValueState()  # (event time in ms, record)

    def __init__(self, within_ms: int) -> None:
        self.within_ms = within_ms

    def process(self, record: dict[str, Any], ctx: Any) -> None:
        if ctx.watermark is not None and ctx.timestamp <= ctx.watermark:
            return  # late, as Spark's de-duplication drops it; so each period ends after the batch it began in
        kept = self.kept.get()
        if kept is None:
            ctx.register_event_time_timer(ctx.timestamp + self.within_ms)
        if kept is None or ctx.timestamp >= kept[0]:
            self.kept.set((ctx.timestamp, record))

    def on_timer(self, timer: Any, ctx: Any) -> None:
        _, record = self.kept.get()
        self.kept.clear()
        ctx.emit(record)


def dedupe_keys(keys: Any, step: str, where: str) -> tuple[str, ...]:
    """The key fields: a field name or a list of them."""
    if isinstance(keys, str) and keys:
        return (keys,)
    if isinstance(keys, Sequence) and keys and all(isinstance(k, str) and k for k in keys):
        if len(set(keys)) < len(keys):
            raise step_error(step, where, f"a key field is named twice in {list(keys)!r}")
        return tuple(keys)
    raise step_error(step, where, f"keys must be a field name or a list of field names (the fields two records "
                                  f"share when they are duplicates), got {keys!r}")


def dedupe_node(plan: Plan, stream: Node, keys: Any, within: Any, keep: Any, step: str,
                where: str) -> DedupeNode:
    """The node of ``stream`` de-duplicated on ``keys``, refused as the pipeline is built when
    Spark could not run it or would remember its keys forever."""
    if keep not in ("first", "last"):
        raise step_error(step, where, f"keep must be 'first' or 'last', got {keep!r}")
    on = dedupe_keys(keys, step, where)
    if stream.schema is not None:
        names = [n for n, _ in stream.schema]
        missing = [k for k in on if k not in names]
        if missing:
            raise step_error(step, where, f"unknown key field {missing[0]!r}; the stream from {stream.name!r} has "
                                          f"{', '.join(names)}")
    within_ms = None
    if within is not None:
        within_ms = to_millis(within, f"step '{step}' within")
        if within_ms < 0:
            raise step_error(step, where, f"within must not be negative, got {within!r}")
    if stream.event_time is None:
        why = why_no_event_time(plan, stream.name)
        what = (f"the stream from {stream.name!r} has no event time: {why}" if why else
                f"the stream from {stream.name!r} has no event time; {DECLARE}")
        if within is None:
            raise step_error(step, where, f"{what}. Without event time Spark would remember every key for ever "
                                          "(its dropDuplicates); with it, give within= how long a key is remembered "
                                          "past its first record, e.g. within='1h'")
        raise step_error(step, where, f"{what}. A dedupe forgets a key when the watermark passes its first "
                                      "record's event time + within")
    return DedupeNode(step, (stream.name,), where, stream.schema, stream.event_time, on=on, within_ms=within_ms)


def keep_last(plan: Plan, stream: Node, within_ms: int | None, step: str, where: str) -> KeepLast:
    """The process function of ``dedupe(keep="last")`` on ``stream`` (checked by ``dedupe_node``):
    its period is ``within`` or, without it, the max out-of-orderness declared upstream."""
    if stream.schema is None or UNKNOWN in dict(stream.schema).values():
        raise step_error(step, where, "keep='last' needs the stream's fields and their types, which it emits; "
                                      "declare them with a map(..., schema=...) before the dedupe")
    period = within_ms if within_ms is not None else WatermarkPlacement(plan).watermark_delay(stream.name)
    if period is None:
        raise step_error(step, where, "keep='last' on the results of a stateful step needs within=, how long a "
                                      "key's period lasts past its first record, e.g. within='1h'")
    return KeepLast(period)
