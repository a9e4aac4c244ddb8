"""De-duplication (``Stream.dedupe``): the checks it must pass as the pipeline is built, and its
node. Spark's ``dropDuplicatesWithinWatermark`` remembers each key from its first record until
the watermark passes that record's event time plus a bound, so a dedupe needs event time; with
``within`` the bound is ``within``, otherwise the watermark's delay. See docs/dedupe.md."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from headrace.durations import to_millis
from headrace.errors import step_error
from headrace.plan.graph import Plan
from headrace.plan.nodes import RESULT_TIME, DedupeNode, Node
from headrace.spark.stages import why_no_event_time

DECLARE = ("declare it with .with_event_time('field', max_out_of_orderness) (or event_time= on the source) "
           "before the dedupe")


def keep_last_refused(time: str) -> str:
    """Why keep='last' is refused, and what keeps the latest record of a key instead."""
    return ("keep='last' is not offered: Spark's de-duplication emits a key's first record as soon as it arrives and "
            "cannot take it back (append mode), so a later record cannot replace it; to keep the latest record of "
            "each key per period, reduce a window: .key_by(...).window(hr.Tumbling(...)).reduce(lambda kept, record: "
            f"record if record[{time!r}] >= kept[{time!r}] else kept), whose result comes when the watermark passes "
            "the window's end")


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
    if keep == "last":
        time = stream.event_time if stream.event_time != RESULT_TIME else None
        raise step_error(step, where, keep_last_refused(time or "ts"))
    if keep != "first":
        raise step_error(step, where, f"keep must be 'first', got {keep!r}")
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
