"""Compile a plan to one Spark streaming DataFrame per sink.

``Lowering`` walks the plan from the sinks up, asking each node's spec
(``headrace/spark/specs.py``) to lower it, and decides where the watermark is declared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from headrace.plan.graph import Plan
from headrace.plan.nodes import EventTimeNode, NativeStep, Node, PythonStep, SourceNode, WindowAggregateNode
from headrace.spark.specs import (
    branch_root,
    check_plan,
    has_operators,
    output_mode,
    python_chains,
    shared_root,
    spec_of,
)
from headrace.spark.stages import result_time_needed
from headrace.spark.stateful import uses_test_clock
from headrace.spark.stateless import good_rows, with_watermark
from headrace.spark.windows import window_needs_processor, window_panes


@dataclass
class Compiled:
    """What the runtime starts: the DataFrame each sink writes, and how."""

    sink_frames: dict[str, DataFrame]
    output_mode: str
    lowering: Lowering


class WatermarkPlacement:
    """Where the plan's watermarks are declared in Spark (read by the compiler and ``explain``).

    Spark refuses a second watermark on one lineage, and a Python stage hides the first from
    what follows it, so a Python step carrying event time (or a new event-time declaration)
    declares the watermark again for what follows it. Each window needs one watermark on every
    path from its event-time declarations: the nearest place above the window from which no
    path meets such a step. A branch that reaches no window gets none: its watermark would
    only hold back the windows' (Spark combines watermarks by their minimum)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.chains = {chain[-1]: chain for chain in python_chains(plan)}

    def _reach(self, names: Iterable[str]) -> tuple[bool, bool]:
        """What records entering the nodes ``names`` meet, until a window: (a window, a step
        that declares the watermark again)."""
        window = redeclared = False
        todo, seen = list(names), set()
        while todo:
            current = self.plan.nodes[todo.pop()]
            if current.name in seen:
                continue
            seen.add(current.name)
            if spec_of(current).reads_watermark:
                window = True
            elif isinstance(current, EventTimeNode) or (
                    isinstance(current, PythonStep) and current.event_time is not None):
                redeclared = True
            else:
                todo.extend(c.name for c in self.plan.consumers(current.name))
        return window, redeclared

    def _carries_time(self, name: str) -> bool:
        return self.plan.nodes[name].event_time is not None and self.watermark_delay(name) is not None

    def watermark_here(self, node: Node) -> bool:
        """Whether an event-time declaration or a Python stage declares the watermark on its output:
        when no step after it declares it again and a window follows (or, in a pipeline without
        windows, for the progress reports)."""
        if not self._carries_time(node.name):
            return False
        if not isinstance(node, EventTimeNode) and node.name not in self.chains:
            return False
        window, redeclared = self._reach(c.name for c in self.plan.consumers(node.name))
        has_windows = any(spec_of(n).reads_watermark for n in self.plan.nodes.values())
        return not redeclared and (window or not has_windows)

    def watermark_on_edge(self, name: str, consumer: str) -> bool:
        """Whether the watermark goes between ``name`` and ``consumer``: where the paths from a
        declaration part, towards a window, away from the steps that declare it again."""
        if not self._carries_time(name):
            return False
        if not self._reach(c.name for c in self.plan.consumers(name))[1]:
            return False  # declared on this node or above it, or not needed
        window, redeclared = self._reach([consumer])
        return window and not redeclared

    def watermark_delay(self, name: str) -> int | None:
        """The delay of the nearest event-time declaration upstream of ``name``; None below a
        stateful step, whose results carry Spark's watermark on (``headrace/spark/stages.py``)."""
        node = self.plan.nodes[name]
        while True:
            if isinstance(node, EventTimeNode):
                return node.delay_ms
            if not node.inputs or spec_of(node).stateful:
                return None
            node = self.plan.nodes[node.inputs[0]]

    def filters_before_window(self, names: Iterable[str]) -> bool:
        """Whether records entering the nodes ``names`` can meet, before the step that reads the
        watermark, a filter Catalyst would push below the watermark operator (so the records it
        removes would no longer move the watermark): a native filter, a join with a table (its
        inferred not-null filters), an SQL query (WHERE, joins). Then the watermark needs a
        barrier above it (``headrace/spark/stateless.py``, ``with_watermark``)."""
        todo, seen = list(names), set()
        while todo:
            node = self.plan.nodes[todo.pop()]
            if node.name in seen:
                continue
            seen.add(node.name)
            if node.kind in ("sql", "join") or (isinstance(node, NativeStep) and node.mode == "filter"):
                return True
            if not spec_of(node).reads_watermark and not spec_of(node).stateful:
                todo.extend(c.name for c in self.plan.consumers(node.name))
        return False

    def where_taken(self, node: Node) -> str:
        """For ``explain``: where the watermark of the event-time declaration ``node`` is taken."""
        if self.watermark_here(node):
            after = [c.name for c in self.plan.consumers(node.name)]
            kept = (": the filters after it run above it (a barrier stops Catalyst pushing them below), so every "
                    "record moves it" if self.filters_before_window(after) else "")
            return f"watermark taken here{kept}"
        edges = self._edges_below(node.name)
        if edges:
            return ("watermark taken on the way into " + ", ".join(repr(c) for _, c in edges)
                    + " (a Python step with event time declares it again on the other path)")
        return "no watermark taken here: no window reads it, or a step after it declares it again"

    def _edges_below(self, name: str) -> list[tuple[str, str]]:
        """The edges below step ``name`` on which the watermark is declared (``watermark_on_edge``)."""
        edges, todo, seen = [], [name], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            for consumer in self.plan.consumers(current):
                if self.watermark_on_edge(current, consumer.name):
                    edges.append((current, consumer.name))
                elif not spec_of(consumer).reads_watermark and not isinstance(consumer, EventTimeNode):
                    todo.append(consumer.name)
        return edges


