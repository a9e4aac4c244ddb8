"""What a lowering function gets: the compilation in progress (``headrace/spark/compiler.py``).

The lowering modules (stateless, windows, sql, rolling, process, operator stages) read the
plan and the DataFrames built so far through this interface, and the compiler, which calls
them through the specs, implements it: neither imports the other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from headrace.plan.graph import Plan
from headrace.plan.nodes import Node, SourceNode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class Compilation(Protocol):
    """One compilation: the plan, the session, the DataFrames built so far and where the
    watermarks go."""

    plan: Plan
    spark: SparkSession
    run_dir: str
    query_checkpoint: str  # the query's checkpoint ("" when compiled without one)
    fields_read: dict[str, frozenset[str]]  # by source: the checked fields some step reads (absent: all)
    probe_fields: bool  # a probe: sources mark their checked fields' conversions (headrace/spark/fields_read.py)
    chains: dict[str, list[str]]  # the fused Python chains, by their last step
    scans: Counter[str]  # how many times the query scans each source
    lenient_sources: frozenset[str]  # sources not read strictly (SourceContext.strict): one met a bad record
    strict_sources: set[str]  # the sources read strictly, as they are lowered
    raw_sources: dict[str, DataFrame]
    observed_sources: dict[str, DataFrame]
    raw_outputs: dict[str, DataFrame]
    batch_id: int | None  # inside foreachBatch: the micro-batch's id and the checkpoint
    checkpoint: str | None
    cached: list[DataFrame]

    def frame(self, name: str) -> DataFrame: ...

    def input(self, node: Node, index: int = 0) -> DataFrame: ...

    def root_stream(self, name: str) -> DataFrame: ...

    def result_time(self, node: Node) -> bool: ...

    def needs_control(self, source: str) -> bool: ...

    def dead_letters_by_good_rows(self, source: SourceNode) -> bool: ...

    def mark_good_rows(self, df: DataFrame, source: str) -> DataFrame: ...

    def control_needed_after(self, name: str) -> bool: ...

    def filters_before_window(self, names: Iterable[str]) -> bool: ...

    def watermark_delay(self, name: str) -> int | None: ...

    def watermark_here(self, node: Node) -> bool: ...
