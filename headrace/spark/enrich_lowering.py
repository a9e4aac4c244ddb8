"""An enrich step (``stream.enrich``), lowered in each micro-batch inside foreachBatch.

The calls run in Spark's Python workers (``headrace/engine/enrichment.py``), an Arrow batch at a
time. Their output, with each failed record's reason, is persisted for the micro-batch, so the
records that go on and the dead letters come from one round of calls, however many sinks read
them. A replayed micro-batch (a restart after a crash) calls the service again for its records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.engine.enrichment import ERROR, POSITION, RAW, EnrichBatches
from headrace.plan.graph import Plan
from headrace.plan.nodes import DeadLettersNode, EnrichNode
from headrace.schema import to_ddl

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation


def lower_enrich(node: EnrichNode, lowering: Compilation) -> DataFrame:
    if lowering.batch_id is None:
        raise AssertionError(f"enrich step {node.name!r} is lowered outside a micro-batch")
    df = lowering.input(node)
    calls = EnrichBatches(node.name, node.defined_at, node.fn, node.calls, node.added, lowering.batch_id,
                          to_dead_letters=dead_letters_asked(lowering.plan, node.name))
    schema = (f"{', '.join(f'`{name}` {kind}' for name, kind in df.dtypes)}, {to_ddl(node.added)}, "
              f"{ERROR} string, {POSITION} string, {RAW} string")
    raw = df.mapInArrow(calls, schema).persist()
    lowering.cached.append(raw)
    lowering.raw_outputs[node.name] = raw
    return raw.filter(F.col(ERROR).isNull()).drop(ERROR, POSITION, RAW)


def enrich_failures(node: EnrichNode, lowering: Compilation) -> DataFrame:
    """The dead letters of ``node``: its records whose calls all failed, with the reason."""
    lowering.frame(node.name)
    raw = lowering.raw_outputs[node.name]
    return raw.filter(F.col(ERROR).isNotNull()).select(
        F.lit(node.name).alias("source"), F.col(POSITION).alias("position"), F.col(RAW).alias("raw"),
        F.col(ERROR).alias("error"))


def dead_letters_asked(plan: Plan, step: str) -> bool:
    return any(isinstance(n, DeadLettersNode) and step in n.inputs for n in plan.nodes.values())
