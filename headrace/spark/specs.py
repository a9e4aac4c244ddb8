"""One spec per node kind, keyed by the node's class in ``SPECS``: what it asks of the pipeline's
one Spark query (state, output mode, the watermark, control rows, whether it runs the same on
one micro-batch), how messages name it, why it keeps a pipeline out of Spark's real-time mode,
and what a restart compares of it (from the JSON of a plan record: ``spec_of_json``). How each
kind is lowered to Spark, and how ``explain`` names that, is in ``headrace/spark/lowerings.py``,
which needs pyspark; checking a plan reads only this module.

The compiler, ``explain``, the writer, the one-query rules, the real-time check and the
checkpoint compatibility check all read these specs, so none of them re-derives another's choices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from headrace.errors import PlanError
from headrace.plan import nodes
from headrace.plan.graph import Plan
from headrace.plan.nodes import (
    CHAINED_WINDOWS,
    DISTINCT,
    JOINED,
    RESULT_TIME,
    SQL_OUTPUT_MODES,
    WINDOWED,
    KeyByNode,
    Node,
    PythonStep,
    SourceNode,
)
from headrace.spark import state_changes
from headrace.spark.clocks import spark_ttl
from headrace.spark.real_time import REAL_TIME


def _no_output_mode(node: Any) -> str | None:
    return None


def _never(*node: Any) -> bool:
    return False


def _nothing(*node: Any) -> str | None:
    return None


def _no_event_time(node: Any) -> str:
    return "it has no event time"


def _mode_or_kind(node: dict[str, Any]) -> str:
    return str(node.get("mode") or node.get("kind", "?"))


@dataclass(frozen=True)
class NodeSpec:
    per_batch: bool = False  # gives the same rows on one micro-batch's DataFrame as on the stream
    stateful: bool = False  # keeps state in Spark's state store across micro-batches
    # how many stateful operators it may put in Spark's query (an SQL join may aggregate after it)
    operators: int = 1
    output_mode: Callable[[Any], str | None] = _no_output_mode  # the Spark output mode it needs
    runs_alone: Callable[[Any], bool] = _never  # its Spark operator cannot share a query with another
    reads_watermark: bool = False  # its results depend on the watermark (windows, timers)
    reads_control: bool = False  # needs the control rows of its sources (watermark moves, test clock)
    # runs in Spark's processing-time mode (its state expires by Spark's TTL), which runs a
    # micro-batch at every trigger, with data or not
    processing_time: Callable[[Plan, Any], bool] = _never
    # runs only on a micro-batch inside foreachBatch, where the batch id is known (operators)
    batch_only: bool = False
    # keeps its own state beside the checkpoint, saved in each micro-batch (operators)
    own_state: bool = False
    reads_every_input: bool = False  # needs all its inputs' streams at once (per batch only with one)
    pushes_filter: Callable[[Any], bool] = _never  # may hold a filter Catalyst pushes below the watermark
    # why its results cannot feed a later stateful step in the same query (None: they can)
    feeds_stage: Callable[[Any], str | None] = _nothing
    # why it cannot read the results of the earlier stateful step (its second argument) in the
    # same query (None: it can)
    follows_stage: Callable[[Any, Node], str | None] = _nothing
    result_time: str = "the time it was emitted with"  # the event time of a stateful step's results
    timeless: Callable[[Any], str] = _no_event_time  # why a stateful step's results carry no event time
    label: str = ""  # how a message names a step of this kind: ``window 'per_minute'``
    appending: str = ""  # how a message names it when it emits final results (append mode)
    # why it keeps the pipeline out of Spark's real-time mode (plan, node, how to name the step)
    real_time: Callable[[Plan, Any, str], str | None] = _nothing
    # a restart's check, on the node's JSON: its role and kind, what it compares of its state,
    # why losing it is refused (when more than Spark's state is lost), and the note when it may
    # be added with its state starting fresh
    endpoint: str | None = None  # "source" or "sink"
    restart_label: Callable[[dict[str, Any]], str] = _mode_or_kind
    compare_state: Callable[[state_changes.StateDiff], None] | None = None
    state_lost: str = ""
    starts_fresh: str = ""
    # a node whose kind alone does not decide its spec (an SQL step: its query's shape): the
    # setting that does, and the spec for each of its values
    variant_by: str | None = None
    variants: Mapping[str, NodeSpec] = field(default_factory=dict)

    @property
    def role(self) -> str:
        """Its role in a restart's check: source, sink, stateful step or step (stateless)."""
        return self.endpoint or ("stateful step" if self.stateful or self.own_state else "step")


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
    alone = len(plan.sinks()) == 1 and not has_operators(plan) and not late_records_of_joins(plan)
    return node.connector.native_format if alone else None


