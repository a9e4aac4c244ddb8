"""Start a pipeline's one streaming query and fan each micro-batch out to its sinks.

* One sink with a native Spark format: Spark's own streaming writer.
* Sinks that all read the same stream: ``foreachBatch`` hands the batch to each sink.
* Sinks on different branches: the query runs to each branch's root (the nearest step
  above a sink that does not run per batch: a source, a stateful step), each root once,
  packed into one tagged stream (one struct column per root), so the query stays one and
  every sink commits the same batch id; ``foreachBatch`` unpacks each root's rows and runs
  the per-batch steps from there to each sink. Sinks that share a root share its rows:
  the query never plans a stateful step twice (the copies would keep separate state, and
  Spark's exchange reuse starved the second copy of its rows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, NoReturn

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.connectors.base import run_batch
from headrace.environment.checkpoints import query_id
from headrace.errors import SinkError, describe, python_worker_crashed, raised_inside
from headrace.plan.graph import Plan
from headrace.plan.nodes import SinkNode
from headrace.spark import marked_counts, real_time, sink_timings, stages
from headrace.spark.batch_roots import shared_root
from headrace.spark.compiler import Compiled, Lowering, query_roots
from headrace.spark.real_time import REAL_TIME
from headrace.spark.specs import has_operators, native_sink_format, spec_of, stateful_steps, trigger_interval

SINK_TAG = "_hr_sink"
# Spark's writers that take asynchronous progress tracking: a stateless query writing with them
# logs each batch's offsets and commit beside the next batches instead of before and after it,
# which takes those writes off every batch's latency. The writer is at-least-once in any case
# (a replayed batch is written again), and stays so: a crash may replay a batch or two more.
ASYNC_PROGRESS_WRITERS = ("kafka",)
# How a drain's queries end (``headrace/runtime/runner.py``): the first reads what the sources hold
# when it starts and ends by itself (Spark's availableNow); the second runs the batch logged by
# hand in the offset log (``headrace/environment/end_of_time.py``) and then waits for a trigger
# that will not come before the runner stops it.
READ_AVAILABLE = "available now"
LOGGED_BATCH_ONLY = "logged batch only"
_NO_NEXT_TRIGGER = "1 day"
SAME_STREAM, FROM_ROOT, TAGGED = "same stream", "from root", "tagged"  # how a query reaches its sinks (_route)


def start_query(plan: Plan, compiled: Compiled, checkpoint: str, run_dir: str, asked_interval: str | None,
                ending: str | None = None, guard: Callable[[int], None] | None = None) -> Any:
    """Start the plan's query. ``guard(batch_id)``, when given, runs before a micro-batch's sinks
    commit and raises to stop them (a driver fenced off its checkpoint: ``hdfs_lease.py``)."""
    owner = f"{plan.name}@{query_id(checkpoint)}"
    sinks = [_bound(sink, owner) for sink in plan.sinks()]
    for sink in sinks:
        sink.connector.prepare(run_dir)
        sink.connector.locate_checkpoint(checkpoint)
    frames: dict[str, DataFrame] = compiled.sink_frames
    frames = {sink.name: frames[sink.name] for sink in sinks if sink.name in frames}  # none with operators
    root = shared_root(plan)
    native = native_sink_format(plan, sinks[0])
    route = _route(plan, compiled)
    if route == FROM_ROOT:
        assert root is not None
        stream, dispatch = _from_root(plan, compiled, root, sinks, run_dir, checkpoint, guard)
    elif route == SAME_STREAM:
        # Spark's own writer writes the query's stream as it is: the sink's frame, never a root
        # stream split per batch (a window processor's raw output has its internal columns)
        stream = frames[sinks[0].name]
        dispatch = _same_stream(plan.name, sinks, guard)
    else:
        stream, dispatch = _tagged(plan, compiled, sinks, run_dir, checkpoint, guard)
    if native:
        stream = sinks[0].connector.native_frame(stream)
    stateful = stateful_steps(plan)
    # the query runs on a copy of the session's settings taken when it starts
    stream.sparkSession.conf.set(stages.EXCHANGE_REUSE, "false" if stateful > 1 else "true")
    stream.sparkSession.conf.set(stages.ALLOW_MULTIPLE, "true" if stateful > 1 else "false")
    writer = (stream.writeStream.queryName(plan.name).option("checkpointLocation", checkpoint)
              .outputMode(compiled.output_mode))
    if ending == READ_AVAILABLE:
        writer = writer.trigger(availableNow=True)
    elif ending == LOGGED_BATCH_ONLY:
        writer = writer.trigger(processingTime=_NO_NEXT_TRIGGER)
    elif plan.trigger == REAL_TIME:
        if stateful:
            for key, value in real_time.STATE_SETTINGS.items():
                stream.sparkSession.conf.set(key, value)
        writer = writer.trigger(realTime=asked_interval or real_time.REAL_TIME_BATCH)  # type: ignore[call-overload]
    elif interval := trigger_interval(plan, asked_interval):
        writer = writer.trigger(processingTime=interval)
    if native:
        writer = writer.format(native).options(**sinks[0].connector.native_options())
        if sinks[0].connector.partition_by:
            writer = writer.partitionBy(*sinks[0].connector.partition_by)
        if native in ASYNC_PROGRESS_WRITERS and plan.trigger != REAL_TIME and not stateful and ending is None:
            writer = writer.options(asyncProgressTrackingEnabled="true", asyncProgressTrackingCheckpointIntervalMs="0")
    else:
        started = _StartedQuery()
        in_query = _steps_in_query(plan, route)
        marked = {position for position, mark in compiled.lowering.marks.items() if mark.step in in_query}
        reads_marks = bool(marked)  # the steps run per batch are read from Spark's store (counted_by_spark_store)
        writer = writer.foreachBatch(_reading_marks(plan.name, dispatch, started, marked) if reads_marks else dispatch)
        query = writer.start()
        if reads_marks:
            started.set(query)
        return query
    return writer.start()


class _StartedQuery:
    """The query ``foreachBatch`` runs in (Spark's ``StreamExecution``), once ``start`` has returned it."""

    WAIT_S = 30.0

    def __init__(self) -> None:
        self._set = threading.Event()
        self.jquery: Any = None

    def set(self, query: Any) -> None:
        try:
            self.jquery = query._jsq.streamingQuery()
        finally:
            self._set.set()

    def wait(self) -> Any:
        """The query, or None if it was not handed over."""
        self._set.wait(self.WAIT_S)
        return self.jquery


def _reading_marks(query: str, dispatch: Callable[[DataFrame, int], None], started: _StartedQuery,
                   marked: set[int]) -> Callable[[DataFrame, int], None]:
    """``dispatch``, then the batch's counts of the ``marked`` positions read from its plan
    (``marked_counts.py``), in the query's thread while the plan is the batch's."""
    markers = marked_counts.PlanMarkers(marked)

    def counted(df: DataFrame, batch_id: int) -> None:
        dispatch(df, batch_id)
        jquery = started.wait()
        try:
            if jquery is not None:
                markers.read_last_execution(query, batch_id, jquery)
        except Exception:  # noqa: BLE001 - a figure of the batch: never a reason to fail it
            pass
    return counted


def _route(plan: Plan, compiled: Compiled) -> str:
    """How the query reaches its sinks (the module's docstring): its stream as it is, split per batch
    below its sinks' shared root, or packed from each sink's branch root."""
    root = shared_root(plan)
    if has_operators(plan):
        return FROM_ROOT
    if native_sink_format(plan, plan.sinks()[0]) or (
            len({sink.inputs[0] for sink in plan.sinks()}) == 1
            and not (root and root in compiled.lowering.raw_outputs)):
        return SAME_STREAM
    return FROM_ROOT if root is not None else TAGGED


def _steps_in_query(plan: Plan, route: str) -> set[str]:
    """The steps the streaming query itself runs (those below its roots run per batch)."""
    tops = {plan.sinks()[0].inputs[0]} if route == SAME_STREAM else set(query_roots(plan))
    return tops.union(*(plan.upstream(top) for top in tops))


def counted_by_spark_store(plan: Plan, compiled: Compiled) -> bool:
    """Whether some marked counts are read from Spark's store of SQL executions: those of a query
    Spark's own writer writes, and those of the steps lowered per batch in ``foreachBatch``, which
    the sinks' executions run (``marked_counts.py``)."""
    if _route(plan, compiled) != SAME_STREAM:
        return True
    return bool(compiled.lowering.marks) and native_sink_format(plan, plan.sinks()[0]) is not None


def _bound(sink: SinkNode, owner: str) -> SinkNode:
    """The sink with its connector told the identity it commits batch ids under: pipeline,
    step name and checkpoint, so a restart skips what it committed and a fresh start does not."""
    bind = getattr(sink.connector, "bind", None)
    return replace(sink, connector=bind(f"{sink.name}/{owner}", sink.defined_at)) if bind else sink


def _raise_for(sink: SinkNode, exc: Exception, doing: str) -> NoReturn:
    if isinstance(exc, SinkError):
        raise exc
    upstream = raised_inside(str(exc), only=("StepFunctionError", "SourceError"))
    if upstream is not None:  # a step computing the batch failed, not the sink
        raise upstream from None
    if python_worker_crashed(str(exc)):  # a task computing the batch lost its worker: the runtime names the steps
        raise exc
    raise SinkError(f"sink '{sink.name}' ({sink.defined_at}) failed to {doing}: {describe(exc)}") from exc


def _deliver(query: str, sinks: list[SinkNode], batch: DataFrame, batch_id: int,
             frame_of: Callable[[int, SinkNode], DataFrame], guard: Callable[[int], None] | None) -> None:
    """Write a micro-batch to every sink that has not committed it yet.

    Spark commits a batch's stateful operators only when the batch is read to its end (4.1+
    fails it otherwise: STATE_STORE_COMMIT_VALIDATION_FAILED). A sink that writes reads its
    rows in full; a batch that every sink committed before (Spark replays the batch a crash
    interrupted) is run once into Spark's noop writer, so the restart goes on."""
    if guard is not None:
        guard(batch_id)
    written = 0
    for index, sink in enumerate(sinks):
        try:
            if sink.connector.committed(batch_id):
                continue
        except Exception as exc:
            _raise_for(sink, exc, f"check whether batch {batch_id} is committed")
        started = time.monotonic()
        try:
            sink.connector.write_batch(frame_of(index, sink), batch_id)
        except Exception as exc:
            _raise_for(sink, exc, f"write batch {batch_id}")
        sink_timings.record(query, batch_id, sink.name, round((time.monotonic() - started) * 1000))
        written += 1
    if not written:
        try:
            run_batch(batch)
        except Exception as exc:
            upstream = raised_inside(str(exc), only=("StepFunctionError", "SourceError"))
            if upstream is not None:
                raise upstream from None
            raise


def _same_stream(query: str, sinks: list[SinkNode], guard: Callable[[int], None] | None) -> Any:
    def dispatch(df: DataFrame, batch_id: int) -> None:
        if len(sinks) > 1:
            df = df.persist()
        try:
            _deliver(query, sinks, df, batch_id, lambda _index, _sink: df, guard)
        finally:
            if len(sinks) > 1:
                df.unpersist()
    return dispatch


@contextmanager
def _batch_lowering(plan: Plan, compiled: Compiled, df: DataFrame, run_dir: str) -> Iterator[Lowering]:
    """A ``Lowering`` for one micro-batch, ``df`` (persisted), marking the steps it counts in the
    query's marks; when it is done, the frames it cached and ``df`` are unpersisted."""
    per_batch = Lowering(plan, df.sparkSession, run_dir, marks=compiled.lowering.marks)
    try:
        yield per_batch
    finally:
        for cached in per_batch.cached:
            cached.unpersist()
        df.unpersist()


def _from_root(plan: Plan, compiled: Compiled, root: str, sinks: list[SinkNode], run_dir: str,
               checkpoint: str, guard: Callable[[int], None] | None) -> tuple[DataFrame, Any]:
    """The query runs up to ``root``, the stream every sink and operator descends from; each
    micro-batch of the root's rows is then lowered again, inside foreachBatch, down to them.

    A pipeline is one streaming query, so that a source is read once and every sink commits the
    same batch id, and a micro-batch is the streaming window. The query is split here when its
    one stream fans out below its root: when operators run (they run once per streaming window
    with its batch id, their instances' state saved beside the checkpoint, which only
    foreachBatch knows), when sinks read different streams below a shared root (a window's
    results and its late records, two branches of one source or one stateful step), or when they
    read a window run on headrace's window processor, whose stream carries its panes and late
    records together. Lowering each branch in the query instead
    would plan the root's stateful step once per branch, each copy with state of its own. Every
    step below the root runs per batch (its spec's ``per_batch``: the same rows on one
    micro-batch as on the stream), so a ``Lowering`` seeded with the batch's rows of the root
    builds them as plain DataFrames; the operators run first, each once, so each saves its state
    even in a batch every sink had committed before the restart that replays it."""
    lowering = compiled.lowering
    stream = lowering.root_stream(root)
    operators = [n.name for n in plan.nodes.values() if spec_of(n).own_state]
    # the batch is read once (one sink that reads it in one pass, on a line of steps from the
    # root, no operator): it is not cached first
    once = (not operators and len(sinks) == 1 and sinks[0].connector.reads_batch_once
            and _on_a_line(plan, root, sinks[0]))

    def dispatch(df: DataFrame, batch_id: int) -> None:
        if not once:
            df = df.persist()
        with _batch_lowering(plan, compiled, df, run_dir) as per_batch:
            per_batch.batch_id, per_batch.checkpoint = batch_id, checkpoint
            per_batch.seed(root, df)
            for name in operators:  # every window runs and saves its state, even when the sinks have the batch
                per_batch.frame(name)
            _deliver(plan.name, sinks, df, batch_id, lambda _index, sink: per_batch.frame(sink.name), guard)
    return stream, dispatch


def _on_a_line(plan: Plan, root: str, sink: SinkNode) -> bool:
    """Whether the steps from ``root`` down to ``sink`` form a line: each reads one input and is
    read by one step, so the sink reads the root's rows once."""
    name = sink.inputs[0]
    while name != root:
        node = plan.nodes[name]
        if len(node.inputs) != 1 or len(plan.consumers(name)) != 1:
            return False
        name = node.inputs[0]
    return len(plan.consumers(root)) == 1


def _tagged(plan: Plan, compiled: Compiled, sinks: list[SinkNode], run_dir: str,
            checkpoint: str, guard: Callable[[int], None] | None) -> tuple[DataFrame, Any]:
    roots = query_roots(plan)  # the sinks share none: each sink's branch root, each once
    packed = None
    for index, root in enumerate(roots):
        frame = compiled.lowering.root_stream(root)
        part = frame.select(F.lit(index).alias(SINK_TAG), F.struct(*[F.col(f"`{c}`") for c in frame.columns])
                            .alias(f"{SINK_TAG}_{index}"))
        packed = part if packed is None else packed.unionByName(part, allowMissingColumns=True)
    assert packed is not None

    def dispatch(df: DataFrame, batch_id: int) -> None:
        df = df.persist()
        with _batch_lowering(plan, compiled, df, run_dir) as per_batch:
            per_batch.batch_id, per_batch.checkpoint = batch_id, checkpoint
            for index, root in enumerate(roots):
                per_batch.seed(root, df.filter(F.col(SINK_TAG) == index).select(f"{SINK_TAG}_{index}.*"))
            _deliver(plan.name, sinks, df, batch_id, lambda _index, sink: per_batch.frame(sink.name), guard)
    return packed, dispatch
