"""Why a pipeline cannot run in Spark's real-time mode (``headrace/spark/real_time.py``): from the
plan's steps, their specs and the sink, before Spark starts."""

from __future__ import annotations

from headrace.errors import PlanError
from headrace.plan.graph import Plan
from headrace.plan.nodes import Node, SourceNode
from headrace.spark.real_time import REAL_TIME, WRITERS
from headrace.spark.specs import spec_of
from headrace.spark.window_choice import window_needs_processor


def _node_obstacle(plan: Plan, node: Node) -> str | None:
    """Why this step keeps the pipeline out of real-time mode, or None."""
    where = f"step {node.name!r} ({node.defined_at})"
    if isinstance(node, SourceNode):
        if not node.connector.real_time:
            return (f"source {node.name!r} reads {type(node.connector).__name__}: Spark's real-time mode "
                    "reads only Kafka (hr.sources.Kafka)")
        return None
    kind = node.kind
    if kind == "python":
        return f"{where} is a Python step (a mapInArrow stage), which is outside Spark's real-time allow-list"
    if kind == "keyed_process":
        return f"{where} is a process step (transformWithStateInPandas), outside Spark's real-time allow-list"
    if kind == "rolling_aggregate" and spec_of(node).runs_alone(node):
        return f"{where} folds its keys in Python (applyInPandasWithState), outside Spark's real-time allow-list"
    if kind == "window_aggregate":
        reasons = window_needs_processor(plan, node)  # type: ignore[arg-type]
        if reasons:
            return (f"{where} needs headrace's window processor (transformWithStateInPandas) because of "
                    f"{', '.join(reasons)}; only Spark's native window aggregate runs in real-time mode")
        if getattr(node, "emit", None) == "final":
            return (f"{where} emits final results (append mode); real-time mode runs in update mode: "
                    "use emit='updates'")
    if kind == "sql" and spec_of(node).output_mode(node) == "append":
        what = "an SQL query with DISTINCT" if getattr(node, "shape", "") == "distinct" else "a windowed SQL query"
        return (f"{where} is {what}, which emits final results (append mode); real-time mode runs in update mode")
    if kind == "union":
        stateful = [n for n in node.inputs if any(spec_of(plan.nodes[u]).stateful
                                                  for u in plan.upstream(n) | {n})]
        if stateful:
            return f"{where} unions the output of a stateful step, which Spark's real-time mode refuses"
        sources = [{u for u in plan.upstream(n) | {n} if isinstance(plan.nodes[u], SourceNode)} for n in node.inputs]
        shared = set.intersection(*sources) if sources else set()
        if shared:
            return (f"{where} unions two branches of source {sorted(shared)[0]!r}; Spark's real-time mode "
                    "reads a source once per query: give each branch a source of its own")
    return None


def obstacles(plan: Plan) -> list[str]:
    """Why ``plan`` cannot run in Spark's real-time mode (empty: it can)."""
    found = [reason for node in plan.nodes.values() if (reason := _node_obstacle(plan, node))]
    sinks = plan.sinks()
    if len(sinks) > 1:
        names = ", ".join(repr(s.name) for s in sinks)
        found.append(f"the pipeline has {len(sinks)} sinks ({names}); real-time mode writes one, with "
                     "Spark's own writer")
    elif sinks and sinks[0].connector.native_format not in WRITERS:
        sink = sinks[0]
        hint = (": the exactly-once Kafka sink writes each batch in one transaction from the driver; "
                "use exactly_once=False (Spark's Kafka writer, at-least-once)"
                if getattr(sink.connector, "exactly_once", False) else
                ": Spark's real-time mode writes only to Kafka (hr.sinks.Kafka(..., exactly_once=False))")
        found.append(f"sink {sink.name!r} ({sink.defined_at}) is {type(sink.connector).__name__}{hint}")
    return found


def check_real_time(plan: Plan) -> None:
    """Refuse a real-time pipeline that Spark would refuse, with every reason."""
    if plan.trigger != REAL_TIME:
        return
    found = obstacles(plan)
    if found:
        raise PlanError(f"pipeline {plan.name!r} cannot run in Spark's real-time mode:\n  - "
                        + "\n  - ".join(found))
