"""Lowering an SQL step: its query run by ``spark.sql`` over temp views of its inputs.

Each input's DataFrame comes through ``lowering.input`` (so the watermark is declared on the
way in where it belongs) and loses headrace's control rows after that: they have moved the
watermark, and an aggregate must not count them. The inputs are registered as temp views
under names of their own per pipeline, step and input, the query is rewritten to read them
(``headrace/plan/sql_query.py``), and the views are dropped once Spark has analysed it.

A window join (``window(a.t, '10 seconds') = window(b.t, '10 seconds')``) joins on a window column
each joined stream's view gets, which carries the watermark while the event time loses it, as
the fluent window join does (``headrace/spark/join_lowering.py``); the query reads that column
for each call of the join's window over a joined stream.

A column holding Spark's window struct (``window(...)``, ``session_window(...)``) is flattened:
``window`` and ``session_window`` become ``window_start`` and ``window_end``, the columns of
headrace's own windows; another struct of a window's start and end, ``w``, becomes ``w_start``
and ``w_end``.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.errors import AnalysisException
from pyspark.logger import PySparkLogger
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType, TimestampType

from headrace.contract import CONTROL_COLUMN
from headrace.errors import PlanError
from headrace.plan.graph import Plan
from headrace.plan.nodes import DISTINCT, JOINED, SQL_OUTPUT_MODES, SqlNode
from headrace.plan.sql_joins import JoinWindow
from headrace.plan.sql_query import (
    Position,
    Rewritten,
    cross_joins_as_inner,
    exact_distinct_counts,
    query_error,
    restore_names,
    rewrite,
    top_n_as_aggregate_query,
    window_joins_as_columns,
    without_distinct,
)
from headrace.spark.join_lowering import judged_by_window
from headrace.spark.stateless import without_control, without_result_time
from headrace.spark.watermarks import DELAY_KEY

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation



def view_name(pipeline: str, step: str, source: str) -> str:
    """A temp view name of its own for input ``source`` of step ``step`` in ``pipeline``."""
    readable = re.sub(r"\W", "_", f"{pipeline}__{step}__{source}")[:80]
    digest = hashlib.sha1(f"{pipeline}\0{step}\0{source}".encode()).hexdigest()[:8]
    return f"_hr_sql_{readable}_{digest}"


def sql_lowered_as(plan: Plan, node: SqlNode) -> str:
    views = ", ".join(dict(node.reads).values())
    how = {"stateless": "projections, filters and joins with tables, per micro-batch",
           "windowed aggregate": "native window aggregate, append mode (a window is emitted once the watermark "
                                 "passes its end)",
           "aggregate": "native streaming aggregate, update mode (each micro-batch emits the groups it changed)",
           "distinct": "the query without DISTINCT, then Spark's streaming dropDuplicates, append mode (each "
                       "distinct row is emitted once)",
           "join of streams": "Spark's stream-stream join (both sides kept in the state store until the "
                              "watermark passes their bound), append mode",
           "windows of windows": "native window aggregates, one after another (a later window takes each result "
                                 "at its window's end - 1 µs), append mode"}
    return f"Spark SQL over temp views of {views}: {how[node.shape]}"


def register_functions(plan: Plan, spark: SparkSession) -> None:
    """The pipeline's Python functions for its SQL queries (``p.udf``), by their names, once as the
    query is compiled: the session of each micro-batch starts from a copy of this one."""
    for function in plan.functions.values():
        spark.udf.register(function.name, F.udf(function.fn, function.returns, useArrow=True))


def lower_sql(node: SqlNode, lowering: Compilation) -> DataFrame:
    spark = lowering.spark
    query = exact_distinct_counts(without_distinct(node.query) if node.shape == DISTINCT else node.query)
    windows: dict[str, JoinWindow] = {}  # input step -> the window of its window join
    if node.shape == JOINED:
        query, windows = _window_joins(node, query, lowering.plan)
        query = cross_joins_as_inner(query)
    views: dict[str, str] = {}  # input step -> its view
    inputs: list[DataFrame] = []
    control: DataFrame | None = None
    for index, name in enumerate(node.inputs):
        df = without_result_time(lowering.input(node, index))  # a query does not carry it
        if CONTROL_COLUMN in df.columns:
            control = df.filter(F.col(CONTROL_COLUMN).isNotNull()).select(CONTROL_COLUMN)
            df = without_control(df)
        if name in windows:
            time = lowering.plan.nodes[name].event_time
            assert time is not None  # a joined stream has event time (sql_query.sql_node)
            df = judged_by_window(df, time, windows[name].column, windows[name].size_ms, windows[name].offset_ms)
        views[name] = view_name(lowering.plan.name, node.name, name)
        df.createOrReplaceTempView(views[name])
        inputs.append(df)
    in_query = {query_name: views[step] for query_name, step in node.reads}  # name in the query -> view
    query = top_n_as_aggregate_query(query, _column_types(inputs))
    rewritten = rewrite(query, in_query)
    try:
        with _quiet_query_errors():
            result = spark.sql(rewritten.text)
            if node.shape == DISTINCT:
                result = result.dropDuplicates()
            if result.isStreaming:
                _check_streaming(node, result)
    except AnalysisException as exc:
        raise _refused(node, rewritten, in_query, exc) from None
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)
    if windows:  # a stream's window column, read by SELECT * or t.*
        result = result.drop(*{w.column for w in windows.values()})
    result = _flatten_windows(node, result)
    if node.shape == JOINED and node.event_time is not None:
        result = _one_event_time(result, node.event_time)
    if control is not None and node.shape == "stateless" and lowering.control_needed_after(node.name):
        # a watermark is declared further on (or the test clock runs): control rows go on
        result = result.withColumn(CONTROL_COLUMN, F.lit(None).cast("long")).unionByName(
            control, allowMissingColumns=True)
    return result


def _window_joins(node: SqlNode, query: str, plan: Plan) -> tuple[str, dict[str, JoinWindow]]:
    """``query`` joining its window joins' streams on their window columns, and the window each
    input step's view needs as a column (see ``headrace/spark/join_lowering.py``)."""
    times = {name: plan.nodes[step].event_time for name, step in node.reads}
    rewritten, windows = window_joins_as_columns(query, {n: t for n, t in times.items() if t is not None})
    return rewritten, {dict(node.reads)[name]: window for name, window in windows.items()}


