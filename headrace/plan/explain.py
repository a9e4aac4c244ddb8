"""``explain()``: the DAG, how each node is lowered, and the delivery guarantee."""

from __future__ import annotations

from headrace.plan.graph import Plan
from headrace.spark.specs import lowering_of, output_mode, trigger_interval


def explain_text(plan: Plan) -> str:
    guarantee, parts = plan.guarantee()
    lowering = lowering_of(plan)
    lines = [f"pipeline {plan.name!r}",
             f"  guarantee: {guarantee.value} ({'; '.join(parts)})",
             f"  one Spark streaming query, output mode {output_mode(plan)}"
             + (f", a micro-batch every {interval} at least (Spark's processing-time mode)"
                if (interval := trigger_interval(plan, None)) else ""),
             ""]
    width = max(len(n) for n in plan.nodes) if plan.nodes else 0
    for node in plan.nodes.values():
        arrow = f" <- {', '.join(node.inputs)}" if node.inputs else ""
        lines.append(f"  {node.name.ljust(width)}  {node.summary()}{arrow}")
        lines.append(f"  {' ' * width}    lowered as: {lowering[node.name]}   [{node.defined_at}]")
    return "\n".join(lines)