def late_records_of_joins(plan: Plan) -> list[Any]:
    """The joins of two streams whose late records some step reads: found in each micro-batch
    with the watermark it ran with (``headrace/spark/join_lowering.py``), so only in foreachBatch."""
    return [n for n in plan.nodes.values() if isinstance(n, nodes.StreamJoinNode) and plan.late_output_asked(n.name)]


def has_operators(plan: Plan) -> bool:
    """Whether some step runs only in foreachBatch (operators and their ports)."""
    return any(spec_of(n).batch_only for n in plan.nodes.values())


def folds_in_python(node: Any) -> bool:
    """A reduce, or aggregates whose keys expire, fold each key's records in Python."""
    return node.reduce_fn is not None or node.ttl_ms is not None


# Spark runs stateful operators one after another in one query only in append mode (its
# checker refuses a chain in update mode: an update of a result cannot be taken back downstream).
UPDATES = ("emits updates (Spark's update mode), and Spark runs stateful steps one after another in one query "
           "only in append mode")
NO_SQL_TIME = ("is an SQL query, and headrace carries the event time of results into and out of fluent steps "
               "only (an SQL query names no column for it, but for a join grouped by a stream's event time that "
               "its SELECT keeps)")


def _window_feeds(node: Any) -> str | None:
    if node.emit == "updates":
        return f"{UPDATES} (use emit='final')"
    if node.emission.allowed_lateness_ms:
        return ("has allowed lateness: its late panes come after the watermark passed their window, and Spark "
                "refuses to hand a later stateful step rows older than the watermark")
    return None


def _window_follows(node: Any, earlier: Node) -> str | None:
    return f"{UPDATES} (use emit='final')" if node.emit == "updates" else None


def _rolling_follows(node: Any, earlier: Node) -> str | None:
    return f"is a rolling aggregate, which {UPDATES}; use a window with emit='final'"


def _join_follows(node: Any, earlier: Node) -> str | None:
    # a dedupe's results are records of its input, with their own event time
    if isinstance(earlier, nodes.DedupeNode):
        return None
    return "is a join of two streams, which reads records with their own event time"


def _sql_feeds(node: Any) -> str | None:
    if node.shape == JOINED and node.event_time is not None:
        return None  # grouped by a stream's event time: each result at that time (headrace/plan/sql_query.py)
    return UPDATES if SQL_OUTPUT_MODES[node.shape] == "update" else NO_SQL_TIME


# Why a step keeps the pipeline out of Spark's real-time mode (headrace/spark/real_time_obstacles.py).
OUTSIDE = "outside Spark's real-time allow-list"


def _source_real_time(plan: Plan, node: Any, where: str) -> str | None:
    if node.connector.real_time:
        return None
    return (f"source {node.name!r} reads {type(node.connector).__name__}: Spark's real-time mode reads only Kafka "
            "(hr.sources.Kafka)")


def _rolling_real_time(plan: Plan, node: Any, where: str) -> str | None:
    return f"{where} folds its keys in Python (applyInPandasWithState), {OUTSIDE}" if folds_in_python(node) else None


def _window_real_time(plan: Plan, node: Any, where: str) -> str | None:
    reasons = window_needs_processor(plan, node)
    if reasons:
        return (f"{where} needs headrace's window processor (transformWithStateInPandas) because of "
                f"{', '.join(reasons)}; only Spark's native window aggregate runs in real-time mode")
    if node.emit == "final":
        return f"{where} emits final results (append mode); real-time mode runs in update mode: use emit='updates'"
    return None


