"""``explain()``: the DAG, how each node is lowered, and the delivery guarantee."""

from __future__ import annotations

from headrace.plan.graph import Plan
from headrace.spark.lowerings import lowering_of
from headrace.spark.real_time import REAL_TIME, REAL_TIME_BATCH
from headrace.spark.real_time_obstacles import obstacles
from headrace.spark.specs import output_mode, spec_of, trigger_interval
from headrace.spark.stages import watermark_origin
from headrace.spark.watermarks import describe_delay


def explain_text(plan: Plan) -> str:
    guarantee, parts = plan.guarantee()
    lowering = lowering_of(plan)
    lines = [f"pipeline {plan.name!r}",
             f"  guarantee: {guarantee.value} ({'; '.join(parts)})",
             f"  one Spark streaming query, output mode {output_mode(plan)}"
             + (f", a micro-batch every {interval} at least (Spark's processing-time mode)"
                if (interval := trigger_interval(plan, None)) else ""),
             _real_time_line(plan),
             ""]
    width = max(len(n) for n in plan.nodes) if plan.nodes else 0
    for node in plan.nodes.values():
        arrow = f" <- {', '.join(node.inputs)}" if node.inputs else ""
        lines.append(f"  {node.name.ljust(width)}  {node.summary()}{arrow}")
        lines.append(f"  {' ' * width}    lowered as: {lowering[node.name]}   [{node.defined_at}]")
        if spec_of(node).stateful:
            lines.append(f"  {' ' * width}    watermark: {watermark_origin(plan, node)}")
            lines.append(f"  {' ' * width}    watermark delay: {describe_delay(plan, node)}")
    return "\n".join(lines)


def _real_time_line(plan: Plan) -> str:
    if plan.trigger == REAL_TIME:
        return (f"  trigger: real-time (Spark's real-time mode: records flow through long-running batches "
                f"checkpointed every {REAL_TIME_BATCH})")
    if not any(source.connector.real_time for source in plan.sources()):
        return "  real-time mode: not possible (Spark's real-time mode reads only Kafka sources)"
    found = obstacles(plan)
    if not found:
        return "  real-time mode: possible (Pipeline(..., trigger='real-time'))"
    return "  real-time mode: not possible:\n" + "\n".join(f"    - {reason}" for reason in found)
