"""How each node kind is lowered to Spark, and how ``explain`` names that lowering, one entry
per kind in ``LOWERINGS``; what a kind asks of the query is its spec (``headrace/spark/specs.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace.plan.graph import Plan
from headrace.plan.nodes import Node
from headrace.spark import stateless
from headrace.spark.clocks import spark_ttl
from headrace.spark.operator_stage import fused_into, lower_operator, lower_port
from headrace.spark.process_lowering import lower_process
from headrace.spark.rolling import lower_rolling
from headrace.spark.specs import folds_in_python, native_sink_format, python_chains
from headrace.spark.sql import lower_sql, sql_lowered_as
from headrace.spark.watermarks import WatermarkPlacement
from headrace.spark.window_choice import window_lowered_as
from headrace.spark.window_lowering import lower_late_records, lower_window


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


def _operator_lowered_as(plan: Plan, node: Any) -> str:
    sender = fused_into(plan, node)
    if sender is not None:
        return f"fused into the Python stage of operator {sender.name!r} (thread-local)"
    return (f"operator stage in each micro-batch: {node.partitions} instance(s), groupBy(instance).applyInArrow, "
            "state saved per window beside the checkpoint")


def _sink_lowered_as(plan: Plan, node: Any) -> str:
    writer = native_sink_format(plan, node)
    return f"Spark's own {writer} streaming sink" if writer else "foreachBatch, committed by batch id"


def _rolling_lowered_as(plan: Plan, node: Any) -> str:
    if not folds_in_python(node):
        return "native Spark groupBy aggregate, update mode"
    if node.ttl_ms is not None:
        return "stateful processor (transformWithStateInPandas, Spark's state TTL per key), update mode"
    return "stateful processor (applyInPandasWithState), update mode"


LOWERINGS: dict[str, KindLowering] = {
    "source": KindLowering(stateless.lower_source, lambda plan, node: node.connector.lowered_as),
    "table": KindLowering(stateless.lower_table, "static DataFrame (broadcast)"),
    "native": KindLowering(stateless.lower_native, "native Spark expressions"),
    "python": KindLowering(stateless.lower_python, _python_lowered_as),
    "event_time": KindLowering(stateless.lower_event_time, _event_time_lowered_as),
    "key_by": KindLowering(stateless.lower_key_by, "native (keys used by the next aggregate)"),
    "rolling_aggregate": KindLowering(lower_rolling, _rolling_lowered_as),
    "window_aggregate": KindLowering(lower_window, window_lowered_as),
    "late_records": KindLowering(lower_late_records, "the window processor's late side output"),
    "keyed_process": KindLowering(lower_process, _process_lowered_as),
    "join": KindLowering(stateless.lower_join, "native stream-static join (broadcast)"),
    "union": KindLowering(stateless.lower_union, "native union"),
    "dead_letters": KindLowering(stateless.lower_dead_letters, "native filter of the source's dead-letter columns"),
    "sink": KindLowering(stateless.lower_sink, _sink_lowered_as),
    "operator": KindLowering(lower_operator, _operator_lowered_as),
    "port": KindLowering(lower_port, "rows of the port's schema (fused Arrow stage in each micro-batch)"),
    "sql": KindLowering(lower_sql, sql_lowered_as),  # every shape of query (headrace/plan/sql_query.py)
}


def lowering_of(plan: Plan) -> dict[str, str]:
    """One phrase per node: native Spark, fused Python stage, stateful processor."""
    return {name: LOWERINGS[node.kind].describe(plan, node) for name, node in plan.nodes.items()}