def _sql_real_time(plan: Plan, node: Any, where: str) -> str | None:
    return (f"{where} is {spec_of(node).appending}, which emits final results (append mode); real-time mode runs "
            "in update mode")


def _union_real_time(plan: Plan, node: Any, where: str) -> str | None:
    stateful = [n for n in node.inputs if any(spec_of(plan.nodes[u]).stateful for u in plan.upstream(n) | {n})]
    if stateful:
        return f"{where} unions the output of a stateful step, which Spark's real-time mode refuses"
    sources = [{u for u in plan.upstream(n) | {n} if isinstance(plan.nodes[u], SourceNode)} for n in node.inputs]
    shared = set.intersection(*sources) if sources else set()
    if shared:
        return (f"{where} unions two branches of source {sorted(shared)[0]!r}; Spark's real-time mode reads a "
                "source once per query: give each branch a source of its own")
    return None


def _connector_type(node: dict[str, Any]) -> str:
    return str((node.get("connector") or {}).get("type", node.get("kind")))


# An SQL step runs as its query's shape says (headrace/plan/sql_query.py).
SQL_APPENDING = {DISTINCT: "an SQL query with DISTINCT", JOINED: "an SQL query joining streams",
                 CHAINED_WINDOWS: "an SQL query of windows of windows"}
SQL_SPECS: dict[str, NodeSpec] = {
    shape: NodeSpec(per_batch=mode is None, stateful=mode is not None,
                    output_mode=lambda node: SQL_OUTPUT_MODES[node.shape],
                    reads_watermark=shape in (WINDOWED, JOINED, CHAINED_WINDOWS), pushes_filter=lambda node: True,
                    operators=2 if shape in (JOINED, CHAINED_WINDOWS) else 1,
                    feeds_stage=_sql_feeds, follows_stage=lambda node, earlier: NO_SQL_TIME,
                    result_time="the event time it is grouped by", timeless=lambda node: f"it {_sql_feeds(node)}",
                    label="SQL step",
                    appending=SQL_APPENDING.get(shape, "a windowed SQL query"),
                    real_time=_sql_real_time if mode == "append" else _nothing, compare_state=state_changes.compare_sql)
    for shape, mode in SQL_OUTPUT_MODES.items()}
