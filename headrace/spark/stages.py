"""Several stateful steps in one Spark query: a step that reads another's results.

Spark 4 runs a chain of stateful operators in one query in append mode, each with its own
watermark: an operator's input watermark is the output watermark of the operators before it,
and it accepts rows that were on time for the previous micro-batch's watermark, so results
emitted when the watermark passed them still reach the next operator. headrace gives each
stateful step's results an event time in a hidden column (``RESULT_TIME``): a window's result
is at its window's end − 1 µs (Spark's ``window_time``: the last instant inside the window, so
a later window of an equal or larger aligned size puts it in the window that contains the
one it closes), a process step's record at the time it is emitted with.

What each kind allows is declared in its spec (``feeds_stage``, ``follows_stage``); this module
finds the steps that meet, refuses what Spark cannot run with the reason, says where each
stateful step's watermark comes from, and tells the lowering which results need the column.
"""

from __future__ import annotations

from collections.abc import Iterable

from headrace.errors import step_error
from headrace.plan.graph import Plan
from headrace.plan.nodes import RESULT_TIME, EventTimeNode, Node
from headrace.spark.specs import nearest_stateful, spec_of, walk

ELSEWHERE = "sink those results and continue in another pipeline"


def label(node: Node) -> str:
    """How a message names a stateful step: ``window 'per_minute'``."""
    return f"{spec_of(node).label} {node.name!r}"


def earlier_stateful(plan: Plan, name: str) -> list[Node]:
    """The nearest stateful steps at or above ``name`` (none of them below another)."""
    return nearest_stateful(plan, [name], lambda node: node.inputs)


def check_stage(plan: Plan, node: Node) -> None:
    """Refuse the stateful step ``node`` (its inputs in ``plan``, itself maybe not yet) when it
    reads the results of another stateful step in a way Spark cannot run in one query."""
    if not spec_of(node).stateful:
        return
    for name in node.inputs:
        for earlier in earlier_stateful(plan, name):
            what = f"it reads the results of {label(earlier)} ({earlier.defined_at}), "
            again = _declared_between(plan, name, earlier.name)
            if again is not None:
                raise step_error(node.name, node.defined_at, f"{what}through the event-time declaration "
                                 f"{again.name!r} ({again.defined_at}): a watermark declared again after a stateful "
                                 "step holds back the steps after it (on Spark 4.2 the later window emitted nothing); "
                                 "the results already carry their event time (a window's end - 1 µs), so drop "
                                 "with_event_time there")
            reason = spec_of(earlier).feeds_stage(earlier)
            if reason:
                raise step_error(node.name, node.defined_at, f"{what}which {reason}; {ELSEWHERE}")
            reason = spec_of(node).follows_stage(node, earlier)
            if reason:
                raise step_error(node.name, node.defined_at, f"{what}and this step {reason}; {ELSEWHERE}")


# Spark 4 lets a query hold several stateful operators, and then judges each batch's late rows
# against the watermark of the batch before (so the results an operator emits reach the next):
# a row of a window that ended at or before the current watermark is still counted when the
# batch after the one that raised the watermark carries data. With that setting off, Spark
# judges them against the batch's own watermark, as docs/semantics.md says. A query with one
# stateful step runs with it off; a chain needs it on (its later steps read results that were
# on time for the batch before, which is what they must see).
ALLOW_MULTIPLE = "spark.sql.streaming.statefulOperator.allowMultiple"

# Spark's exchange reuse merges identical shuffles: those of a stateful step that the query plans
# twice (its results go to a sink and to a later stateful step: the branches are packed into one
# stream, see writer.py), or of two stateful steps keyed alike on the same input. With several
# stateful operators, one of them then lost its rows (measured on Spark 4.2: a later window, or
# the second of two windows side by side, emitted nothing). Such queries run without it.
EXCHANGE_REUSE = "spark.sql.exchange.reuse"


def _declared_between(plan: Plan, name: str, earlier: str) -> Node | None:
    """An event-time declaration on a path from the stateful step ``earlier`` down to ``name``."""
    def onwards(node: Node) -> Iterable[str]:
        return () if node.name == earlier or spec_of(node).stateful else node.inputs

    for current in walk(plan, [name], onwards):
        if current.name != earlier and isinstance(current, EventTimeNode) and earlier in plan.upstream(current.name):
            return current
    return None


def check_stages(plan: Plan) -> None:
    """``check_stage`` for every stateful step of the plan (a front door may skip the early check)."""
    for node in plan.nodes.values():
        check_stage(plan, node)


def why_no_event_time(plan: Plan, name: str) -> str | None:
    """When the stream out of ``name`` has no event time because of an earlier stateful step,
    why (for the refusal of a step that needs it); None otherwise."""
    for current in walk(plan, [name], lambda node: () if spec_of(node).stateful else node.inputs):
        if spec_of(current).stateful:
            if current.event_time is None:
                return (f"the results of {label(current)} ({current.defined_at}) carry no event time: "
                        f"{spec_of(current).timeless(current)}")
            return None
        parent = plan.nodes[current.inputs[0]] if current.inputs else None
        if parent is not None and parent.event_time == RESULT_TIME and current.event_time is None:
            return (f"step {current.name!r} ({current.defined_at}) drops the event time of the results of "
                    f"{label(earlier_stateful(plan, parent.name)[0])}: Spark cannot follow a watermark through a "
                    "Python step; between two stateful steps use column expressions (filter(hr.col(...)), "
                    "select, with_columns, key_by fields), or move the Python step before the first one")
    return None


def watermark_origin(plan: Plan, node: Node) -> str:
    """Where the watermark of the stateful step ``node`` comes from, for ``explain``."""
    declared: list[str] = []
    carried: list[str] = []

    def onwards(current: Node) -> Iterable[str]:
        passes = current.event_time is not None and not spec_of(current).stateful
        return current.inputs if passes and not isinstance(current, EventTimeNode) else ()

    for current in walk(plan, node.inputs, onwards):
        if current.event_time is None:
            continue
        if spec_of(current).stateful:
            carried.append(f"the results of {label(current)} (Spark's watermark after it; each result at "
                           f"{spec_of(current).result_time})")
        elif isinstance(current, EventTimeNode):
            declared.append(f"the event-time declaration {current.name!r} (field {current.event_time!r}, max "
                            f"out-of-orderness {current.delay_ms} ms)")
    found = carried + declared
    return " and ".join(found) if found else "none (the stream has no event time)"