def _one_event_time(df: DataFrame, event_time: str) -> DataFrame:
    """The results with their event time the only column Spark knows a watermark of: a later
    stateful step judges its input's lateness by the first such column (a join's results carry
    both sides' times; the other side's would make on-time results late)."""
    def marked(field: StructField) -> bool:
        return field.name != event_time and DELAY_KEY in field.metadata

    if not any(marked(f) for f in df.schema.fields):
        return df
    return df.select(*[F.col(f"`{f.name}`").alias(f.name, metadata={}) if marked(f) else F.col(f"`{f.name}`")
                       for f in df.schema.fields])


def _column_types(inputs: list[DataFrame]) -> dict[str, str]:
    """The Spark type of each input column, by name; a name two inputs give two types has none."""
    types: dict[str, str] = {}
    ambiguous = set()
    for df in inputs:
        for name, kind in df.dtypes:
            if types.setdefault(name, kind) != kind:
                ambiguous.add(name)
    return {name: kind for name, kind in types.items() if name not in ambiguous}


@contextlib.contextmanager
def _quiet_query_errors() -> Iterator[None]:
    """PySpark logs each error in an SQL query with the JVM's stack to stderr; the step's plan
    error says it in one message instead."""
    logger = PySparkLogger.getLogger("SQLQueryContextLogger")
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


def _check_streaming(node: SqlNode, result: DataFrame) -> None:
    """Spark's own check of what a streaming query may do (the one it runs when a query
    starts), run on this step's query now, so that a refusal names the step."""
    spark = result.sparkSession
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:  # Spark Connect: the check runs when the query starts
        return
    mode = getattr(jvm.org.apache.spark.sql.streaming.OutputMode, (SQL_OUTPUT_MODES[node.shape] or "append").title())
    jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker.checkForStreaming(
        result._jdf.queryExecution().analyzed(), mode())


def _refused(node: SqlNode, rewritten: Rewritten, views: dict[str, str], exc: AnalysisException) -> PlanError:
    """Spark's refusal of the query as a plan error on the step, pointing at the user's query."""
    text = exc.getMessage() or getattr(exc, "_desc", None) or str(exc)
    # Spark's own rendering of the query or its plan, and the JVM's stack, are left out
    text = re.split(r"\n\s*(?:== SQL|JVM stacktrace:)|;\s*(?:line \d+ pos \d+;)?\s*\n", text.strip(), maxsplit=1)[0]
    span = _spark_span(exc, rewritten.text)
    position = None
    if span is not None:
        first, last = rewritten.original_offset(span[0]), rewritten.original_offset(span[1])
        position = Position.at(node.query, first, last - first + 1)
        text = re.sub(r"\s*\(line \d+, pos \d+\)", "", text)
    message = " ".join(restore_names(text, views).split())
    return query_error(node.name, node.defined_at, node.query, f"Spark refused the query: {message}", position)


def _spark_span(exc: AnalysisException, text: str) -> tuple[int, int] | None:
    """Where in ``text`` Spark placed its error: its SQL query context (analysis errors), or the
    line and position in the message of a parse error."""
    for context in exc.getQueryContext() or []:
        try:
            start, stop = int(context.startIndex()), int(context.stopIndex())
        except Exception:  # noqa: BLE001 - a context with no place in the text (a DataFrame call)
            continue
        if 0 <= start <= stop < len(text):
            return start, stop
    found = re.search(r"\(line (\d+), pos (\d+)\)", getattr(exc, "_desc", None) or str(exc))
    if found is None:
        return None
    lines = text.split("\n")
    line, pos = int(found.group(1)), int(found.group(2))
    if not 1 <= line <= len(lines):
        return None
    offset = sum(len(earlier) + 1 for earlier in lines[:line - 1]) + min(pos, len(lines[line - 1]))
    word = re.match(r"\w+|\S", text[offset:])
    return offset, offset + (len(word.group(0)) - 1 if word else 0)


def _is_window_struct(data_type: object) -> bool:
    return (isinstance(data_type, StructType) and [f.name for f in data_type.fields] == ["start", "end"]
            and all(isinstance(f.dataType, TimestampType) for f in data_type.fields))


def _flatten_windows(node: SqlNode, df: DataFrame) -> DataFrame:
    """Each window struct column as two columns, its start and its end (see the module's docstring)."""
    if not any(_is_window_struct(f.dataType) for f in df.schema.fields):
        return df
    columns, names = [], []
    for field in df.schema.fields:
        if not _is_window_struct(field.dataType):
            columns.append(F.col(f"`{field.name}`"))
            names.append(field.name)
            continue
        prefix = "window" if field.name in ("window", "session_window") else field.name
        for part in ("start", "end"):
            columns.append(F.col(f"`{field.name}`.{part}").alias(f"{prefix}_{part}"))
            names.append(f"{prefix}_{part}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise query_error(node.name, node.defined_at, node.query,
                          f"the query's output would have two columns named {twice[0]!r}: a window column "
                          f"becomes <name>_start and <name>_end (window and session_window become window_start "
                          "and window_end); rename one of them")
    return df.select(*columns)
