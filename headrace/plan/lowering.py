"""How each node will be lowered to Spark, decided from the plan alone (no Spark needed).

The compiler and ``explain`` share these decisions, so what explain prints is what runs.
"""

from __future__ import annotations

from headrace.plan.graph import Plan
from headrace.plan.nodes import (
    KeyByNode,
    KeyedProcessNode,
    PythonStep,
    RollingAggregateNode,
    SinkNode,
    WindowAggregateNode,
)


def python_chains(plan: Plan) -> list[list[str]]:
    """Runs of consecutive Python steps fused into one Arrow-batched stage.

    A step joins the chain of its input when that input is a Python step with no other consumer
    (a ``key_by`` node between them, which only names the keys, does not count).
    """
    chains: list[list[str]] = []
    chain_of: dict[str, list[str]] = {}
    for node in plan.nodes.values():
        if not isinstance(node, PythonStep):
            continue
        parent = node.inputs[0]
        while isinstance(plan.nodes[parent], KeyByNode) and len(plan.consumers(parent)) == 1:
            parent = plan.nodes[parent].inputs[0]
        if parent in chain_of and len(plan.consumers(parent)) == 1:
            chain = chain_of[parent]
        else:
            chain = []
            chains.append(chain)
        chain.append(node.name)
        chain_of[node.name] = chain
    return chains


def window_needs_processor(plan: Plan, node: WindowAggregateNode) -> list[str]:
    """Why a window step cannot use Spark's native window operator (empty: it can)."""
    reasons = []
    kind = node.window.to_json()["kind"]
    if kind in ("count", "global"):
        reasons.append(f"{kind} windows")
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
    return reasons


def output_mode(plan: Plan) -> str:
    """Spark's output mode for the pipeline's query: ``update`` when a step emits updates."""
    updating = [n for n in plan.nodes.values()
                if isinstance(n, RollingAggregateNode) or (isinstance(n, WindowAggregateNode) and n.emit == "updates")]
    return "update" if updating else "append"


def lowering_of(plan: Plan) -> dict[str, str]:
    """One phrase per node: native Spark, fused Python stage, stateful processor."""
    described: dict[str, str] = {}
    for number, chain in enumerate(python_chains(plan), start=1):
        for name in chain:
            described[name] = f"fused Python stage #{number} (mapInArrow: {' -> '.join(chain)})"
    for node in plan.nodes.values():
        if node.name in described:
            continue
        described[node.name] = {
            "source": "Python data source",
            "table": "static DataFrame (broadcast)",
            "native": "native Spark expressions",
            "event_time": "native Spark watermark (withWatermark)",
            "key_by": "native (keys used by the next aggregate)",
            "join": "native stream-static join (broadcast)",
            "union": "native union",
            "dead_letters": "native filter of the source's dead-letter columns",
            "late_records": "the window processor's late side output",
            "sink": "sink",
        }.get(node.kind, node.kind)
        if isinstance(node, WindowAggregateNode):
            reasons = window_needs_processor(plan, node)
            operator = "session_window" if node.window.to_json()["kind"] == "session" else "window"
            mode = "append" if node.emit == "final" else "update"
            described[node.name] = (
                f"stateful processor (transformWithStateInPandas, state per key, event-time timers) "
                f"because of {', '.join(reasons)}" if reasons else
                f"native Spark {operator} aggregate, {mode} mode (its semantics match Spark's operator)")
        if isinstance(node, KeyedProcessNode):
            timers = ("event-time timers of Spark wake each key" if plan.nodes[node.inputs[0]].event_time
                      else "no event time: timers are checked when their key runs")
            described[node.name] = f"stateful processor (transformWithStateInPandas, state per key, {timers})"
        if isinstance(node, SinkNode):
            writer = node.connector.native_format if len(plan.sinks()) == 1 else None
            described[node.name] = (f"Spark's own {writer} streaming sink" if writer
                                    else "foreachBatch, committed by batch id")
        if isinstance(node, RollingAggregateNode):
            described[node.name] = ("stateful processor (applyInPandasWithState), update mode" if node.reduce_fn
                                    else "native Spark groupBy aggregate, update mode")
    return described