_SPECS: dict[type[Node], NodeSpec] = {
    nodes.SourceNode: NodeSpec(real_time=_source_real_time, endpoint="source", restart_label=_connector_type),
    nodes.TableNode: NodeSpec(),
    nodes.NativeStep: NodeSpec(per_batch=True, pushes_filter=lambda node: node.mode == "filter"),
    nodes.PythonStep: NodeSpec(per_batch=True, real_time=lambda plan, node, where: (
        f"{where} is a Python step (a mapInArrow stage), which is {OUTSIDE}")),
    nodes.EventTimeNode: NodeSpec(reads_control=True),
    nodes.KeyByNode: NodeSpec(per_batch=True),
    nodes.RollingAggregateNode: NodeSpec(
        stateful=True, output_mode=lambda node: "update", runs_alone=folds_in_python,
        processing_time=lambda plan, node: node.ttl_ms is not None, feeds_stage=lambda node: UPDATES,
        follows_stage=_rolling_follows, label="rolling aggregate", real_time=_rolling_real_time,
        restart_label=lambda node: "rolling reduce" if node.get("reduce") else "rolling aggregate",
        compare_state=state_changes.compare_rolling),
    nodes.WindowAggregateNode: NodeSpec(
        stateful=True, output_mode=lambda node: "append" if node.emit == "final" else "update",
        reads_watermark=True, feeds_stage=_window_feeds, follows_stage=_window_follows,
        result_time="its window's end - 1 µs", timeless=lambda node: "its panes fire by count, not by the watermark",
        label="window", appending="a window with emit='final'", real_time=_window_real_time,
        restart_label=lambda node: "window", compare_state=state_changes.compare_window),
    nodes.LateRecordsNode: NodeSpec(per_batch=True),
    nodes.KeyedProcessNode: NodeSpec(
        stateful=True, output_mode=lambda node: "append", reads_watermark=True, reads_control=True,
        processing_time=lambda plan, node: spark_ttl(plan, node) is not None,
        timeless=lambda node: "its input has no event time", label="process step", appending="a process step",
        real_time=lambda plan, node, where: f"{where} is a process step (transformWithStateInPandas), {OUTSIDE}",
        restart_label=lambda node: "process step", compare_state=state_changes.compare_process),
    nodes.JoinNode: NodeSpec(per_batch=True, pushes_filter=lambda node: True),  # its inferred not-null filters
    nodes.StreamJoinNode: NodeSpec(
        stateful=True, output_mode=lambda node: "append", reads_watermark=True,
        pushes_filter=lambda node: True,  # the not-null filters Spark infers from its keys
        follows_stage=_join_follows,
        result_time="the left record's event time (the right's in a right join)",
        timeless=lambda node: "it is a full join, whose rows may lack either side's event time",
        label="join", appending="a join of two streams",
        real_time=lambda plan, node, where: f"{where} is a join of two streams, {OUTSIDE}",
        restart_label=lambda node: "join", compare_state=state_changes.compare_stream_join),
    nodes.DedupeNode: NodeSpec(
        stateful=True, output_mode=lambda node: "append", reads_watermark=True,
        result_time="the record's own event time", label="dedupe", appending="a dedupe",
        real_time=lambda plan, node, where: (f"{where} is a dedupe: Spark's real-time mode does not run "
                                             "dropDuplicatesWithinWatermark"),
        restart_label=lambda node: "dedupe", compare_state=state_changes.compare_dedupe),
    nodes.UnionNode: NodeSpec(real_time=_union_real_time),
    nodes.DeadLettersNode: NodeSpec(per_batch=True, reads_every_input=True),
    nodes.SinkNode: NodeSpec(per_batch=True, endpoint="sink", restart_label=_connector_type),
    # its instances' state is saved beside the checkpoint: a new one starts from its constructor
    nodes.OperatorNode: NodeSpec(
        per_batch=True, batch_only=True, own_state=True, reads_control=True,
        restart_label=lambda node: f"operator {node.get('operator')}", compare_state=state_changes.compare_operator,
        state_lost="the state its instances saved beside the checkpoint would be lost",
        starts_fresh="a new operator starts with the state its constructor gives it"),
    nodes.PortNode: NodeSpec(per_batch=True, batch_only=True),
    # scores each micro-batch with the model version recorded for its batch id (score_lowering.py)
    nodes.ScoreNode: NodeSpec(per_batch=True, batch_only=True, label="score step"),
    # calls a service in each micro-batch, its output persisted for the batch (enrich_lowering.py)
    nodes.EnrichNode: NodeSpec(per_batch=True, batch_only=True, label="enrich step"),
    # a record whose shape this version does not know counts as stateful (its query may aggregate)
    nodes.SqlNode: NodeSpec(stateful=True, label="SQL step", compare_state=state_changes.compare_sql,
                            variant_by="shape", variants=SQL_SPECS),
}
SPECS: dict[type[Node], NodeSpec] = {
    kind: spec if spec.label else replace(spec, label=kind.kind.replace("_", " ")) for kind, spec in _SPECS.items()}
SPECS_BY_KIND: dict[str, NodeSpec] = {kind.kind: spec for kind, spec in SPECS.items()}


def spec_of(node: Node) -> NodeSpec:
    spec = SPECS[type(node)]
    return spec.variants[getattr(node, spec.variant_by)] if spec.variant_by else spec


def spec_of_json(node: dict[str, Any]) -> NodeSpec:
    """The spec of a node's JSON in a plan record (of this version or an earlier one): a kind this
    version does not know gets the spec of a stateless step."""
    spec = SPECS_BY_KIND.get(str(node.get("kind")), NodeSpec())
    return spec.variants.get(str(node.get(spec.variant_by)), spec) if spec.variant_by else spec


# -- stateful steps in the query: a window's operator, and results that carry their event time --

def stateful_steps(plan: Plan) -> int:
    """How many stateful operators the query may run (one per stateful step, two for an SQL
    query that joins streams: Spark runs several only with ``stages.ALLOW_MULTIPLE``)."""
    return sum(spec_of(node).operators for node in plan.nodes.values() if spec_of(node).stateful)


