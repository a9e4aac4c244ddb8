"""Joins of two streams (``Stream.join`` with a stream): the checks a join must pass as the
pipeline is built, and its node. Spark keeps both sides' records in its state store until the
watermark says no match can come, so every join is bounded in event time: an interval join
(``within``) or a window join (``window``). See docs/joins.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headrace.durations import to_millis
from headrace.errors import step_error
from headrace.plan.nodes import JOIN_WINDOW_FIELDS, RESULT_TIME, Node, StreamJoinNode
from headrace.schema import UNKNOWN, Schema
from headrace.windows import Tumbling

JOIN_KINDS = ("inner", "left", "right", "full")
KEPT_UNTIL = ("a join of two streams keeps every record of both sides in Spark's state until the watermark shows "
              "that no match can come")
NO_BOUND = (f"{KEPT_UNTIL}, so it needs a bound in event time: within=(lower, upper) (an interval join: "
            "the right record's event time minus the left's lies in [lower, upper], e.g. within=('-10s', '10s')) or "
            "window=hr.Tumbling(...) (a window join: both records in the same window)")


def join_keys(on: Any, step: str, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The left and the right key fields of ``on``: a field name, a list of them (the same on
    both sides), or a mapping from left field to right field."""
    if isinstance(on, str):
        return (on,), (on,)
    if isinstance(on, Mapping) and on and all(isinstance(k, str) and isinstance(v, str) for k, v in on.items()):
        return tuple(on), tuple(on.values())
    if isinstance(on, Sequence) and on and all(isinstance(k, str) for k in on):
        return tuple(on), tuple(on)
    raise step_error(step, where, f"on must be a field name, a list of field names or a mapping from the left "
                                  f"stream's fields to the right's (on={{'seller': 'id'}}), got {on!r}")


def join_bound(within: Any, window: Any, step: str, where: str) -> tuple[int, int, Tumbling | None]:
    """(lower ms, upper ms, window) of a join: the interval the right record's event time may lie
    in, relative to the left's; for a window join (0, 0, the window): Spark joins it on equal
    windows, and judges each record by its window's end."""
    if within is not None and window is not None:
        raise step_error(step, where, "give within= or window=, not both")
    if window is not None:
        if not isinstance(window, Tumbling):
            raise step_error(step, where, f"a window join takes tumbling windows (hr.Tumbling), got "
                                          f"{type(window).__name__}: in sliding or session windows a pair of "
                                          "records would meet in several windows, or in none known in advance")
        return 0, 0, window
    if within is None:
        raise step_error(step, where, NO_BOUND)
    if isinstance(within, (tuple, list)):
        if len(within) != 2:
            raise step_error(step, where, f"within must be (lower, upper), got {within!r}")
        lower = to_millis(within[0], f"step '{step}' within lower bound")
        upper = to_millis(within[1], f"step '{step}' within upper bound")
    else:
        span = to_millis(within, f"step '{step}' within")
        if span < 0:
            raise step_error(step, where, f"within must not be negative, got {within!r}; give (lower, upper) for "
                                          "an interval that is not symmetric")
        lower, upper = -span, span
    if lower > upper:
        raise step_error(step, where, f"within's lower bound ({within[0]!r}) is after its upper bound "
                                      f"({within[1]!r})")
    return lower, upper, None


def _event_time(stream: Node, side: str, step: str, where: str) -> str:
    time = stream.event_time
    if time == RESULT_TIME:
        raise step_error(step, where, f"the {side} stream ({stream.name!r}) is the results of a stateful step; "
                                      "a join of two streams reads records with their own event time (sources, "
                                      "stateless steps); sink those results and join them in another pipeline")
    if time is None:
        raise step_error(step, where, f"the {side} stream ({stream.name!r}) has no event time; declare it "
                                      f"(event_time= on the source, or with_event_time): {KEPT_UNTIL}")
    return time


def _check_fields(stream: Node, keys: tuple[str, ...], side: str, step: str, where: str) -> None:
    schema = stream.schema
    if schema is None:
        return
    for key in keys:
        if key not in dict(schema):
            raise step_error(step, where, f"the {side} stream ({stream.name!r}) has no field {key!r}; it has "
                                          f"{', '.join(n for n, _ in schema)}")


def _output_schema(left: Node, right: Node, left_on: tuple[str, ...], right_on: tuple[str, ...],
                   windowed: bool, step: str, where: str) -> Schema | None:
    if left.schema is None or right.schema is None:
        return None
    mine, theirs = dict(left.schema), dict(right.schema)
    for a, b in zip(left_on, right_on):
        if UNKNOWN not in (mine[a], theirs[b]) and mine[a] != theirs[b]:
            raise step_error(step, where, f"join field {a!r} is a {mine[a]} in {left.name!r} and "
                                          f"{b!r} a {theirs[b]} in {right.name!r}; cast one of them "
                                          "(with_columns) so that they compare equal")
    shared = {a for a, b in zip(left_on, right_on) if a == b}
    added = [(n, t) for n, t in right.schema if n not in shared]
    if windowed:
        added += [(f, "timestamp") for f in JOIN_WINDOW_FIELDS]
    both = [n for n, _ in added if n in mine]
    if both:
        raise step_error(step, where, f"the streams {left.name!r} and {right.name!r} both have a field "
                                      f"{both[0]!r} that is not a join field of the same name; rename one of them "
                                      "(select or with_columns) before joining")
    return (*left.schema, *added)


def stream_join(left: Node, right: Node, on: Any, how: str, within: Any, window: Any, step: str,
                where: str) -> StreamJoinNode:
    """The node of ``left`` joined with the stream ``right``, refused as the pipeline is built when
    Spark could not run it or would keep its state forever."""
    if how not in JOIN_KINDS:
        raise step_error(step, where, f"how must be one of {', '.join(repr(k) for k in JOIN_KINDS)}, got {how!r}")
    left_on, right_on = join_keys(on, step, where)
    lower, upper, shape = join_bound(within, window, step, where)
    left_time = _event_time(left, "left", step, where)
    right_time = _event_time(right, "right", step, where)
    _check_fields(left, left_on, "left", step, where)
    _check_fields(right, right_on, "right", step, where)
    if left_time == right_time and (left_time, left_time) not in zip(left_on, right_on):
        raise step_error(step, where, f"both streams call their event time {left_time!r}; rename it on one side "
                                      "(select or with_columns, before with_event_time) so that the output keeps both")
    schema = _output_schema(left, right, left_on, right_on, shape is not None, step, where)
    # the output's event time: the left record's, or the right's in a right join; a full join's
    # rows may lack either, so its results carry none
    event_time = {"inner": left_time, "left": left_time, "right": right_time}.get(how)
    return StreamJoinNode(step, (left.name, right.name), where, schema, event_time,
                          left_on=left_on, right_on=right_on, how=how, lower_ms=lower, upper_ms=upper, window=shape)
