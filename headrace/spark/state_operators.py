"""Which step of the plan each of Spark's stateful operators belongs to.

Spark numbers a query's stateful operators (``state/<operator id>/`` in the checkpoint) and
reports them by its own names (``stateStoreSave``, ``symmetricHashJoin``). Each stateful step's
output carries its records' observed metric (``hr_step_<step>``, ``headrace/spark/step_counts.py``),
a ``CollectMetrics`` node right above the step's operators in the executed plan: the nearest such
node above an operator names its step. Read once per run, after its first batch, from the query's
last executed plan (a few dozen calls into the JVM).
"""

from __future__ import annotations

from typing import Any

from headrace.contract import STEP_METRIC_PREFIX


def steps_of_state_operators(query: Any) -> dict[int, str]:
    """{operator id: step} for the stateful operators of ``query``'s last micro-batch ({} before
    its first, or for an operator no counted step sits above)."""
    execution = query._jsq.streamingQuery().lastExecution()
    if execution is None:
        return {}
    found: dict[int, str] = {}
    pending: list[tuple[Any, str | None]] = [(execution.executedPlan(), None)]
    while pending:
        node, step = pending.pop()
        kind = node.nodeName()
        if kind == "CollectMetrics" and str(node.name()).startswith(STEP_METRIC_PREFIX):
            step = str(node.name())[len(STEP_METRIC_PREFIX):]
        elif step is not None and _stateful(kind):
            info = node.stateInfo()
            if info.isDefined():
                found.setdefault(int(info.get().operatorId()), step)
        children = node.children()
        pending.extend((children.apply(i), step) for i in range(children.size()))
    return found


def _stateful(node_name: str) -> bool:
    """Whether a node of that name is one of Spark's stateful operators (they all keep a ``stateInfo``)."""
    return node_name.startswith(("StateStore", "StreamingSymmetricHashJoin", "StreamingDeduplicate",
                                 "TransformWithState", "FlatMapGroupsWithState", "SessionWindowStateStore",
                                 "FlatMapGroupsInPandasWithState", "StreamingGlobalLimit"))