def walk(plan: Plan, names: Iterable[str], onwards: Callable[[Node], Iterable[str]]) -> Iterator[Node]:
    """The nodes ``names`` and those reached from them along ``onwards`` (the names to go on to
    from a node: its inputs, its consumers, or none to stop there), each once."""
    todo, seen = list(names), set()
    while todo:
        current = plan.nodes[todo.pop()]
        if current.name in seen:
            continue
        seen.add(current.name)
        yield current
        todo.extend(onwards(current))


def nearest_stateful(plan: Plan, names: Iterable[str], onwards: Callable[[Node], Iterable[str]]) -> list[Node]:
    """The stateful steps among ``names`` and, past the others, along ``onwards`` (a node's inputs,
    or its consumers), up to the first stateful step on each path."""
    def until_stateful(node: Node) -> Iterable[str]:
        return () if spec_of(node).stateful else onwards(node)

    return [node for node in walk(plan, names, until_stateful) if spec_of(node).stateful]


def result_time_needed(plan: Plan, node: Node) -> bool:
    """Whether the results of the stateful step ``node`` must carry ``RESULT_TIME``: a later
    stateful step reads them with their event time."""
    if node.event_time != RESULT_TIME or not spec_of(node).stateful:
        return False

    def consumers(current: Node) -> list[str]:
        return [c.name for c in plan.consumers(current.name)]

    later = nearest_stateful(plan, consumers(node), consumers)
    return any(plan.nodes[i].event_time == RESULT_TIME for step in later for i in step.inputs)


def reads_results(plan: Plan, node: Node) -> bool:
    """Whether the stateful step ``node`` reads the results of another with their event time: a
    stateful step's (``RESULT_TIME``), or a join's or a dedupe's, which keep a record's event time."""
    if plan.nodes[node.inputs[0]].event_time == RESULT_TIME:
        return True
    earlier = nearest_stateful(plan, node.inputs, lambda current: current.inputs)
    return bool(earlier) and all(isinstance(n, (nodes.StreamJoinNode, nodes.DedupeNode)) for n in earlier)


def window_needs_processor(plan: Plan, node: Any) -> list[str]:
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
    if plan.late_output_asked(node.name):
        reasons.append("a late side output")
    if not reads_results(plan, node) and stateful_steps(plan) > 1:
        # in a query with several stateful operators, Spark's drop only what was late for the
        # watermark of the micro-batch before (stages.ALLOW_MULTIPLE): the processor judges
        # against the micro-batch's own, as documented
        reasons.append("the first window of a chain (a record late for this micro-batch's watermark is dropped)"
                       if result_time_needed(plan, node) else
                       "another stateful step in the pipeline (a record late for this micro-batch's watermark is "
                       "dropped)")
    return reasons


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


def _sink_kind(connector: Any) -> str:
    """The name a user calls the sink's connector by (``Files`` for ``hr.sinks.Files``)."""
    from headrace import sinks  # every sink's module: only when a message names one

    return next((name for name in sinks.__all__ if getattr(sinks, name) is type(connector)), type(connector).__name__)


def sinks_keeping_updates() -> str:
    """The sinks that keep each group's last update by its key, as a user makes them (each sink
    class says how in ``keyed_updates``).

    >>> sinks_keeping_updates()  # doctest: +ELLIPSIS
    'hr.sinks.Delta(..., key=[...]), hr.sinks.Kafka(..., key=[...]) on a compacted topic, ...'
    """
    from headrace import sinks  # every sink's module: only when a message names them

    calls = [f"hr.sinks.{name}{getattr(sinks, name).keyed_updates}" for name in sinks.__all__
             if getattr(sinks, name).keyed_updates]
    return ", ".join(calls[:-1]) + f" or {calls[-1]}" if len(calls) > 1 else "".join(calls)


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
                    f"again every group it changed): {why}; write the updates to a sink that keeps each group's last "
                    f"update by its key: {sinks_keeping_updates()}; or emit each result once (a window with "
                    "emit='final')")
