"""Lower a plan to one Spark streaming DataFrame per sink.

One handler per node kind, registered with ``@handles``; each turns a node and the
DataFrames of its inputs into a DataFrame. See ``headrace/connectors/base.py`` for the
control rows (``_hr_ctl``) that carry watermark moves and the end-of-input flush through
stateless steps until the operator that needs them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from headrace.aggregates import Agg
from headrace.connectors.base import CONTROL_COLUMN, DEAD_COLUMNS, SourceContext
from headrace.plan.graph import Plan
from headrace.plan.lowering import output_mode, python_chains, window_needs_processor
from headrace.plan.nodes import (
    DeadLettersNode,
    EventTimeNode,
    JoinNode,
    KeyedProcessNode,
    LateRecordsNode,
    NativeStep,
    Node,
    PythonStep,
    RollingAggregateNode,
    SinkNode,
    SourceNode,
    TableNode,
    UnionNode,
    WindowAggregateNode,
    function_label,
)
from headrace.runtime.progress import DEAD_LETTER_METRIC_PREFIX, LATE_METRIC_PREFIX
from headrace.schema import to_ddl
from headrace.spark.expressions import to_column
from headrace.spark.fused import FusedStage, StepSpec, arrow_schema
from headrace.spark.process import lower_keyed_process
from headrace.spark.rolling import reduce_per_key
from headrace.spark.windows import OUTPUT_KIND, lower_window_processor, window_late_records, window_panes

Handler = Callable[[Any, "Lowering"], DataFrame]
HANDLERS: dict[str, Handler] = {}
# Steps that read the watermark (windows, and process steps for their event-time timers).
STATEFUL_EVENT_TIME = (WindowAggregateNode, KeyedProcessNode)


def handles(kind: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        HANDLERS[kind] = handler
        return handler
    return register


@dataclass
class Compiled:
    """What the runtime starts: the DataFrame each sink writes, and how."""

    sink_frames: dict[str, DataFrame]
    output_mode: str
    lowering: Any = None


class Lowering:
    """State of one compilation: the plan, the session and the DataFrames built so far."""

    def __init__(self, plan: Plan, spark: SparkSession, run_dir: str) -> None:
        self.plan, self.spark, self.run_dir = plan, spark, run_dir
        self.frames: dict[str, DataFrame] = {}
        self.watermarked: dict[str, DataFrame] = {}
        self.raw_sources: dict[str, DataFrame] = {}
        self.raw_windows: dict[str, DataFrame] = {}  # a window processor's output: panes and late records
        self.chains = {chain[-1]: chain for chain in python_chains(plan)}

    def seed(self, name: str, df: DataFrame) -> None:
        """Start from ``df`` as the output of step ``name`` (a micro-batch, inside foreachBatch)."""
        node = self.plan.nodes[name]
        if isinstance(node, WindowAggregateNode) and window_needs_processor(self.plan, node):
            self.raw_windows[name] = df
            df = window_panes(df, node.schema)
        self.frames[name] = df

    def frame(self, name: str) -> DataFrame:
        if name not in self.frames:
            node = self.plan.nodes[name]
            self.frames[name] = HANDLERS[node.kind](node, self)
        return self.frames[name]

    def needs_control(self, source: str) -> bool:
        """Whether control rows of ``source`` must travel on: some event-time step reads it."""
        return any(isinstance(n, (EventTimeNode, KeyedProcessNode)) and source in self.plan.upstream(n.name)
                   for n in self.plan.nodes.values())

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
            self.watermarked[name] = with_watermark(df, producer.event_time, delay)
        return self.watermarked[name]

    # Where the watermark goes. Spark refuses a second watermark on one lineage, and a Python
    # stage hides the first from what follows it, so a Python step carrying event time (or a new
    # event-time declaration) declares the watermark again for what follows it. Each window needs
    # one watermark on every path from its event-time declarations: the nearest place above the
    # window from which no path meets such a step. A branch that reaches no window gets none: its
    # watermark would only hold back the windows' (Spark combines watermarks by their minimum).

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
            if isinstance(current, STATEFUL_EVENT_TIME):
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
        has_windows = any(isinstance(n, STATEFUL_EVENT_TIME) for n in self.plan.nodes.values())
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
        """The delay of the nearest event-time declaration upstream of ``name``."""
        node = self.plan.nodes[name]
        while True:
            if isinstance(node, EventTimeNode):
                return node.delay_ms
            if not node.inputs:
                return None
            node = self.plan.nodes[node.inputs[0]]


def compile_plan(plan: Plan, spark: SparkSession, run_dir: str) -> Compiled:
    plan.validate()
    lowering = Lowering(plan, spark, run_dir)
    frames = {sink.name: lowering.frame(sink.name) for sink in plan.sinks()}
    return Compiled(frames, output_mode(plan), lowering)


# -- control rows ----------------------------------------------------------------------------

def is_data() -> Column:
    """True on data rows, in a form Catalyst cannot push below the watermark operator
    (``spark_partition_id`` is non-deterministic), so the watermark still sees control rows."""
    return F.col(CONTROL_COLUMN).isNull() | (F.spark_partition_id() < 0)


def without_control(df: DataFrame) -> DataFrame:
    if CONTROL_COLUMN not in df.columns:
        return df
    return df.filter(is_data()).drop(CONTROL_COLUMN)


# -- handlers ---------------------------------------------------------------------------------

@handles("source")
def lower_source(node: SourceNode, lowering: Lowering) -> DataFrame:
    context = SourceContext(lowering.run_dir, node.name)
    os.makedirs(lowering.run_dir, exist_ok=True)
    node.connector.prepare(context)
    data_source: Any = node.connector.data_source()
    lowering.spark.dataSource.register(data_source)
    df = (lowering.spark.readStream.format(data_source.name())
          .options(**node.connector.options(), **context.options()).load())
    if node.connector.emits_dead_letters:
        lowering.raw_sources[node.name] = df
        dead = F.count(F.col(DEAD_COLUMNS[1])).alias("dead_letters")
        df = df.observe(f"{DEAD_LETTER_METRIC_PREFIX}{node.name}", dead)
        df = df.filter(F.col(DEAD_COLUMNS[1]).isNull()).drop(*DEAD_COLUMNS)
    if not lowering.needs_control(node.name):
        df = df.filter(F.col(CONTROL_COLUMN).isNull()).drop(CONTROL_COLUMN)
    return df


@handles("table")
def lower_table(node: TableNode, lowering: Lowering) -> DataFrame:
    spark = lowering.spark
    if node.rows is not None:
        assert node.schema is not None
        names = [n for n, _ in node.schema]
        return spark.createDataFrame([tuple(r.get(n) for n in names) for r in node.rows], to_ddl(node.schema))
    reader = spark.read.format(node.format or "parquet")
    if node.schema is not None:
        reader = reader.schema(to_ddl(node.schema))
    if node.format == "csv":
        reader = reader.option("header", "true")
    return reader.load(node.path)


@handles("native")
def lower_native(node: NativeStep, lowering: Lowering) -> DataFrame:
    df = lowering.input(node)
    has_control = CONTROL_COLUMN in df.columns
    if node.mode == "filter":
        condition = to_column(node.exprs[0][1])
        return df.filter(condition | F.col(CONTROL_COLUMN).isNotNull() if has_control else condition)
    columns = {name: to_column(e).alias(name) for name, e in node.exprs}
    if node.mode == "with_columns":
        return df.withColumns(columns)
    selected = list(columns.values()) + ([F.col(CONTROL_COLUMN)] if has_control else [])
    return df.select(*selected)


@handles("python")
def lower_python(node: PythonStep, lowering: Lowering) -> DataFrame:
    chain = [lowering.plan.nodes[name] for name in lowering.chains[node.name]]
    df = lowering.input(chain[0])
    has_control = CONTROL_COLUMN in df.columns
    schema = to_arrow_schema(df.drop(CONTROL_COLUMN).schema if has_control else df.schema, timezone="UTC")
    specs = []
    for step in chain:
        assert isinstance(step, PythonStep)
        output = arrow_schema(step.output_schema) if step.output_schema and step.mode != "filter" else None
        specs.append(StepSpec(step.name, step.mode, step.fn, function_label(step.fn), step.batch_format, output))
        if output is not None:
            schema = output
        elif step.mode == "key":
            schema = schema.append(pa.field("key", pa.string()))
    stage = FusedStage(specs, schema, has_control)
    spark_schema = to_ddl(tuple((f.name, _spark_type(f.type)) for f in schema))
    if has_control:
        spark_schema += f", `{CONTROL_COLUMN}` long"
    out = df.mapInArrow(stage, spark_schema)
    if lowering.watermark_here(node):
        delay = lowering.watermark_delay(node.name)
        assert node.event_time is not None and delay is not None
        out = with_watermark(out, node.event_time, delay)
    return out


def _spark_type(arrow_type: Any) -> str:
    for name, candidate in {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(),
                            "float": pa.float32(), "boolean": pa.bool_(), "date": pa.date32(),
                            "binary": pa.binary()}.items():
        if arrow_type == candidate:
            return name
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    if pa.types.is_large_string(arrow_type):
        return "string"
    raise TypeError(f"unsupported Arrow type {arrow_type} in a Python step's output")


def with_watermark(df: DataFrame, field_name: str, delay_ms: int) -> DataFrame:
    """Declare the watermark on ``field_name``; control rows set their event time here."""
    current = F.col(f"`{field_name}`")
    if CONTROL_COLUMN in df.columns:
        # a clock control row (negative) must not move the watermark: it counts as time 0
        control_time = F.timestamp_millis(F.greatest(F.col(CONTROL_COLUMN), F.lit(0)) + F.lit(delay_ms))
        current = F.when(F.col(CONTROL_COLUMN).isNotNull(), control_time).otherwise(current)
        df = df.withColumn(field_name, current)
    return df.withWatermark(field_name, f"{delay_ms} milliseconds")


@handles("event_time")
def lower_event_time(node: EventTimeNode, lowering: Lowering) -> DataFrame:
    df = lowering.input(node)
    field_name = node.event_time
    assert field_name is not None
    if dict(df.dtypes)[field_name] != "timestamp":
        df = df.withColumn(field_name, F.timestamp_millis(F.col(f"`{field_name}`").cast("long")))
    return with_watermark(df, field_name, node.delay_ms) if lowering.watermark_here(node) else df


@handles("key_by")
def lower_key_by(node: Node, lowering: Lowering) -> DataFrame:
    return lowering.input(node)


AGGREGATES: dict[str, Callable[[str | None], Column]] = {
    "count": lambda c: F.count(F.lit(1)),
    "sum": lambda c: F.sum(F.col(f"`{c}`")),
    "min": lambda c: F.min(F.col(f"`{c}`")),
    "max": lambda c: F.max(F.col(f"`{c}`")),
    "mean": lambda c: F.avg(F.col(f"`{c}`")),
}


def _aggregates(aggs: tuple[tuple[str, Agg], ...]) -> list[Column]:
    return [AGGREGATES[agg.func](agg.column).alias(name) for name, agg in aggs]


@handles("rolling_aggregate")
def lower_rolling(node: RollingAggregateNode, lowering: Lowering) -> DataFrame:
    df = without_control(lowering.input(node))
    keys = [F.col(f"`{k}`") for k in node.keys or ()]
    if node.reduce_fn is not None:
        return reduce_per_key(df, node)
    return df.groupBy(*keys).agg(*_aggregates(node.aggs))


@handles("window_aggregate")
def lower_window(node: WindowAggregateNode, lowering: Lowering) -> DataFrame:
    if window_needs_processor(lowering.plan, node):
        raw = lower_window_processor(node, lowering.input(node), lowering.plan)
        late = F.count(F.when(F.col(OUTPUT_KIND) == "late", 1)).alias("late_dropped")
        raw = raw.observe(f"{LATE_METRIC_PREFIX}{node.name}", late)
        lowering.raw_windows[node.name] = raw
        return window_panes(raw, node.schema)
    df = without_control(lowering.input(node))
    shape = node.window.to_json()
    event_time = F.col(f"`{node.event_time or lowering.plan.nodes[node.inputs[0]].event_time}`")
    if shape["kind"] == "session":
        window = F.session_window(event_time, f"{shape['gap_ms']} milliseconds")
    else:
        slide = shape.get("slide_ms", shape["size_ms"])
        window = F.window(event_time, f"{shape['size_ms']} milliseconds", f"{slide} milliseconds",
                          f"{shape['offset_ms']} milliseconds")
    keys = list(node.keys or ())
    grouped = df.groupBy(*[F.col(f"`{k}`") for k in keys], window.alias("_hr_window")).agg(*_aggregates(node.aggs))
    return grouped.select(*[F.col(f"`{k}`") for k in keys],
                          F.col("_hr_window.start").alias("window_start"),
                          F.col("_hr_window.end").alias("window_end"),
                          *[F.col(f"`{name}`") for name, _ in node.aggs])


@handles("keyed_process")
def lower_process(node: KeyedProcessNode, lowering: Lowering) -> DataFrame:
    return lower_keyed_process(node, lowering.input(node), lowering.plan)


@handles("late_records")
def lower_late_records(node: LateRecordsNode, lowering: Lowering) -> DataFrame:
    lowering.frame(node.inputs[0])
    return window_late_records(lowering.raw_windows[node.inputs[0]])


@handles("join")
def lower_join(node: JoinNode, lowering: Lowering) -> DataFrame:
    df = lowering.input(node)
    table = lowering.input(node, 1)
    on = list(node.on)
    if CONTROL_COLUMN not in df.columns:
        return df.join(F.broadcast(table), on=on, how=node.how)
    # Control rows must survive the join: a left join keeps them, then unmatched data rows go.
    marked = table.withColumn("_hr_matched", F.lit(True))
    joined = df.join(F.broadcast(marked), on=on, how="left")
    if node.how == "inner":
        joined = joined.filter(F.col("_hr_matched").isNotNull() | F.col(CONTROL_COLUMN).isNotNull())
    return joined.drop("_hr_matched")


@handles("union")
def lower_union(node: UnionNode, lowering: Lowering) -> DataFrame:
    frames = [lowering.input(node, index) for index in range(len(node.inputs))]
    result = frames[0]
    for other in frames[1:]:
        result = result.unionByName(other, allowMissingColumns=True)
    return result


@handles("dead_letters")
def lower_dead_letters(node: DeadLettersNode, lowering: Lowering) -> DataFrame:
    parts = []
    for source in node.inputs:
        lowering.frame(source)
        raw = lowering.raw_sources[source]
        parts.append(raw.filter(F.col(DEAD_COLUMNS[1]).isNotNull()).select(
            F.lit(source).alias("source"), F.col(DEAD_COLUMNS[2]).alias("position"),
            F.col(DEAD_COLUMNS[0]).alias("raw"), F.col(DEAD_COLUMNS[1]).alias("error")))
    result = parts[0]
    for other in parts[1:]:
        result = result.unionByName(other)
    return result


@handles("sink")
def lower_sink(node: SinkNode, lowering: Lowering) -> DataFrame:
    return without_control(lowering.input(node))
