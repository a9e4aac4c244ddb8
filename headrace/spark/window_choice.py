"""Which operator a window step runs on, decided from the plan alone (no Spark needed): Spark's
native window aggregate when its semantics are headrace's, headrace's window processor
(``headrace/spark/window_lowering.py``) otherwise. The compiler, ``explain``, the real-time check and
the restart-compatibility check all ask here."""

from __future__ import annotations

from headrace.plan.graph import Plan
from headrace.plan.nodes import RESULT_TIME, WindowAggregateNode
from headrace.spark.stages import result_time_needed, stateful_steps


def window_needs_processor(plan: Plan, node: WindowAggregateNode) -> list[str]:
    """Why a window step cannot use Spark's native window operator (empty: it can)."""
    reasons = []
    shape = node.window.native_obstacle()
    if shape:
        reasons.append(shape)
    if not node.emission.is_default():
        default = type(node.emission)()
        if node.emission.trigger != default.trigger:
            reasons.append(f"trigger: {node.emission.trigger.describe()}")
        if node.emission.allowed_lateness_ms:
            reasons.append(f"allowed lateness {node.emission.allowed_lateness_ms} ms")
        if not node.emission.accumulating:
            reasons.append("discarding panes")
    if node.function != "aggregates":
        reasons.append(f"a {node.function.replace('_', ' ')}")
    if any(c.kind == "late_records" for c in plan.consumers(node.name)):
        reasons.append("a late side output")
    if plan.nodes[node.inputs[0]].event_time != RESULT_TIME and stateful_steps(plan) > 1:
        # in a query with several stateful operators, Spark's drop only what was late for the
        # watermark of the micro-batch before (stages.ALLOW_MULTIPLE): the processor judges
        # against the micro-batch's own, as documented
        reasons.append("the first window of a chain (a record late for this micro-batch's watermark is dropped)"
                       if result_time_needed(plan, node) else
                       "another stateful step in the pipeline (a record late for this micro-batch's watermark is "
                       "dropped)")
    return reasons


def window_lowered_as(plan: Plan, node: WindowAggregateNode) -> str:
    reasons = window_needs_processor(plan, node)
    if reasons:
        return ("stateful processor (transformWithStateInPandas, state per key, event-time timers) "
                f"because of {', '.join(reasons)}")
    operator = node.window.spark_function
    mode = "append" if node.emit == "final" else "update"
    return f"native Spark {operator} aggregate, {mode} mode (its semantics match Spark's operator)"
