"""One spec per node kind, registered in ``SPECS``: whether it runs the same on one micro-batch,
and what it asks of the pipeline's one Spark query (state, output mode, the watermark, control
rows). How each kind is lowered, and how ``explain`` names that, is in
``headrace/spark/lowerings.py``.

The compiler, ``explain``, the writer, the one-query rules below and the checkpoint
compatibility check all read these specs, so none of them re-derives another's choices.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace.errors import PlanError, step_error
from headrace.plan.graph import Plan
from headrace.plan.nodes import KeyByNode, Node, PythonStep
from headrace.plan.sql_query import SQL_OUTPUT_MODES
from headrace.spark.clocks import spark_ttl
from headrace.spark.real_time import REAL_TIME


def _no_output_mode(node: Any) -> str | None:
    return None


def _never(*node: Any) -> bool:
    return False


def _nothing(node: Any) -> str | None:
    return None


@dataclass(frozen=True)
class NodeSpec:
    per_batch: bool = False  # gives the same rows on one micro-batch's DataFrame as on the stream
    stateful: bool = False  # keeps state in Spark's state store across micro-batches
    output_mode: Callable[[Any], str | None] = _no_output_mode  # the Spark output mode it needs
    runs_alone: Callable[[Any], bool] = _never  # its Spark operator cannot share a query with another
    reads_watermark: bool = False  # its results depend on the watermark (windows, timers)
    reads_control: bool = False  # needs the control rows of its sources (watermark moves, test clock)
    # runs in Spark's processing-time mode (its state expires by Spark's TTL), which runs a
    # micro-batch at every trigger, with data or not
    processing_time: Callable[[Plan, Any], bool] = _never
    # runs only on a micro-batch inside foreachBatch, where the batch id is known (operators)
    batch_only: bool = False
    # the spec of a node whose kind alone does not decide it (an SQL step: its query's shape)
    variant: Callable[[Any], NodeSpec] | None = None
    # why its results cannot feed a later stateful step in the same query (None: they can)
    feeds_stage: Callable[[Any], str | None] = _nothing
    # why it cannot read the results of an earlier stateful step in the same query (None: it can)
    follows_stage: Callable[[Any], str | None] = _nothing


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


def native_sink_format(plan: Plan, node: Any) -> str | None:
    """The format of Spark's own streaming writer for the sink ``node``, when it is the
    pipeline's only sink, its connector has one and no operator runs in foreachBatch;
    otherwise sinks commit per batch."""
    return node.connector.native_format if len(plan.sinks()) == 1 and not has_operators(plan) else None


def has_operators(plan: Plan) -> bool:
    """Whether some step runs only in foreachBatch (operators and their ports)."""
    return any(SPECS[n.kind].batch_only for n in plan.nodes.values())


def folds_in_python(node: Any) -> bool:
    """A reduce, or aggregates whose keys expire, fold each key's records in Python."""
    return node.reduce_fn is not None or node.ttl_ms is not None


# Spark runs stateful operators one after another in one query only in append mode (its
# checker refuses a chain in update mode: an update of a result cannot be taken back downstream).
UPDATES = ("emits updates (Spark's update mode), and Spark runs stateful steps one after another in one query "
           "only in append mode")
NO_SQL_TIME = ("is an SQL query, and headrace carries the event time of results into and out of fluent steps "
               "only (an SQL query names no column for it)")


def _window_feeds(node: Any) -> str | None:
    if node.emit == "updates":
        return f"{UPDATES} (use emit='final')"
    if node.emission.allowed_lateness_ms:
        return ("has allowed lateness: its late panes come after the watermark passed their window, and Spark "
                "refuses to hand a later stateful step rows older than the watermark")
    return None


def _window_follows(node: Any) -> str | None:
    return f"{UPDATES} (use emit='final')" if node.emit == "updates" else None


def _rolling_follows(node: Any) -> str | None:
    return f"is a rolling aggregate, which {UPDATES}; use a window with emit='final'"


SPECS: dict[str, NodeSpec] = {
    "source": NodeSpec(),
    "table": NodeSpec(),
    "native": NodeSpec(per_batch=True),
    "python": NodeSpec(per_batch=True),
    "event_time": NodeSpec(reads_control=True),
    "key_by": NodeSpec(per_batch=True),
    "rolling_aggregate": NodeSpec(stateful=True, output_mode=lambda node: "update", runs_alone=folds_in_python,
                                  processing_time=lambda plan, node: node.ttl_ms is not None,
                                  feeds_stage=lambda node: UPDATES, follows_stage=_rolling_follows),
    "window_aggregate": NodeSpec(stateful=True, output_mode=lambda node: "append" if node.emit == "final" else "update",
                                 reads_watermark=True, feeds_stage=_window_feeds, follows_stage=_window_follows),
    "late_records": NodeSpec(per_batch=True),
    "keyed_process": NodeSpec(stateful=True, output_mode=lambda node: "append", reads_watermark=True,
                              reads_control=True, processing_time=lambda plan, node: spark_ttl(plan, node) is not None),
    "join": NodeSpec(per_batch=True),
    "union": NodeSpec(),
    "dead_letters": NodeSpec(per_batch=True),
    "sink": NodeSpec(per_batch=True),
    "operator": NodeSpec(per_batch=True, batch_only=True, reads_control=True),
    "port": NodeSpec(per_batch=True, batch_only=True),
    "sql": NodeSpec(variant=lambda node: SQL_SPECS[node.shape]),
}
# An SQL step runs as its query's shape says (headrace/plan/sql_query.py).
SQL_SPECS: dict[str, NodeSpec] = {
    shape: NodeSpec(per_batch=mode is None, stateful=mode is not None,
                    output_mode=lambda node: SQL_OUTPUT_MODES[node.shape],
                    reads_watermark=shape == "windowed aggregate",
                    feeds_stage=lambda node: UPDATES if SQL_OUTPUT_MODES[node.shape] == "update" else NO_SQL_TIME,
                    follows_stage=lambda node: NO_SQL_TIME)
    for shape, mode in SQL_OUTPUT_MODES.items()}
