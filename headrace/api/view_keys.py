"""The keys a queryable view of a step's results is kept by when its ``View`` sink names none."""

from __future__ import annotations

from headrace.plan.graph import Plan
from headrace.plan.nodes import KeyedProcessNode, Node, RollingAggregateNode, WindowAggregateNode

WINDOW_KEY = "window_start"


def view_keys(plan: Plan, node: Node) -> tuple[str, ...]:
    """A keyed aggregate's keys, a window's keys and ``window_start``, a keyed process step's
    keys; () for any other step, or when a key is not among the step's output columns."""
    if isinstance(node, RollingAggregateNode):
        keys = node.keys or ()
    elif isinstance(node, WindowAggregateNode):
        keys = (*(node.keys or ()), WINDOW_KEY)
    elif isinstance(node, KeyedProcessNode):
        keys = plan.nodes[node.inputs[0]].keys or ()
    else:
        return ()
    columns = {name for name, _ in node.schema or ()}
    return keys if node.schema is None or columns.issuperset(keys) else ()
