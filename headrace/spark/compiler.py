"""Compile a plan to one Spark streaming DataFrame per sink.

``Lowering`` walks the plan from the sinks up, lowering each node as its kind's entry in
``headrace/spark/lowerings.py`` says, with the watermarks where ``headrace/spark/watermarks.py``
places them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from headrace.contract import CONTROL_COLUMN
from headrace.plan.graph import Plan
from headrace.plan.nodes import Node, SourceNode, StreamJoinNode, WindowAggregateNode
from headrace.spark.batch_roots import branch_root, shared_root
from headrace.spark.clocks import uses_test_clock
from headrace.spark.fields_read import checked_fields_read, sources_with_checked_fields
from headrace.spark.join_lowering import join_pairs
from headrace.spark.lowerings import LOWERINGS
from headrace.spark.marked_counts import GOOD_ROWS, MarkedStep
from headrace.spark.specs import has_operators, output_mode, result_time_needed, spec_of, window_needs_processor
from headrace.spark.sql import register_functions
from headrace.spark.stateless import good_rows, with_watermark
from headrace.spark.step_counts import control_paths, count_records, counted, mark_records, marked
from headrace.spark.watermarks import WatermarkPlacement
from headrace.spark.window_lowering import window_panes


@dataclass
class Compiled:
    """What the runtime starts: the DataFrame each sink writes, and how."""

    sink_frames: dict[str, DataFrame]
    output_mode: str
    lowering: Lowering

    def frames(self) -> list[DataFrame]:
        """What the sinks read: their frames, or with operators (run per batch on every column of
        the shared root's rows) the root's stream."""
        root = shared_root(self.lowering.plan)
        if self.sink_frames or root is None:
            return list(self.sink_frames.values())
        return [self.lowering.root_stream(root)]


class Lowering(WatermarkPlacement):
    """State of one compilation: the plan, the session and the DataFrames built so far."""

    def __init__(self, plan: Plan, spark: SparkSession, run_dir: str, query_checkpoint: str = "",
                 fields_read: dict[str, frozenset[str]] | None = None, probe_fields: bool = False,
                 count_steps: bool = False, marks: dict[int, MarkedStep] | None = None,
                 lenient_sources: frozenset[str] = frozenset()) -> None:
        super().__init__(plan)
        # the sources a strict read (SourceContext.strict) may not take: they met a bad record this run
        self.lenient_sources = lenient_sources
        self.strict_sources: set[str] = set()
        self.count_steps = count_steps  # the streaming query's lowering: each step's records are counted
        # the steps counted by a marker, by plan position: the query's, and those a micro-batch's
        # lowering adds (inside foreachBatch, the steps below the query's root; given the query's)
        self.marks: dict[int, MarkedStep] = {} if marks is None else marks
        self.spark, self.run_dir, self.query_checkpoint = spark, run_dir, query_checkpoint
        self.fields_read, self.probe_fields = fields_read or {}, probe_fields
        self.frames: dict[str, DataFrame] = {}
        self.watermarked: dict[str, DataFrame] = {}
        self.raw_sources: dict[str, DataFrame] = {}  # a source's rows with its dead letters, for dead_letters()
        self.observed_sources: dict[str, DataFrame] = {}  # the same with the source's metrics, to run a query to
        self.raw_outputs: dict[str, DataFrame] = {}  # a window processor's or a join's output with its late records
        self.scans = source_scans(plan)  # how many times the query scans each source
        # inside foreachBatch (writer.py): the micro-batch's id and the checkpoint, for operators
        self.batch_id: int | None = None
        self.checkpoint: str | None = None
        self.cached: list[DataFrame] = []  # DataFrames persisted for this micro-batch, unpersisted after it

    def seed(self, name: str, df: DataFrame) -> None:
        """Start from ``df`` as the output of step ``name`` (a micro-batch, inside foreachBatch)."""
        node = self.plan.nodes[name]
        if isinstance(node, WindowAggregateNode) and window_needs_processor(self.plan, node):
            self.raw_outputs[name] = df
            df = self._counted_here(window_panes(df, node), node)
        elif isinstance(node, StreamJoinNode) and self.plan.late_output_asked(name):
            self.raw_outputs[name] = df
            df = self._counted_here(join_pairs(df), node)
        elif isinstance(node, SourceNode) and node.connector.emits_dead_letters:
            self.raw_sources[name] = df
            df = good_rows(node, df, self)
        self.frames[name] = df

    def _counted_here(self, df: DataFrame, node: Node) -> DataFrame:
        """A counted step's results split from its raw output in the micro-batch (the query ran to
        the raw output, so the metric the query's lowering put on its results never ran), under
        the step's marker."""
        return self._mark(df, MarkedStep(node.name, 0)) if counted(self.plan, node) else df

    def root_stream(self, name: str) -> DataFrame:
        """The stream a query runs to when each micro-batch is split in foreachBatch below step
        ``name``: a window processor's raw output, a source's rows with its dead letters, or
        the step's output."""
        frame = self.frame(name)
        return self.raw_outputs.get(name) or self.observed_sources.get(name) or frame

    def frame(self, name: str) -> DataFrame:
        if name not in self.frames:
            node = self.plan.nodes[name]
            df = LOWERINGS[type(node)].lower(node, self)
            if self.count_steps and counted(self.plan, node):
                df = count_records(df, node)
            elif (self.count_steps or self.batch_id is not None) and marked(self.plan, node, self.count_steps):
                df = self._marked(df, name)
            self.frames[name] = df
        return self.frames[name]

    def _marked(self, df: DataFrame, name: str) -> DataFrame:
        """``df`` under the step's marker, its control rows' copies noted (or as it is, uncounted,
        when they cannot be told: ``step_counts.control_paths``)."""
        copies = control_paths(self.plan, name) if CONTROL_COLUMN in df.columns else 0
        return df if copies is None else self._mark(df, MarkedStep(name, copies))

    def _mark(self, df: DataFrame, mark: MarkedStep) -> DataFrame:
        position = list(self.plan.nodes).index(mark.step)
        self.marks[position] = mark
        return mark_records(df, position)

    def dead_letters_by_good_rows(self, source: SourceNode) -> bool:
        """Whether the query counts ``source``'s dead letters as its input rows less a marker's
        count of its good rows, instead of an observed metric on its rows (a plan node evaluated
        row by row above the scan: about a tenth of a stateless query's time). For a pipeline's
        one source, scanned once, whose good rows the query reads (its dead letters not split off
        per batch) and whose control rows stay behind (Spark's count of its input is then its
        records)."""
        plan = self.plan
        return (self.count_steps and len(plan.sources()) == 1 and self.scans.get(source.name, 1) == 1
                and source.connector.emits_dead_letters and not self.needs_control(source.name)
                and not _split_per_batch(plan, source.name))

    def mark_good_rows(self, df: DataFrame, source: str) -> DataFrame:
        """The source's good rows under its marker (``dead_letters_by_good_rows``)."""
        return self._mark(df, MarkedStep(source, 0, GOOD_ROWS))

    def result_time(self, node: Node) -> bool:
        """Whether the stateful step ``node``'s results carry their event time (``RESULT_TIME``)
        for a later stateful step (``headrace/spark/stages.py``)."""
        return result_time_needed(self.plan, node)

    def needs_control(self, source: str) -> bool:
        """Whether control rows of ``source`` must travel on: some event-time step reads it."""
        return any(spec_of(n).reads_control and source in self.plan.upstream(n.name)
                   for n in self.plan.nodes.values())

    def control_needed_after(self, name: str) -> bool:
        """Whether the control rows in ``name``'s output still have work to do: a watermark is
        declared below it (on its output, on an edge, or by a step further on) before a window,
        or the test kit's clock rows must reach a stateful step. Once past the watermark,
        control rows have moved it and can go."""
        if uses_test_clock(self.plan):
            return True
        todo, seen = [name], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            node = self.plan.nodes[current]
            if current != name and self.watermark_here(node):
                return True
            for consumer in self.plan.consumers(current):
                if self.watermark_on_edge(current, consumer.name):
                    return True
                if not spec_of(consumer).reads_watermark:
                    todo.append(consumer.name)
        return False

    def input(self, node: Node, index: int = 0) -> DataFrame:
        """The DataFrame of ``node``'s input, with the watermark declared on the way in when
        this edge is where it belongs (see ``watermark_on_edge``)."""
        name = node.inputs[index]
        df = self.frame(name)
        if not self.watermark_on_edge(name, node.name):
            return df
        if name not in self.watermarked:
            producer, delay = self.plan.nodes[name], self.watermark_delay(name)
            assert producer.event_time is not None and delay is not None
            takers = [c.name for c in self.plan.consumers(name) if self.watermark_on_edge(name, c.name)]
            self.watermarked[name] = with_watermark(df, producer.event_time, delay,
                                                    barrier=self.filters_before_window(takers))
        return self.watermarked[name]


def _split_per_batch(plan: Plan, source: str) -> bool:
    """Whether each micro-batch of ``source``'s rows, with its dead letters, is split in
    foreachBatch (``headrace/spark/writer.py``): the source is a root the query runs to, and its
    sinks do not all read it as it is (a step below it, the dead letters or an operator reads it).
    When every sink reads the source itself, the query writes the source's good rows as they are."""
    if source not in query_roots(plan):
        return False
    return has_operators(plan) or any(sink.inputs[0] != source for sink in plan.sinks())


def query_roots(plan: Plan) -> list[str]:
    """The steps the pipeline's query runs to (``headrace/spark/writer.py``): the sinks' shared
    root, or else each sink's branch root, each once."""
    root = shared_root(plan)
    return [root] if root is not None else list(dict.fromkeys(branch_root(plan, s) for s in plan.sinks()))


def source_scans(plan: Plan) -> Counter[str]:
    """How many times the query scans each source: once per path from the query's roots down to
    it. Spark plans a query as a tree, so a source feeding two roots (a window and the dead
    letters) is scanned in each micro-batch once per root."""
    below: dict[str, Counter[str]] = {}

    def paths(name: str) -> Counter[str]:
        if name not in below:
            node = plan.nodes[name]
            found = Counter({name: 1}) if isinstance(node, SourceNode) else Counter[str]()
            # a join whose late records are asked for reads each side twice (join_lowering.py)
            reads = 2 if isinstance(node, StreamJoinNode) and plan.late_output_asked(name) else 1
            for upstream in node.inputs:
                for _ in range(reads):
                    found += paths(upstream)
            below[name] = found
        return below[name]

    total = Counter[str]()
    for root in query_roots(plan):
        total += paths(root)
    return total


def compile_plan(plan: Plan, spark: SparkSession, run_dir: str, checkpoint: str = "",
                 lenient_sources: frozenset[str] = frozenset()) -> Compiled:
    """The plan's Spark query, to run from ``checkpoint``, its ``lenient_sources`` not read
    strictly (``SourceContext.strict``). The plan has passed ``check_plan`` (the runner checks it
    first)."""
    register_functions(plan, spark)
    fields_read = None
    if sources_with_checked_fields(plan):  # a probe first: which of those fields the query reads
        probe = _compile(Lowering(plan, spark, run_dir, checkpoint, probe_fields=True))
        fields_read = checked_fields_read(plan, spark, probe.frames())
    return _compile(Lowering(plan, spark, run_dir, checkpoint, fields_read, count_steps=True,
                             lenient_sources=lenient_sources))


def _compile(lowering: Lowering) -> Compiled:
    plan = lowering.plan
    if has_operators(plan):  # the query runs to the shared root; operators and sinks run per batch
        root = shared_root(plan)
        assert root is not None  # check_plan refuses the plan otherwise
        lowering.frame(root)
        return Compiled({}, output_mode(plan), lowering)
    frames = {sink.name: lowering.frame(sink.name) for sink in plan.sinks()}
    return Compiled(frames, output_mode(plan), lowering)