STATEFUL_KINDS = frozenset(kind for kind, spec in SPECS.items() if spec.stateful)


def spec_of(node: Node) -> NodeSpec:
    spec = SPECS[node.kind]
    return spec.variant(node) if spec.variant is not None else spec


# Spark runs a query with a step in processing-time mode micro-batch after micro-batch, with
# data or not; without a trigger interval of its own, such a pipeline gets this one.
PROCESSING_TIME_TRIGGER = "1 second"


def trigger_interval(plan: Plan, asked: str | None) -> str | None:
    """The trigger interval the query runs with: the one asked for; else, when a step runs in
    Spark's processing-time mode, ``PROCESSING_TIME_TRIGGER``; else none (as fast as possible)."""
    if asked:
        return asked
    busy = any(spec_of(n).processing_time(plan, n) for n in plan.nodes.values())
    return PROCESSING_TIME_TRIGGER if busy else None


def output_mode(plan: Plan) -> str:
    """Spark's output mode for the pipeline's query: ``update`` when a step emits updates, and
    in real-time mode (the only mode Spark runs it in)."""
    if plan.trigger == REAL_TIME:
        return "update"
    modes = {spec_of(n).output_mode(n) for n in plan.nodes.values()}
    return "update" if "update" in modes else "append"


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
        if node.kind == "dead_letters" and len(node.inputs) > 1:  # needs every source's stream
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
            below = [n for n in plan.nodes.values() if n.name in upstream and n.kind == "operator"]
            if below:
                raise step_error(node.name, node.defined_at,
                                 f"this step reads the output of operator {below[-1].name!r} ({below[-1].defined_at}); "
                                 "operators run in each micro-batch after Spark's streaming query, and a "
                                 f"{node.kind.replace('_', ' ')} step runs inside that query; put it before the "
                                 "operator, do it in an operator, or sink the operator's output and continue in "
                                 "another pipeline")
    if shared_root(plan) is None:
        first = batch_only[0]
        raise step_error(first.name, first.defined_at,
                         "operators run in each micro-batch on one stream of Spark's query, and every sink must "
                         "descend from that stream through steps that run per micro-batch; this pipeline has no "
                         "such stream: feed the operators and the other sinks from one stream (a source, a step, "
                         "or a union of sources)")


def _sink_kind(connector: Any) -> str:
    """The name a user calls the sink's connector by (``Files`` for ``hr.sinks.Files``)."""
    from headrace import sinks  # every sink's module: only when a message names one

    return next((name for name in sinks.__all__ if getattr(sinks, name) is type(connector)), type(connector).__name__)


def updating_step(plan: Plan, reads: str) -> Node | None:
    """The step at or above ``reads`` that emits updates (Spark's update mode), or None."""
    feeding = {reads} | plan.upstream(reads)
    return next((n for n in plan.nodes.values() if n.name in feeding and spec_of(n).output_mode(n) == "update"),
                None)


def check_sink_takes_updates(plan: Plan, sink: str, where: str, connector: Any, reads: str) -> None:
    """Refuse a sink that cannot take update mode's rows when it reads (the step ``reads`` or a step
    above it) a step that emits updates, naming the sink, the step and what to do. A sink beside
    such a step, on a stateless branch, gets each of its rows once."""
    why = connector.refuses_updates()
    if why is None:
        return
    updating = updating_step(plan, reads)
    if updating is None:
        return
    kind = _sink_kind(connector)
    member = getattr(connector, "refused_member", lambda: None)()
    what = f"a {kind} sink (its member {member[0]!r}, a {_sink_kind(member[1])} sink)" if member else f"a {kind} sink"
    raise PlanError(f"sink {sink!r} ({where}): {what} cannot take the updates of step {updating.name!r} "
                    f"({updating.defined_at}), which emits updates (Spark's update mode: each micro-batch emits "
                    f"again every group it changed): {why}; write the updates to a sink that replaces a row by its "
                    "key (hr.sinks.Postgres(..., key=[...]), hr.sinks.Delta(..., key=[...])), or emit each result "
                    "once (a window with emit='final')")
