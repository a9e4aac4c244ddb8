"""Why a pipeline cannot run in Spark's real-time mode (``headrace/spark/real_time.py``): from the
plan's steps, their specs and the sink, before Spark starts."""

from __future__ import annotations

from headrace.errors import PlanError
from headrace.plan.graph import Plan
from headrace.plan.nodes import Node
from headrace.spark.real_time import REAL_TIME, WRITERS
from headrace.spark.specs import spec_of


def _node_obstacle(plan: Plan, node: Node) -> str | None:
    """Why this step keeps the pipeline out of real-time mode, or None (its spec says)."""
    return spec_of(node).real_time(plan, node, f"step {node.name!r} ({node.defined_at})")


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