class Lowering(WatermarkPlacement):
    """State of one compilation: the plan, the session and the DataFrames built so far."""

    def __init__(self, plan: Plan, spark: SparkSession, run_dir: str) -> None:
        super().__init__(plan)
        self.spark, self.run_dir = spark, run_dir
        self.frames: dict[str, DataFrame] = {}
        self.watermarked: dict[str, DataFrame] = {}
        self.raw_sources: dict[str, DataFrame] = {}  # a source's rows with its dead letters, for dead_letters()
        self.observed_sources: dict[str, DataFrame] = {}  # the same with the source's metrics, to run a query to
        self.raw_windows: dict[str, DataFrame] = {}  # a window processor's output: panes and late records
        self.scans = source_scans(plan)  # how many times the query scans each source
        # inside foreachBatch (writer.py): the micro-batch's id and the checkpoint, for operators
        self.batch_id: int | None = None
        self.checkpoint: str | None = None
        self.cached: list[DataFrame] = []  # DataFrames persisted for this micro-batch, unpersisted after it

    def seed(self, name: str, df: DataFrame) -> None:
        """Start from ``df`` as the output of step ``name`` (a micro-batch, inside foreachBatch)."""
        node = self.plan.nodes[name]
        if isinstance(node, WindowAggregateNode) and window_needs_processor(self.plan, node):
            self.raw_windows[name] = df
            df = window_panes(df, node)
        elif isinstance(node, SourceNode) and node.connector.emits_dead_letters:
            self.raw_sources[name] = df
            df = good_rows(node, df, self)
        self.frames[name] = df

    def root_stream(self, name: str) -> DataFrame:
        """The stream a query runs to when each micro-batch is split in foreachBatch below step
        ``name``: a window processor's raw output, a source's rows with its dead letters, or
        the step's output."""
        frame = self.frame(name)
        return self.raw_windows.get(name) or self.observed_sources.get(name) or frame

    def frame(self, name: str) -> DataFrame:
        if name not in self.frames:
            node = self.plan.nodes[name]
            self.frames[name] = spec_of(node).lower(node, self)
        return self.frames[name]

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
            for upstream in node.inputs:
                found += paths(upstream)
            below[name] = found
        return below[name]

    total = Counter[str]()
    for root in query_roots(plan):
        total += paths(root)
    return total


def compile_plan(plan: Plan, spark: SparkSession, run_dir: str) -> Compiled:
    check_plan(plan)
    lowering = Lowering(plan, spark, run_dir)
    if has_operators(plan):  # the query runs to the shared root; operators and sinks run per batch
        root = shared_root(plan)
        assert root is not None  # check_plan refuses the plan otherwise
        lowering.frame(root)
        return Compiled({}, output_mode(plan), lowering)
    frames = {sink.name: lowering.frame(sink.name) for sink in plan.sinks()}
    return Compiled(frames, output_mode(plan), lowering)
