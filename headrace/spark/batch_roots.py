"""Where each micro-batch's own steps start: the query runs up to a root stream, and the steps
from there to the sinks run on each micro-batch inside foreachBatch (``headrace/spark/writer.py``).
Which steps can run so is each kind's spec (``per_batch``, ``batch_only``)."""

from __future__ import annotations

from headrace.errors import step_error
from headrace.plan.graph import Plan
from headrace.plan.nodes import Node, PortNode
from headrace.spark.specs import spec_of


def _path_up(plan: Plan, sink: Node) -> list[str]:
    """From a sink upwards while the steps can run per batch; ends with the first that cannot.
    A step at or below an operator (which runs only per batch) is never a candidate root."""
    path, name = [], sink.inputs[0]
    while True:
        path.append(name)
        node = plan.nodes[name]
        if spec_of(node).batch_only:
            path.clear()
        if not spec_of(node).per_batch or not node.inputs:
            return path
        if spec_of(node).reads_every_input and len(node.inputs) > 1:  # needs every input's stream
            return path
        name = node.inputs[0]


def branch_root(plan: Plan, sink: Node) -> str:
    """The step the query runs to for the sink ``sink`` when the sinks share no root: the
    nearest step above it that does not run per batch (a source, a stateful step, a union);
    the steps between run on each micro-batch inside foreachBatch."""
    return _path_up(plan, sink)[-1]


def shared_root(plan: Plan) -> str | None:
    """The lowest step every sink descends from through per-batch steps only, if any: the query
    runs up to it, and each sink's branch runs on the micro-batch inside foreachBatch. So a
    stateful step that feeds several sinks (a window and its late records) runs once, and
    operators run where the batch id is known."""
    paths = [_path_up(plan, sink) for sink in plan.sinks()]
    for candidate in paths[0]:
        if all(candidate in path for path in paths[1:]) and _feeds_every_operator(plan, candidate):
            return candidate
    return None


def _feeds_every_operator(plan: Plan, root: str) -> bool:
    """Whether every input of every operator comes from ``root`` through per-batch steps."""
    for node in plan.nodes.values():
        if spec_of(node).batch_only and root != node.name:
            for name in node.inputs:
                if spec_of(plan.nodes[name]).batch_only:
                    continue
                if name != root and root not in plan.upstream(name):
                    return False
                between = plan.upstream(name) - plan.upstream(root) - {root}
                if name != root and not all(spec_of(plan.nodes[u]).per_batch for u in {*between, name}):
                    return False
    return True


def check_operators(plan: Plan) -> None:
    """Operators run per micro-batch below the pipeline's one Spark query: no Spark state after
    them, and one stream (source or step) that every operator's inputs come from."""
    batch_only = [n for n in plan.nodes.values() if spec_of(n).batch_only]
    if not batch_only:
        return
    for node in plan.nodes.values():
        if not spec_of(node).per_batch and not spec_of(node).batch_only:
            upstream = plan.upstream(node.name)
            below = [n for n in plan.nodes.values() if n.name in upstream and spec_of(n).batch_only
                     and not isinstance(n, PortNode)]
            if below:
                what = spec_of(below[-1]).label
                raise step_error(node.name, node.defined_at,
                                 f"this step reads the output of {what} {below[-1].name!r} ({below[-1].defined_at}); "
                                 f"{what}s run in each micro-batch after Spark's streaming query, and a "
                                 f"{node.kind.replace('_', ' ')} step runs inside that query; put it before the "
                                 f"{what}, or sink the {what}'s output and continue in another pipeline")
    if shared_root(plan) is None:
        first = batch_only[0]
        raise step_error(first.name, first.defined_at,
                         "operators run in each micro-batch on one stream of Spark's query, and every sink must "
                         "descend from that stream through steps that run per micro-batch; this pipeline has no "
                         "such stream: feed the operators and the other sinks from one stream (a source, a step, "
                         "or a union of sources)")
