"""Lowering the stateless node kinds to Spark: sources, tables, column expressions, fused
Python stages, the event-time declaration, joins, unions, dead letters and sinks.

Each ``lower_*`` takes a node and the compilation (``headrace/spark/compiler.py``) and returns
the node's DataFrame; ``headrace/spark/specs.py`` registers them. Control rows (``_hr_ctl``,
see ``headrace/contract.py``) carry watermark moves and the end-of-input flush through
these steps until the operator that needs them.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from headrace.code_locations import function_label
from headrace.connectors.base import count_dead_letters, record_count
from headrace.contract import (
    CONTROL_COLUMN,
    CONTROL_METRIC_PREFIX,
    DEAD_COLUMNS,
    REPEAT_METRIC_PREFIX,
    STEP_METRIC_PREFIX,
    SourceContext,
)
from headrace.plan.nodes import (
    RESULT_TIME,
    DeadLettersNode,
    EnrichNode,
    EventTimeNode,
    JoinNode,
    NativeStep,
    Node,
    PythonStep,
    SinkNode,
    SourceNode,
    TableNode,
    UnionNode,
)
from headrace.schema import arrow_schema, to_ddl, type_name_of_arrow
from headrace.sink_step import SinkStep
from headrace.spark.enrich_lowering import enrich_failures
from headrace.spark.expressions import to_column
from headrace.spark.fused import FusedStage, StepSpec

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation


def is_data() -> Column:
    """True on data rows, in a form Catalyst cannot push below the watermark operator
    (``spark_partition_id`` is non-deterministic), so the watermark still sees control rows."""
    return F.col(CONTROL_COLUMN).isNull() | (F.spark_partition_id() < 0)


def without_control(df: DataFrame) -> DataFrame:
    if CONTROL_COLUMN not in df.columns:
        return df
    return df.filter(is_data()).drop(CONTROL_COLUMN)


def without_result_time(df: DataFrame) -> DataFrame:
    """``df`` without the hidden event time of stateful results (``headrace/spark/stages.py``)."""
    return df.drop(RESULT_TIME) if RESULT_TIME in df.columns else df


def lower_source(node: SourceNode, lowering: Compilation) -> DataFrame:
    """The source's good rows. A source with dead letters also leaves its raw rows (what the
    dead letters read) and its observed raw stream (where a query can stop, to split the
    good rows from the dead letters in each micro-batch) in the compilation."""
    count_records = len(lowering.plan.sources()) > 1  # one source's records are the query's input rows
    by_good_rows = lowering.dead_letters_by_good_rows(node)
    # nothing reads its dead letters but their count: read strictly until a bad record comes
    strict = by_good_rows and node.connector.reads_strictly and node.name not in lowering.lenient_sources
    context = SourceContext(lowering.run_dir, node.name, lowering.query_checkpoint, lowering.needs_control(node.name),
                            lowering.fields_read.get(node.name), lowering.probe_fields, count_records, by_good_rows,
                            strict)
    os.makedirs(lowering.run_dir, exist_ok=True)
    node.connector.prepare(context)
    raw = node.connector.read_stream(lowering.spark, context)
    repeats = lowering.scans.get(node.name, 1) - 1
    if repeats > 0:  # Spark counts the rows of each scan; progress takes the repeats off
        raw = raw.observe(f"{REPEAT_METRIC_PREFIX}{node.name}", (F.count(F.lit(1)) * repeats).alias("repeated_rows"))
    df = raw
    # A source's records, with several sources, go in the observed metric it has anyway (its dead
    # letters', else its control rows'), or else in one of their own (headrace/spark/step_counts.py).
    control = F.col(CONTROL_COLUMN) if CONTROL_COLUMN in raw.columns else None
    records_here = count_records and not node.connector.emits_dead_letters
    if node.connector.other_control_rows:  # see headrace.connectors.base: progress takes control rows off
        df = raw.observe(f"{CONTROL_METRIC_PREFIX}{node.name}", F.count(F.col(CONTROL_COLUMN)).alias("control_rows"),
                         *([record_count(control)] if records_here else []))
    elif records_here:
        df = raw.observe(f"{STEP_METRIC_PREFIX}{node.name}", record_count(control))
    if strict:  # no dead letters, and its good rows are all its rows
        lowering.strict_sources.add(node.name)
        return optimized_once(good_rows(node, df, lowering, dead_letters=False))
    if node.connector.emits_dead_letters:
        lowering.raw_sources[node.name] = raw
        if not node.connector.counts_dead_letters and not by_good_rows:  # (one that does counted its records too)
            df = count_dead_letters(df, node.name, F.col(DEAD_COLUMNS[1]).isNotNull(),
                                    records=record_count(control) if count_records else None)
        lowering.observed_sources[node.name] = df
    good = good_rows(node, df, lowering)
    if not by_good_rows:
        return good
    return lowering.mark_good_rows(good if lowering.probe_fields else optimized_once(good), node.name)


def good_rows(node: SourceNode, df: DataFrame, lowering: Compilation, dead_letters: bool = True) -> DataFrame:
    """The rows of a source's (observed) output that go on: not dead letters (when it has them),
    and no control rows unless an event-time step needs them."""
    if dead_letters and node.connector.emits_dead_letters:
        df = df.filter(F.col(DEAD_COLUMNS[1]).isNull()).drop(*DEAD_COLUMNS)
    if not lowering.needs_control(node.name):
        df = df.filter(F.col(CONTROL_COLUMN).isNull()).drop(CONTROL_COLUMN)
    return df


_CLOCK = re.compile(r"\b(current_timestamp|current_date|current_time|now|localtimestamp)\(", re.IGNORECASE)


def optimized_once(df: DataFrame) -> DataFrame:
    """``df`` as Spark's optimizer leaves it, for a source's good rows that nothing else in the
    query reads (``dead_letters_by_good_rows``). Spark optimizes a streaming query's whole plan
    again for each micro-batch; handed the good rows' optimized plan, it no longer simplifies away
    the dead-letter columns and tests every time (NEXMark's q2, Spark's optimizer alone on the
    query's plan: 17 ms; 8.5 ms with the good rows optimized once; 4 ms for the query by hand). Not
    for rows that read the clock: the optimizer fixes ``current_timestamp()`` to when it runs."""
    spark: Any = df.sparkSession
    session = spark._jsparkSession
    analyzed = df._jdf.queryExecution().analyzed()
    if _CLOCK.search(analyzed.toString()):
        return df
    optimized = session.sessionState().optimizer().execute(analyzed)
    return DataFrame(spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(session, optimized), spark)


def lower_table(node: TableNode, lowering: Compilation) -> DataFrame:
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


def lower_native(node: NativeStep, lowering: Compilation) -> DataFrame:
    df = lowering.input(node)
    has_control = CONTROL_COLUMN in df.columns
    if node.mode == "filter":
        condition = to_column(node.exprs[0][1])
        return df.filter(condition | F.col(CONTROL_COLUMN).isNotNull() if has_control else condition)
    columns = {name: to_column(e).alias(name) for name, e in node.exprs}
    if node.mode == "with_columns":
        return df.withColumns(columns)
    carried = [c for c in (CONTROL_COLUMN, RESULT_TIME) if c in df.columns]  # they go along unseen
    return df.select(*columns.values(), *[F.col(c) for c in carried])


def lower_python(node: PythonStep, lowering: Compilation) -> DataFrame:
    chain = [lowering.plan.nodes[name] for name in lowering.chains[node.name]]
    df = without_result_time(lowering.input(chain[0]))
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
    spark_schema = to_ddl(tuple((f.name, type_name_of_arrow(f.type, where="a Python step's output")) for f in schema))
    if has_control:
        spark_schema += f", `{CONTROL_COLUMN}` long"
    out = df.mapInArrow(stage, spark_schema)
    if lowering.watermark_here(node):
        delay = lowering.watermark_delay(node.name)
        assert node.event_time is not None and delay is not None
        after = [c.name for c in lowering.plan.consumers(node.name)]
        out = with_watermark(out, node.event_time, delay, barrier=lowering.filters_before_window(after))
    return out


def with_watermark(df: DataFrame, field_name: str, delay_ms: int, *, barrier: bool = False) -> DataFrame:
    """Declare the watermark on ``field_name``; control rows set their event time here.

    With ``barrier``, a filter no later step's filter can be pushed through sits right above
    the watermark: Catalyst pushes a deterministic filter below Spark's watermark operator, so
    the records it removes would no longer move the watermark (a far-future record sent to
    close the last window, filtered out after the declaration, would close nothing). The
    barrier's predicate is non-deterministic (``spark_partition_id``), which Catalyst neither
    pushes down nor merges with the filter above it; it keeps every row and stays in the
    generated code."""
    current = F.col(f"`{field_name}`")
    if CONTROL_COLUMN in df.columns:
        # a clock control row (negative) must not move the watermark: it counts as time 0
        control_time = F.timestamp_millis(F.greatest(F.col(CONTROL_COLUMN), F.lit(0)) + F.lit(delay_ms))
        current = F.when(F.col(CONTROL_COLUMN).isNotNull(), control_time).otherwise(current)
        df = df.withColumn(field_name, current)
    df = df.withWatermark(field_name, f"{delay_ms} milliseconds")
    return df.filter(F.spark_partition_id() >= 0) if barrier else df


def lower_event_time(node: EventTimeNode, lowering: Compilation) -> DataFrame:
    df = lowering.input(node)
    field_name = node.event_time
    assert field_name is not None
    if dict(df.dtypes)[field_name] != "timestamp":
        df = df.withColumn(field_name, F.timestamp_millis(F.col(f"`{field_name}`").cast("long")))
    if not lowering.watermark_here(node):
        return df
    after = [c.name for c in lowering.plan.consumers(node.name)]
    return with_watermark(df, field_name, node.delay_ms, barrier=lowering.filters_before_window(after))


def lower_key_by(node: Node, lowering: Compilation) -> DataFrame:
    return lowering.input(node)


def lower_join(node: JoinNode, lowering: Compilation) -> DataFrame:
    df = lowering.input(node)
    table = lowering.input(node, 1)
    on = list(node.on)
    if CONTROL_COLUMN in df.columns and not lowering.control_needed_after(node.name):
        df = without_control(df)  # the watermark is above: an inner join need not keep them
    if CONTROL_COLUMN not in df.columns:
        return df.join(F.broadcast(table), on=on, how=node.how)
    # Control rows must survive the join: a left join keeps them, then unmatched data rows go.
    marked = table.withColumn("_hr_matched", F.lit(True))
    joined = df.join(F.broadcast(marked), on=on, how="left")
    if node.how == "inner":
        joined = joined.filter(F.col("_hr_matched").isNotNull() | F.col(CONTROL_COLUMN).isNotNull())
    return joined.drop("_hr_matched")


def lower_union(node: UnionNode, lowering: Compilation) -> DataFrame:
    frames = [lowering.input(node, index) for index in range(len(node.inputs))]
    result = frames[0]
    for other in frames[1:]:
        result = result.unionByName(other, allowMissingColumns=True)
    return result


def lower_dead_letters(node: DeadLettersNode, lowering: Compilation) -> DataFrame:
    parts = []
    for source in node.inputs:
        step = lowering.plan.nodes[source]
        if isinstance(step, EnrichNode):  # records whose calls all failed (in each micro-batch)
            parts.append(enrich_failures(step, lowering))
            continue
        lowering.frame(source)
        raw = lowering.raw_sources[source]
        parts.append(raw.filter(F.col(DEAD_COLUMNS[1]).isNotNull()).select(
            F.lit(source).alias("source"), F.col(DEAD_COLUMNS[2]).alias("position"),
            F.col(DEAD_COLUMNS[0]).alias("raw"), F.col(DEAD_COLUMNS[1]).alias("error")))
    result = parts[0]
    for other in parts[1:]:
        result = result.unionByName(other)
    return result


def lower_sink(node: SinkNode, lowering: Compilation) -> DataFrame:
    df = without_result_time(without_control(lowering.input(node)))
    if lowering.batch_id is None:  # compiling the query, before it starts (not inside a micro-batch)
        node.connector.check_schema(df.schema, SinkStep(node.name, node.defined_at))
    return df
