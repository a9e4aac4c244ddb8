"""Start a pipeline's one streaming query and fan each micro-batch out to its sinks.

* One sink with a native Spark format: Spark's own streaming writer.
* Sinks that all read the same stream: ``foreachBatch`` hands the batch to each sink.
* Sinks on different branches: the branches are packed into one tagged stream (one
  struct column per sink), so the query stays one and every sink commits the same
  batch id; ``foreachBatch`` unpacks each sink's rows.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.errors import SinkError
from headrace.plan.graph import Plan
from headrace.plan.nodes import SinkNode
from headrace.runtime.checkpoints import query_id

SINK_TAG = "_hr_sink"


def start_query(plan: Plan, compiled: Any, checkpoint: str, run_dir: str, trigger_interval: str | None) -> Any:
    owner = f"{plan.name}@{query_id(checkpoint)}"
    sinks = [_bound(sink, owner) for sink in plan.sinks()]
    for sink in sinks:
        sink.connector.prepare(run_dir)
    frames: dict[str, DataFrame] = compiled.sink_frames
    inputs = {sink.inputs[0] for sink in sinks}
    frames = {sink.name: frames[sink.name] for sink in sinks}
    if len(inputs) == 1:
        stream = frames[sinks[0].name]
        dispatch = _same_stream(sinks)
    else:
        stream, dispatch = _tagged(sinks, frames)
    writer = (stream.writeStream.queryName(plan.name).option("checkpointLocation", checkpoint)
              .outputMode(compiled.output_mode))
    if trigger_interval:
        writer = writer.trigger(processingTime=trigger_interval)
    native = sinks[0].connector.native_format if len(sinks) == 1 else None
    if native:
        writer = writer.format(native).options(**sinks[0].connector.native_options())
    else:
        writer = writer.foreachBatch(dispatch)
    return writer.start()


def _bound(sink: SinkNode, owner: str) -> SinkNode:
    """The sink with its connector told the identity it commits batch ids under: pipeline,
    step name and checkpoint, so a restart skips what it committed and a fresh start does not."""
    bind = getattr(sink.connector, "bind", None)
    return replace(sink, connector=bind(f"{sink.name}/{owner}")) if bind else sink


def _write(sink: SinkNode, df: DataFrame, batch_id: int) -> None:
    try:
        sink.connector.write_batch(df, batch_id)
    except SinkError:
        raise
    except Exception as exc:
        raise SinkError(f"sink '{sink.name}' ({sink.defined_at}) failed to write batch {batch_id}: "
                        f"{type(exc).__name__}: {exc}") from exc


def _same_stream(sinks: list[SinkNode]) -> Any:
    def dispatch(df: DataFrame, batch_id: int) -> None:
        if len(sinks) > 1:
            df = df.persist()
        try:
            for sink in sinks:
                _write(sink, df, batch_id)
        finally:
            if len(sinks) > 1:
                df.unpersist()
    return dispatch


def _tagged(sinks: list[SinkNode], frames: dict[str, DataFrame]) -> tuple[DataFrame, Any]:
    packed = None
    for index, sink in enumerate(sinks):
        frame = frames[sink.name]
        part = frame.select(F.lit(index).alias(SINK_TAG), F.struct(*[F.col(f"`{c}`") for c in frame.columns])
                            .alias(f"{SINK_TAG}_{index}"))
        packed = part if packed is None else packed.unionByName(part, allowMissingColumns=True)
    assert packed is not None

    def dispatch(df: DataFrame, batch_id: int) -> None:
        df = df.persist()
        try:
            for index, sink in enumerate(sinks):
                _write(sink, df.filter(F.col(SINK_TAG) == index).select(f"{SINK_TAG}_{index}.*"), batch_id)
        finally:
            df.unpersist()
    return packed, dispatch
