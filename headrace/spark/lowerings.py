"""How each node kind is lowered to Spark, and how ``explain`` names that lowering, one entry
per node class in ``LOWERINGS``; what a kind asks of the query is its spec
(``headrace/spark/specs.py``), kept apart because lowering needs pyspark and checking a plan must not."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace.durations import describe_millis
from headrace.plan import nodes
from headrace.plan.graph import Plan
from headrace.plan.nodes import Node
from headrace.spark import stateless
from headrace.spark.clocks import spark_ttl
from headrace.spark.dedupe_lowering import lower_dedupe
from headrace.spark.enrich_lowering import lower_enrich
from headrace.spark.join_lowering import SPARK_HOW, join_late_records, lower_stream_join
from headrace.spark.operator_stage import fused_into, lower_operator, lower_port
from headrace.spark.process_lowering import lower_process
from headrace.spark.rolling import lower_rolling
from headrace.spark.score_lowering import lower_score
from headrace.spark.specs import folds_in_python, native_sink_format, python_chains, window_needs_processor
from headrace.spark.sql import lower_sql, sql_lowered_as
from headrace.spark.watermarks import WatermarkPlacement
from headrace.spark.window_lowering import lower_window, window_late_records


@dataclass(frozen=True)
class KindLowering:
    lower: Callable[[Any, Any], Any]  # (node, the compilation) -> the node's DataFrame
    lowered_as: str | Callable[[Plan, Any], str]  # for explain

    def describe(self, plan: Plan, node: Node) -> str:
        return self.lowered_as if isinstance(self.lowered_as, str) else self.lowered_as(plan, node)


def _event_time_lowered_as(plan: Plan, node: Node) -> str:
    return f"native Spark watermark (withWatermark); {WatermarkPlacement(plan).where_taken(node)}"


def _python_lowered_as(plan: Plan, node: Node) -> str:
    for number, chain in enumerate(python_chains(plan), start=1):
        if node.name in chain:
            again = ("; the watermark is taken again on its output (Spark's watermark does not pass through "
                     "Python): the records it drops do not move it" if WatermarkPlacement(plan).watermark_here(node)
                     else "")
            return f"fused Python stage #{number} (mapInArrow: {' -> '.join(chain)}){again}"
    raise AssertionError(f"{node.name} is in no Python chain")


def _process_lowered_as(plan: Plan, node: Any) -> str:
    timers = ("event-time timers of Spark wake each key" if plan.nodes[node.inputs[0]].event_time
              else "no event time: timers are checked when their key runs")
    ttl = ", Spark's state TTL evicts quiet keys" if spark_ttl(plan, node) is not None else ""
    return f"stateful processor (transformWithStateInPandas, state per key, {timers}{ttl})"


def lower_late_records(node: nodes.LateRecordsNode, lowering: Any) -> Any:
    """The late side output of a window step or a join of two streams, from its raw output."""
    dropping = lowering.plan.nodes[node.inputs[0]]
    lowering.frame(dropping.name)  # (lowers it, or has it seeded in a micro-batch: its raw output too)
    raw = lowering.raw_outputs[dropping.name]
    if isinstance(dropping, nodes.StreamJoinNode):
        return join_late_records(raw, dropping, lowering)
    return window_late_records(raw)


def _late_records_lowered_as(plan: Plan, node: Any) -> str:
    if isinstance(plan.nodes[node.inputs[0]], nodes.StreamJoinNode):
        return ("each side's records read again, kept in each micro-batch when at or before the watermark "
                "Spark's join judges them by")
    return "the window processor's late side output"


def _operator_lowered_as(plan: Plan, node: Any) -> str:
    sender = fused_into(plan, node)
    if sender is not None:
        return f"fused into the Python stage of operator {sender.name!r} (thread-local)"
    return (f"operator stage in each micro-batch: {node.partitions} instance(s), groupBy(instance).applyInArrow, "
            "state saved per window beside the checkpoint")


def _sink_lowered_as(plan: Plan, node: Any) -> str:
    writer = native_sink_format(plan, node)
    return f"Spark's own {writer} streaming sink" if writer else "foreachBatch, committed by batch id"


def _dead_letters_lowered_as(plan: Plan, node: Any) -> str:
    if all(isinstance(plan.nodes[name], nodes.EnrichNode) for name in node.inputs):
        return "native filter of the enrich step's failed records, in each micro-batch"
    return "native filter of the source's dead-letter columns"


def _rolling_lowered_as(plan: Plan, node: Any) -> str:
    if not folds_in_python(node):
        return "native Spark groupBy aggregate, update mode"
    if node.ttl_ms is not None:
        return "stateful processor (transformWithStateInPandas, Spark's state TTL per key), update mode"
    return "stateful processor (applyInPandasWithState), update mode"


def _stream_join_lowered_as(plan: Plan, node: Any) -> str:
    return (f"native Spark stream-stream join ({SPARK_HOW[node.how]}, both sides kept in the state store "
            "until the watermark passes their bound)")


def _dedupe_lowered_as(plan: Plan, node: Any) -> str:
    within = ("the watermark's delay" if node.within_ms is None
              else f"within ({describe_millis(node.within_ms)})")
    return (f"native Spark dropDuplicatesWithinWatermark on {', '.join(node.on)} (each key kept in the state store "
            f"until the watermark passes its first record's event time + {within}), append mode")


def _window_lowered_as(plan: Plan, node: Any) -> str:
    reasons = window_needs_processor(plan, node)
    if reasons:
        return ("stateful processor (transformWithStateInPandas, state per key, event-time timers) "
                f"because of {', '.join(reasons)}")
    operator = node.window.spark_function
    mode = "append" if node.emit == "final" else "update"
    return f"native Spark {operator} aggregate, {mode} mode (its semantics match Spark's operator)"


LOWERINGS: dict[type[Node], KindLowering] = {
    nodes.SourceNode: KindLowering(stateless.lower_source, lambda plan, node: node.connector.lowered_as),
    nodes.TableNode: KindLowering(stateless.lower_table, "static DataFrame (broadcast)"),
    nodes.NativeStep: KindLowering(stateless.lower_native, "native Spark expressions"),
    nodes.PythonStep: KindLowering(stateless.lower_python, _python_lowered_as),
    nodes.EventTimeNode: KindLowering(stateless.lower_event_time, _event_time_lowered_as),
    nodes.KeyByNode: KindLowering(stateless.lower_key_by, "native (keys used by the next aggregate)"),
    nodes.RollingAggregateNode: KindLowering(lower_rolling, _rolling_lowered_as),
    nodes.WindowAggregateNode: KindLowering(lower_window, _window_lowered_as),
    nodes.LateRecordsNode: KindLowering(lower_late_records, _late_records_lowered_as),
    nodes.KeyedProcessNode: KindLowering(lower_process, _process_lowered_as),
    nodes.JoinNode: KindLowering(stateless.lower_join, "native stream-static join (broadcast)"),
    nodes.StreamJoinNode: KindLowering(lower_stream_join, _stream_join_lowered_as),
    nodes.DedupeNode: KindLowering(lower_dedupe, _dedupe_lowered_as),
    nodes.UnionNode: KindLowering(stateless.lower_union, "native union"),
    nodes.DeadLettersNode: KindLowering(stateless.lower_dead_letters, _dead_letters_lowered_as),
    nodes.SinkNode: KindLowering(stateless.lower_sink, _sink_lowered_as),
    nodes.OperatorNode: KindLowering(lower_operator, _operator_lowered_as),
    nodes.PortNode: KindLowering(lower_port, "rows of the port's schema (fused Arrow stage in each micro-batch)"),
    nodes.ScoreNode: KindLowering(lower_score, "the newest model version of the registry, chosen per micro-batch "
                                               "and kept in the checkpoint (Arrow batches in Spark's Python workers)"),
    nodes.EnrichNode: KindLowering(lower_enrich, "calls to a service, concurrent in Spark's Python workers, in each "
                                                 "micro-batch (its output persisted for the batch)"),
    nodes.SqlNode: KindLowering(lower_sql, sql_lowered_as),  # every shape of query (headrace/plan/sql_query.py)
}


def lowering_of(plan: Plan) -> dict[str, str]:
    """One phrase per node: native Spark, fused Python stage, stateful processor."""
    return {name: LOWERINGS[type(node)].describe(plan, node) for name, node in plan.nodes.items()}
