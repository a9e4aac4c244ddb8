"""The fluent API: Pipeline, Stream, KeyedStream, WindowedStream, Table.

Each call adds one validated node to the pipeline's plan; nothing touches Spark
until the pipeline runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from headrace.aggregates import FUNCTIONS, Agg, AggregateFunction, result_type
from headrace.api.operator_dag import add_operator, add_stream
from headrace.api.stream_dedupe import dedupe_node, keep_last
from headrace.api.stream_enrich import enrich_node
from headrace.api.stream_joins import stream_join
from headrace.api.view_keys import view_keys
from headrace.code_locations import function_label, remember_definitions, user_location
from headrace.contract import Guarantee, SinkConnector, SourceConnector
from headrace.durations import to_millis
from headrace.environment.admission import BatchDuration
from headrace.errors import PlanError, step_error
from headrace.expr import Expr, col, lit
from headrace.plan.graph import Plan
from headrace.plan.nodes import (
    JOIN_LATE_SCHEMA,
    RESULT_TIME,
    WINDOW_LATE_SCHEMA,
    DeadLettersNode,
    EnrichNode,
    EventTimeNode,
    JoinNode,
    KeyByNode,
    KeyedProcessNode,
    LateRecordsNode,
    NativeStep,
    Node,
    PythonStep,
    RollingAggregateNode,
    ScoreNode,
    SinkNode,
    SourceNode,
    SqlFunction,
    TableNode,
    UnionNode,
    WindowAggregateNode,
)
from headrace.process import KeyedProcessFunction, check_process_function
from headrace.schema import COLUMN_TYPES, PYTHON_TYPES, TYPE_ALIASES, UNKNOWN, Schema, is_record_class, schema_of
from headrace.spark.plan_checks import check_plan
from headrace.spark.real_time import MICRO_BATCH, check_trigger
from headrace.spark.specs import check_sink_takes_updates, updating_step
from headrace.spark.stages import check_stage, why_no_event_time
from headrace.triggers import AfterWatermark, Emission, Trigger
from headrace.windows import Count, Global, WindowShape

NUMERIC_TYPES = ("int", "long", "float", "double")
DEAD_LETTER_SCHEMA: Schema = (("source", "string"), ("position", "string"), ("raw", "string"), ("error", "string"))


class Pipeline:
    """A named streaming application: sources, steps and sinks, run as one Spark query.

    ``guarantee="exactly-once"`` makes building fail if a connector cannot give it.
    ``trigger="real-time"`` runs it in Spark's real-time mode (Kafka in, native steps, Kafka
    out: see ``explain()`` and docs/runtime.md); the default is ``"micro-batch"``.
    ``batch_duration="2s"`` sizes the micro-batches of headrace's Python sources to take about
    that long (adaptive admission control, ``headrace/environment/admission.py``).
    """

    def __init__(self, name: str, *, guarantee: str | None = None, trigger: str = MICRO_BATCH,
                 batch_duration: Any = None) -> None:
        if not name or not name.replace("-", "_").isidentifier():
            raise PlanError(f"pipeline name {name!r} must be a non-empty identifier (letters, digits, _ and -)")
        wanted = None
        if guarantee is not None:
            try:
                wanted = Guarantee(guarantee)
            except ValueError:
                options = ", ".join(g.value for g in Guarantee)
                raise PlanError(f"pipeline {name!r}: unknown guarantee {guarantee!r}; use one of {options}") from None
        self.plan = Plan(name, wanted, check_trigger(name, trigger))
        self.plan.batch_duration = BatchDuration.of(batch_duration, f"pipeline {name!r}")
        if self.plan.batch_duration is not None and self.plan.trigger != MICRO_BATCH:
            raise PlanError(f"pipeline {name!r}: batch_duration sizes micro-batches; a {trigger} pipeline has none")
        self._counters: dict[str, int] = {}

    @property
    def name(self) -> str:
        return self.plan.name

    # -- building -------------------------------------------------------------------------
    def _checked_name(self, given: str | None, kind: str) -> str | None:
        """``given`` (a step name, or None for a generated one), refused when it is no string."""
        return None if given is None else self._name(given, kind)

    def _name(self, given: str | None, kind: str) -> str:
        if given is not None:
            if isinstance(given, (Expr, Agg)):
                what, where = ("a column expression", "select(...) or with_columns(...), e.g. with_columns("
                               "name=hr.col('x'))") if isinstance(given, Expr) else (
                               "an aggregate", "aggregate(...), e.g. aggregate(name=hr.count())")
                raise PlanError(f"{kind} ({user_location()}): name= is the step's name and must be a string, got "
                                f"{what} {given!r}; a column called 'name' is added by {where}")
            if not given or not isinstance(given, str):
                raise PlanError(f"step name {given!r} must be a non-empty string")
            return given
        while True:
            self._counters[kind] = self._counters.get(kind, 0) + 1
            candidate = kind if self._counters[kind] == 1 else f"{kind}_{self._counters[kind]}"
            if candidate not in self.plan.nodes:
                return candidate

    def source(self, name: str, connector: SourceConnector, *, event_time: str | None = None,
               max_out_of_orderness: object = 0) -> Stream:
        """Read ``connector``. With ``event_time``, also declare the event-time field."""
        if not isinstance(connector, SourceConnector):
            raise PlanError(f"source {name!r} ({user_location()}): expected a headrace source connector, "
                            f"got {type(connector).__name__}")
        node = self.plan.add(SourceNode(name, (), user_location(), connector.schema(), connector=connector))
        stream = Stream(self, node)
        if event_time is not None:
            stream = stream.with_event_time(event_time, max_out_of_orderness, name=f"{name}_event_time")
        return stream

    def table(self, name: str, rows: Iterable[dict[str, Any]] | None = None, *, schema: Any = None,
              path: str | None = None, format: str | None = None) -> Table:
        """A static table to join streams with: ``rows`` given here, or a file read when the pipeline starts."""
        where = user_location()
        if (rows is None) == (path is None):
            raise PlanError(f"table {name!r} ({where}): give either rows=[...] or path=... (and format=)")
        if path is not None and format not in ("parquet", "json", "csv"):
            raise PlanError(f"table {name!r} ({where}): format must be parquet, json or csv, got {format!r}")
        row_tuple = tuple(dict(r) for r in rows) if rows is not None else None
        if schema is not None:
            table_schema: Schema | None = schema_of(schema, f"table {name!r}")
        elif row_tuple:
            table_schema = tuple((k, _python_type(v)) for k, v in row_tuple[0].items())
        else:
            table_schema = None
        if row_tuple is not None and table_schema is None:
            raise PlanError(f"table {name!r} ({where}): an empty table needs schema=")
        node = TableNode(name, (), where, table_schema, rows=row_tuple, path=path, format=format)
        self.plan.add(node)
        return Table(self, node)

    def dead_letters(self, *sources: Stream, name: str = "dead_letters") -> Stream:
        """The records these sources (all that can produce them, by default) could not parse, or
        those whose calls all failed in these enrich steps (``stream.enrich``)."""
        where = user_location()
        if sources and all(isinstance(s.node, EnrichNode) for s in sources):
            return Stream(self, self.plan.add(DeadLettersNode(name, tuple(s.node.name for s in sources), where,
                                                              DEAD_LETTER_SCHEMA)))
        if sources:
            nodes = [s.node for s in sources]
            for node in nodes:
                if isinstance(node, EnrichNode):
                    raise PlanError(f"dead_letters ({where}): the dead letters of enrich step {node.name!r} and "
                                    "those of sources go to sinks of their own: p.dead_letters(<the enrich "
                                    "steps' streams>) and p.dead_letters(<the sources>)")
                if not isinstance(node, SourceNode):
                    raise PlanError(f"dead_letters ({where}): {node.name!r} is neither a source nor an enrich step")
        else:
            nodes = [n for n in self.plan.sources() if n.connector.emits_dead_letters]
        bad = [n.name for n in nodes if not isinstance(n, SourceNode) or not n.connector.emits_dead_letters]
        if bad or not nodes:
            raise PlanError(f"dead_letters ({where}): {', '.join(bad) or 'no source'} cannot produce dead letters "
                            "(file sources reading jsonl or csv, and Kafka sources reading json, can)")
        return Stream(self, self.plan.add(DeadLettersNode(name, tuple(n.name for n in nodes), where,
                                                          DEAD_LETTER_SCHEMA)))

    # -- operators (headrace/api/operator_dag.py) ------------------------------------------------------
    def stream_of(self, node: Node) -> Stream:
        """The fluent stream of ``node``, a step already in the plan (an operator's output port)."""
        return Stream(self, node)

    def add_operator(self, name: str, operator: Any, *, partitions: int = 1, application_window: int = 1) -> Any:
        """Add an Apex-style operator with ``partitions`` instances; returns its ports as attributes."""
        return add_operator(self, name, operator, partitions=partitions, application_window=application_window)

    def add_stream(self, name: str, source: Any, *sinks: Any, grouping: Any = None,
                   locality: str | None = None) -> None:
        """Connect an output port (or a stream) to input ports, routed by ``grouping`` (default
        shuffle); ``locality="thread_local"`` fuses the receivers into the sender's Python stage."""
        add_stream(self, name, source.node if isinstance(source, Stream) else source, *sinks, grouping=grouping,
                   locality=locality)

    def sql(self, query: str, *, name: str | None = None) -> Stream:
        """A stream computed by a Spark SQL query over the pipeline's streams and tables, named in
        FROM and JOIN by their step names: projections and filters, joins with tables, GROUP BY
        aggregates, and windows with ``window(ts, '1 minute')`` or ``session_window(ts, '5
        minutes')`` on the stream's event time (see docs/sql.md)."""
        from headrace.plan.sql_query import STATELESS, sql_node

        step = self._name(name, "sql")
        where = user_location()
        node = sql_node(self.plan, step, where, query)
        if node.shape != STATELESS:
            check_stage(self.plan, node)
        return Stream(self, self.plan.add(node))

    def udf(self, name: str, fn: Callable[..., Any], *, returns: str = "string") -> None:
        """Register ``fn`` for this pipeline's SQL queries as ``name(...)``, returning a value of
        the column type ``returns``; Spark calls it on Arrow batches of rows (see docs/sql.md)."""
        where = user_location()
        what = f"udf {name!r} ({where})"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise PlanError(f"udf ({where}): the name must be an SQL identifier (letters, digits, _), got {name!r}")
        if name in self.plan.functions:
            raise PlanError(f"{what}: a function of that name is registered already, at "
                            f"{self.plan.functions[name].defined_at}")
        if not callable(fn) or isinstance(fn, type):
            raise PlanError(f"{what}: expected a function, got {type(fn).__name__}")
        kind = TYPE_ALIASES.get(returns) if isinstance(returns, str) else None
        if kind is None:
            raise PlanError(f"{what}: returns={returns!r} is not a column type; use one of "
                            f"{', '.join(COLUMN_TYPES)}")
        remember_definitions(fn)
        self.plan.functions[name] = SqlFunction(name, fn, kind, where)

    # -- inspecting and running -----------------------------------------------------------------
    def validate(self) -> Pipeline:
        check_plan(self.plan)
        return self

    def explain(self) -> str:
        """The DAG, how each node is lowered to Spark and the pipeline's delivery guarantee."""
        check_plan(self.plan)
        from headrace.spark.explain import explain_text  # names Spark's lowerings: loads pyspark

        return explain_text(self.plan)

    def to_json(self) -> dict[str, Any]:
        check_plan(self.plan)
        return self.plan.to_json()

    def run(self, **options: Any) -> Any:
        """Run until stopped (Ctrl-C, SIGTERM) or until a bounded input is exhausted.
        Options are those of :func:`headrace.run`."""
        from headrace.runtime.runner import run  # the driver and Spark load when a pipeline runs, not when it is built

        return run(self, **options)

    def __repr__(self) -> str:
        return f"Pipeline({self.name!r}, {len(self.plan.nodes)} steps)"


def _python_name(type_name: str) -> str:
    """The Python type a step is given for a column of ``type_name``: ``datetime.datetime`` for timestamp."""
    column_type = COLUMN_TYPES.get(type_name)
    if column_type is None:
        return type_name
    python = column_type.python
    return python.__name__ if python.__module__ == "builtins" else f"{python.__module__}.{python.__name__}"


def _python_type(value: Any) -> str:
    for python_type, name in PYTHON_TYPES.items():
        if type(value) is python_type:
            return name
    return "string"


class Table:
    """A static table, for enrichment joins."""

    def __init__(self, pipeline: Pipeline, node: TableNode) -> None:
        self.pipeline, self.node = pipeline, node


class Stream:
    """An unbounded stream of records with a schema."""

    def __init__(self, pipeline: Pipeline, node: Node) -> None:
        self.pipeline, self.node = pipeline, node

    # -- helpers ----------------------------------------------------------------------------
    def _add(self, node: Node) -> Node:
        return self.pipeline.plan.add(node)

    def _fail(self, name: str, where: str, message: str) -> PlanError:
        return step_error(name, where, message)

    def _check_columns(self, name: str, where: str, needed: Iterable[str], what: str = "column") -> None:
        known = self.node.schema
        if known is None:
            return
        names = [n for n, _ in known]
        for column in needed:
            if column not in names:
                raise self._fail(name, where, f"unknown {what} {column!r}; the stream from "
                                              f"{self.node.name!r} has {', '.join(names)}")

    def _type_of(self, column: str) -> str:
        return dict(self.node.schema or ()).get(column, UNKNOWN)

    def _expr_type(self, e: Expr) -> str:
        """The type of a column expression's result, when the plan can tell without Spark."""
        if e.op == "alias":
            return self._expr_type(e.args[0])
        if e.op == "col":
            return self._type_of(e.args[0])
        if e.op == "cast":
            return str(e.args[1])
        return UNKNOWN

    def _follow(self, node: Node) -> Stream:
        return Stream(self.pipeline, self._add(node))

    def _stage(self, node: Node) -> Stream:
        """Add a stateful step, refused when it cannot read this stream's stateful results."""
        check_stage(self.pipeline.plan, node)
        return self._follow(node)

    # -- stateless steps --------------------------------------------------------------------
    def map(self, fn: Callable[[Any], Any], *, schema: Any = None, name: str | None = None) -> Stream:
        """Apply ``fn`` to each record (a dict); it returns a dict or a dataclass instance
        with the fields of ``schema`` (or of ``fn``'s return annotation)."""
        return self._python("map", fn, schema, name)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, schema: Any = None, name: str | None = None) -> Stream:
        """Apply ``fn`` to each record; it returns an iterable of zero or more output records."""
        return self._python("flat_map", fn, schema, name)

    def filter(self, predicate: Callable[[Any], bool] | Expr, *, name: str | None = None) -> Stream:
        """Keep the records for which ``predicate`` (a Python function or a column expression) is true."""
        step, where = self.pipeline._name(name, "filter"), user_location()
        if isinstance(predicate, Expr):
            self._check_columns(step, where, predicate.columns())
            self._check_filter_of_updates(step, where, predicate.columns())
            return self._follow(NativeStep(step, (self.node.name,), where, self.node.schema,
                                           self.node.event_time, mode="filter", exprs=(("condition", predicate),)))
        if callable(predicate):
            self._check_filter_of_updates(step, where, None)
        return self._python("filter", predicate, None, step)

    def _check_filter_of_updates(self, step: str, where: str, columns: Iterable[str] | None) -> None:
        """A filter below a step that emits updates may only look at that step's keys (``columns``;
        None: a Python function, which may look at anything): a group whose new value stops
        matching would keep its old row in the sink, since update mode cannot take a row back."""
        updating = updating_step(self.pipeline.plan, self.node.name)
        if updating is None or (columns is not None and set(columns) <= set(updating.keys or ())):
            return
        on_keys = f" (a column expression on {', '.join(updating.keys)} only is exact)" if updating.keys else ""
        raise self._fail(step, where, f"a filter on the updates of step {updating.name!r} ({updating.defined_at}) "
                                      "is not supported: each micro-batch emits again every group it changed, and "
                                      "a group whose new value stops matching would stay in the sink with its old "
                                      "value (update mode cannot take a row back); filter where the results are "
                                      f"stored, or aggregate a window with emit='final'{on_keys}")

    def map_batches(self, fn: Callable[[Any], Any], *, format: str = "arrow", schema: Any = None,
                    name: str | None = None) -> Stream:
        """Apply ``fn`` to whole batches: a ``pyarrow.RecordBatch`` (format="arrow") or a pandas
        DataFrame (format="pandas"); it returns the same kind. Without ``schema`` the output has
        the input's columns."""
        if format not in ("arrow", "pandas"):
            raise PlanError(f"map_batches ({user_location()}): format must be 'arrow' or 'pandas', got {format!r}")
        return self._python("map_batches", fn, schema, name, batch_format=format)

    def _python(self, mode: str, fn: Any, schema: Any, name: str | None, batch_format: str | None = None) -> Stream:
        step = self.pipeline._name(name, mode)
        where = user_location()
        if not callable(fn):
            raise self._fail(step, where, f"{mode} needs a function, got {fn!r}")
        # A filter, and a map_batches without a schema, keep the columns of their input as they are.
        same = mode == "filter" or (mode == "map_batches" and schema is None)
        output = self.node.schema if same else self._output_schema(step, where, mode, fn, schema)
        event_time = self.node.event_time if output is None or self.node.event_time in dict(output) else None
        if event_time is not None and not same:
            self._check_event_time_kept(step, where, event_time, output)
        if event_time == RESULT_TIME:  # a stateful step's results: Spark loses their watermark in Python
            event_time = None
        return self._follow(PythonStep(step, (self.node.name,), where, output, event_time, mode=mode, fn=fn,
                                       batch_format=batch_format, output_schema=None if same else output))

    def _check_event_time_kept(self, step: str, where: str, field: str, output: Schema | None) -> None:
        """A Python step whose output keeps the event-time field must keep its type: Spark's
        watermark column cannot change type between the step's input and its output."""
        had, has = self._type_of(field), dict(output or ()).get(field, UNKNOWN)
        if UNKNOWN in (had, has) or had == has:
            return
        raise self._fail(step, where, f"the event-time field {field!r} is {had} in its input (the function is "
                                      f"given a {_python_name(had)}), but the output schema declares it {has}: "
                                      f"declare it {had!r} and return the value as given, or rename the field "
                                      "if it is a different value")

    def _output_schema(self, step: str, where: str, mode: str, fn: Any, schema: Any) -> Schema:
        if schema is not None:
            return schema_of(schema, f"step '{step}' ({where}) schema")
        hints = typing.get_type_hints(fn) if hasattr(fn, "__annotations__") else {}
        returned = hints.get("return")
        if mode == "flat_map" and typing.get_args(returned):
            returned = typing.get_args(returned)[0]
        if is_record_class(returned):
            return schema_of(returned, f"step '{step}' ({where})")
        raise self._fail(step, where, f"{mode} needs the output schema of {function_label(fn)}: annotate its return "
                                      "type with a dataclass or TypedDict, or pass schema={'field': 'type', ...}")

    def select(self, *columns: str | Expr | Mapping[str, Expr], **named: Any) -> Stream:
        """Keep (and compute) columns: ``select("a", hr.col("b").alias("c"), d=hr.col("x") * 2)``.
        ``name="step"`` names the step; ``name=<column expression>`` is a column called ``name``."""
        options, named = _options(named, {"name": None}, Expr)
        step = self.pipeline._name(options["name"], "select")
        where = user_location()
        exprs: list[tuple[str, Expr]] = []
        for item in columns:
            if isinstance(item, Mapping):
                exprs.extend(item.items())
                continue
            e = col(item) if isinstance(item, str) else item
            out = e.output_name() if isinstance(e, Expr) else None
            if out is None:
                raise self._fail(step, where, f"cannot name the column {item!r}: use .alias('name') or name=expr")
            exprs.append((out, e))
        exprs.extend(named.items())
        return self._projection(step, where, "select", exprs, keep_input=False)

    def with_columns(self, columns: Mapping[str, Expr] | None = None, /, **named: Any) -> Stream:
        """Add or replace columns computed by column expressions: ``with_columns(total=hr.col("a") +
        1)``, or ``with_columns({"total": ...}, name="step")``. ``name="step"`` names the step;
        ``name=<column expression>`` is a column called ``name``."""
        options, named = _options(named, {"name": None}, Expr)
        step = self.pipeline._name(options["name"], "with_columns")
        where = user_location()
        exprs = _merged(self, step, where, columns, named)
        return self._projection(step, where, "with_columns", exprs, keep_input=True)

    def _projection(self, step: str, where: str, mode: str, exprs: list[tuple[str, Expr]],
                    keep_input: bool) -> Stream:
        if not exprs:
            raise self._fail(step, where, f"{mode} needs at least one column")
        names = [out for out, _ in exprs]
        for out, e in exprs:
            if not isinstance(e, Expr):
                raise self._fail(step, where, f"column {out!r} must be a column expression (hr.col, hr.lit, "
                                              f"hr.expr), got {e!r}")
            if names.count(out) > 1:
                raise self._fail(step, where, f"{mode} names the column {out!r} twice")
            self._check_columns(step, where, e.columns())
        new = {out: self._expr_type(e) for out, e in exprs}
        schema: Schema | None = None
        if self.node.schema is not None:
            base = [(n, t) for n, t in self.node.schema if n not in new] if keep_input else []
            schema = tuple(base) + tuple(new.items())
        event_time = self.node.event_time
        if event_time is not None:
            produced = dict(exprs)
            if event_time in produced:
                kept = produced[event_time].op == "col" and produced[event_time].args[0] == event_time
            else:
                kept = keep_input or event_time == RESULT_TIME  # the hidden column goes along
            event_time = event_time if kept else None
        return self._follow(NativeStep(step, (self.node.name,), where, schema, event_time, mode=mode,
                                       exprs=tuple(exprs)))

    # -- time, keys, windows -------------------------------------------------------------------
    def with_event_time(self, field: str, max_out_of_orderness: object = 0, *, name: str | None = None) -> Stream:
        """Declare ``field`` (a timestamp, or epoch milliseconds) as the event time; the watermark
        trails the largest event time seen by ``max_out_of_orderness``."""
        step = self.pipeline._name(name, "event_time")
        where = user_location()
        self._check_columns(step, where, [field], "event-time field")
        kind = self._type_of(field)
        if kind not in ("timestamp", "long", "int", UNKNOWN):
            raise self._fail(step, where, f"event-time field {field!r} is a {kind}; it must be a timestamp or "
                                          "epoch milliseconds (long)")
        delay = to_millis(max_out_of_orderness, f"step '{step}' max_out_of_orderness")
        if delay < 0:
            raise self._fail(step, where, f"max_out_of_orderness must not be negative, got {max_out_of_orderness!r}")
        schema = None if self.node.schema is None else tuple(
            (n, "timestamp" if n == field else t) for n, t in self.node.schema)
        return self._follow(EventTimeNode(step, (self.node.name,), where, schema, field, delay_ms=delay))

    def key_by(self, *keys: str | Callable[[Any], Any], name: str | None = None) -> KeyedStream:
        """Partition the stream by one or more fields, or by a function of the record (its
        result becomes the ``key`` column, a string)."""
        where = user_location()
        if not keys:
            raise PlanError(f"key_by ({where}): give at least one field or a function")
        if len(keys) == 1 and callable(keys[0]):
            fn = keys[0]
            name = self.pipeline._checked_name(name, "key_by")
            step = self.pipeline._name(name and f"{name}_fn", "key_fn")
            if "key" in dict(self.node.schema or ()):
                raise self._fail(step, where, f"the stream from {self.node.name!r} already has a field 'key', which "
                                              "the key function's result would replace; rename that field first, or "
                                              "key by it with key_by('key')")
            schema = None if self.node.schema is None else (*self.node.schema, ("key", "string"))
            carried = None if self.node.event_time == RESULT_TIME else self.node.event_time  # see _python
            keyed_input = Stream(self.pipeline, self._add(PythonStep(step, (self.node.name,), where, schema,
                                                                     carried, mode="key", fn=fn)))
            fields: tuple[str, ...] = ("key",)
        else:
            if not all(isinstance(k, str) for k in keys):
                raise PlanError(f"key_by ({where}): give field names, or a single function")
            fields = tuple(str(k) for k in keys)
            keyed_input = self
        step = self.pipeline._name(name, "key_by")
        keyed_input._check_columns(step, where, fields, "key field")
        node = keyed_input._add(KeyByNode(step, (keyed_input.node.name,), where, keyed_input.node.schema,
                                          keyed_input.node.event_time, keys=fields))
        return KeyedStream(self.pipeline, node)

    def window(self, shape: WindowShape, *, trigger: Trigger | None = None, allowed_lateness: object = 0,
               accumulation: str = "accumulating", name: str | None = None) -> WindowedStream:
        """Group the records into windows: each key's on a keyed stream (``key_by``), else the whole
        stream as one group.
        ``trigger`` (default: on time when the watermark passes the end),
        ``allowed_lateness`` (late records still update a window this long after its end, each firing a
        late pane) and ``accumulation`` ("accumulating" or "discarding" panes) set the emission policy."""
        name = self.pipeline._checked_name(name, "window")
        emission = _emission(trigger, allowed_lateness, accumulation, name or "window", user_location())
        keys = self.keys if isinstance(self, KeyedStream) else ()
        return WindowedStream(self, shape, keys, name, user_location(), emission)

    def join(self, other: Table | Stream, on: Any, *, how: str = "inner", within: Any = None, window: Any = None,
             name: str | None = None) -> Stream:
        """Enrich each record with the row of a static table that has the same ``on`` fields, or
        join with another stream (``how``: inner, left, right or full) bounded in event time:
        ``within=(lower, upper)``, the right record's event time minus the left's (an interval
        join), or ``window=hr.Tumbling(...)`` (both in the same window). See docs/joins.md."""
        step = self.pipeline._name(name, "join")
        where = user_location()
        if isinstance(other, Stream):
            if other.pipeline is not self.pipeline:
                raise self._fail(step, where, f"stream {other.node.name!r} belongs to another pipeline")
            node = stream_join(self.node, other.node, on, how, within, window, step, where)
            check_stage(self.pipeline.plan, node)
            return JoinResult(self.pipeline, self._add(node))
        table = other
        if within is not None or window is not None:
            raise self._fail(step, where, "within= and window= bound a join of two streams; a join with a table "
                                          "needs neither")
        if not isinstance(table, Table):
            raise self._fail(step, where, f"join needs a table from pipeline.table(...), got {type(table).__name__}")
        if how not in ("inner", "left"):
            raise self._fail(step, where, f"how must be 'inner' or 'left', got {how!r}")
        keys = (on,) if isinstance(on, str) else tuple(on)
        self._check_columns(step, where, keys, "join field")
        table_schema = table.node.schema
        if table_schema is not None:
            missing = [k for k in keys if k not in dict(table_schema)]
            if missing:
                raise self._fail(step, where, f"table {table.node.name!r} has no column {missing[0]!r}; it has "
                                              f"{', '.join(n for n, _ in table_schema)}")
        schema = None
        if self.node.schema is not None and table_schema is not None:
            both = [n for n, _ in table_schema if n not in keys and n in dict(self.node.schema)]
            if both:
                raise self._fail(step, where, f"the stream from {self.node.name!r} and table {table.node.name!r} "
                                              f"both have a column {both[0]!r} that is not a join field; rename "
                                              "one of them (select or with_columns) before joining")
            schema = tuple(self.node.schema) + tuple((n, t) for n, t in table_schema if n not in keys)
        return self._follow(JoinNode(step, (self.node.name, table.node.name), where, schema, self.node.event_time,
                                     on=keys, how=how))

    def learn(self, model_factory: Callable[[], Any], *, label: str, features: Sequence[str] | None = None,
              metric: Callable[[], Any] | None = None, drift: bool = False, name: str | None = None) -> Stream:
        """Online learning with one model for the whole stream: as ``keyed.learn`` (docs/ml.md),
        every record under one key, so one task learns them all, in event-time order."""
        step = self.pipeline._name(name, "learn")
        whole = "_hr_whole_stream"
        keyed = (self.with_columns({whole: lit(0).cast("long")}, name=f"{step}_whole_stream")
                 .key_by(whole, name=f"{step}_keyed"))
        learnt = keyed.learn(model_factory, label=label, features=features, metric=metric, drift=drift, name=step)
        fields = [n for n, _ in learnt.node.schema or () if n != whole]
        return learnt.select(*fields, name=f"{step}_output")

    def score(self, registry: str, *, features: Sequence[str] | None = None, name: str | None = None) -> Stream:
        """Score each record with the newest model version published in ``registry``
        (``hr.ml.publish``), chosen per micro-batch and kept in the checkpoint, so a replayed
        batch is scored with the same version and a newly published one takes over from the
        next batch. Adds ``score``, ``prediction`` and ``model_version``. ``features``: the
        record's fields the model reads, in order (default: the names it was published with).
        See docs/ml.md."""
        from headrace.ml import registry as models
        from headrace.ml.scoring import MODEL_VERSION, PREDICTION, SCORE

        step = self.pipeline._name(name, "score")
        where = user_location()
        folder = os.path.abspath(os.fspath(registry))
        version = models.latest_version(folder)
        if version is None:
            raise self._fail(step, where, f"the registry {folder} holds no model: publish one with "
                                          "hr.ml.publish(registry, model, features) before building the pipeline")
        published = models.manifest(folder, version)
        read = list(features) if features is not None else published.feature_names
        if read != published.feature_names:
            raise self._fail(step, where, f"the model (version {version} in {folder}) reads "
                                          f"{', '.join(published.feature_names)}, in that order; features= names "
                                          f"{', '.join(read)}")
        self._check_columns(step, where, read, "feature")
        added = (SCORE, PREDICTION, MODEL_VERSION)
        taken = [n for n, _ in self.node.schema or () if n in added]
        if taken:
            raise self._fail(step, where, f"the stream already has a field {taken[0]!r}, which the score step adds "
                                          f"({', '.join(added)}); rename it first (select or with_columns)")
        schema = (None if self.node.schema is None else
                  (*self.node.schema, (SCORE, "double"), (PREDICTION, published.prediction), (MODEL_VERSION, "long")))
        return self._follow(ScoreNode(step, (self.node.name,), where, schema, self.node.event_time, self.node.keys,
                                      registry=folder, features=tuple(read), prediction=published.prediction))

    def enrich(self, fn: Callable[[Any], Any], *, fields: Any, concurrency: int = 16, timeout: Any = 10.0,
               retries: int = 3, backoff: Any = 0.1, cache_ttl: Any = None, cache_key: Sequence[str] | None = None,
               name: str | None = None) -> Stream:
        """Call ``fn`` for each record: an async function, a function, or ``hr.HttpJson(url)``; it
        returns a dict of ``fields`` (name: type), which are added to the record. Up to
        ``concurrency`` calls are in flight in each Python worker, each within ``timeout``
        seconds and tried again ``retries`` times (the pause ``backoff`` doubling each time); a
        record whose calls all failed goes to ``p.dead_letters(<this stream>)`` with the reason,
        or, without that, stops the pipeline. Output keeps the input's order; answers are kept
        ``cache_ttl`` seconds by the fields ``cache_key``. See docs/enrich.md."""
        step = self.pipeline._name(name, "enrich")
        return self._follow(enrich_node(self.node, step, fn, fields, concurrency=concurrency, timeout=timeout,
                                        retries=retries, backoff=backoff, cache_ttl=cache_ttl, cache_key=cache_key))

    def dedupe(self, keys: str | Sequence[str], *, within: Any = None, keep: str = "first",
               name: str | None = None) -> Stream:
        """Drop the records whose ``keys`` fields equal those of an earlier record: the first
        record of each key passes, and the key is remembered until the watermark passes that
        record's event time + ``within`` (default: the max out-of-orderness), on Spark's
        ``dropDuplicatesWithinWatermark``. With ``keep="last"``, the key's latest record in that
        period passes instead, when the period ends. Needs event time. See docs/dedupe.md."""
        step = self.pipeline._name(name, "dedupe")
        where = user_location()
        node = dedupe_node(self.pipeline.plan, self.node, keys, within, keep, step, where)
        if keep == "first":
            return self._stage(node)
        latest = keep_last(self.pipeline.plan, self.node, node.within_ms, step, where)
        return self.key_by(*node.on, name=f"{step}_keys").process(latest, schema=dict(self.node.schema or ()),
                                                                  name=step)

    def union(self, *others: Stream, name: str | None = None) -> Stream:
        """All records of this stream and ``others``, which must have the same fields."""
        step = self.pipeline._name(name, "union")
        where = user_location()
        if not others:
            raise self._fail(step, where, "union needs at least one other stream")
        types = dict(self.node.schema or ())
        mine = sorted(types)
        for other in others:
            if other.pipeline is not self.pipeline:
                raise self._fail(step, where, f"stream {other.node.name!r} belongs to another pipeline")
            if self.node.schema is None or other.node.schema is None:
                continue
            theirs = sorted(dict(other.node.schema))
            if theirs != mine:
                raise self._fail(step, where, f"streams with different fields cannot be united: "
                                              f"{self.node.name!r} has {mine}, {other.node.name!r} has {theirs}")
            for field_name, kind in other.node.schema:
                if UNKNOWN not in (kind, types[field_name]) and kind != types[field_name]:
                    raise self._fail(step, where, f"streams with different field types cannot be united: "
                                                  f"{field_name!r} is a {types[field_name]} in {self.node.name!r} "
                                                  f"and a {kind} in {other.node.name!r}")
        times = {s.node.event_time for s in (self, *others)}
        event_time = times.pop() if len(times) == 1 else None
        inputs = (self.node.name, *(o.node.name for o in others))
        return self._follow(UnionNode(step, inputs, where, self.node.schema, event_time))

    # -- sinks ------------------------------------------------------------------------------------
    def sink(self, name: str, connector: SinkConnector) -> None:
        """Send every record of this stream to ``connector``."""
        where = user_location()
        if not isinstance(connector, SinkConnector):
            raise PlanError(f"sink {name!r} ({where}): expected a headrace sink connector, got "
                            f"{type(connector).__name__}")
        connector = connector.for_keys(view_keys(self.pipeline.plan, self.node))
        check_sink_takes_updates(self.pipeline.plan, name, where, connector, self.node.name)
        problem = connector.refuses_columns([n for n, _ in self.node.schema]) if self.node.schema is not None else None
        if problem:
            raise PlanError(f"sink {name!r} ({where}): {problem}")
        self._add(SinkNode(name, (self.node.name,), where, self.node.schema, connector=connector))

    def queryable(self, view: str, *, key: str | Sequence[str] | None = None) -> None:
        """Keep the last row of each key of this stream as the view ``view``, which ``headrace server``
        serves (``headrace query``): ``sink(view, hr.sinks.View(key=key))``. ``key`` defaults to the
        keys of a keyed aggregate, a window (with ``window_start``) or a keyed process step."""
        from headrace.connectors.view_sink import View

        self.sink(view, View(key=key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.node.name!r})"


class KeyedStream(Stream):
    """A stream partitioned by key: rolling aggregates and windows are computed per key."""

    @property
    def keys(self) -> tuple[str, ...]:
        return self.node.keys or ()

    def aggregate(self, aggs: Mapping[str, Agg] | None = None, /, **named: Any) -> Stream:
        """Running aggregates per key, emitted for each key a micro-batch updates. With ``ttl``
        (``"1h"``, a timedelta or milliseconds), a key that receives no record for that long in
        processing time is forgotten, and its next record starts it again from nothing.
        ``name=`` and ``ttl=`` holding an aggregate are output columns of those names."""
        options, named = _options(named, {"name": None, "ttl": None}, Agg)
        name, ttl = options["name"], options["ttl"]
        step = self.pipeline._name(name, "aggregate")
        where = user_location()
        checked = _check_aggs(self, step, where, dict(_merged(self, step, where, aggs, named)), self.keys)
        schema = _aggregate_schema(self, checked)
        return self._stage(RollingAggregateNode(step, (self.node.name,), where, schema, keys=self.keys,
                                                aggs=checked, ttl_ms=_ttl(ttl, step, where)))

    def count(self, *, name: str | None = None, ttl: Any = None) -> Stream:
        return self._aggregate_one("count", None, name, ttl)

    def sum(self, column: str, *, name: str | None = None, ttl: Any = None) -> Stream:
        return self._aggregate_one("sum", column, name, ttl)

    def min(self, column: str, *, name: str | None = None, ttl: Any = None) -> Stream:
        return self._aggregate_one("min", column, name, ttl)

    def max(self, column: str, *, name: str | None = None, ttl: Any = None) -> Stream:
        return self._aggregate_one("max", column, name, ttl)

    def mean(self, column: str, *, name: str | None = None, ttl: Any = None) -> Stream:
        return self._aggregate_one("mean", column, name, ttl)

    def _aggregate_one(self, func: str, column: str | None, name: str | None, ttl: Any) -> Stream:
        """``aggregate`` with the one aggregate ``func`` of ``column``, as the column ``func``; the step
        is named ``name`` or after ``func``."""
        name = self.pipeline._checked_name(name, func)
        return self.aggregate(name=name or self.pipeline._name(None, func), ttl=ttl, **{func: Agg(func, column)})

    def reduce(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]], *,
               name: str | None = None, ttl: Any = None) -> Stream:
        """Fold each key's records with ``fn(accumulated, record) -> record`` (Flink's reduce); emits the
        key's current result for every key a micro-batch updates. Records keep the stream's schema.
        ``ttl`` forgets a key quiet for that long, as in :meth:`aggregate`."""
        step = self.pipeline._name(name, "reduce")
        where = user_location()
        if not callable(fn):
            raise self._fail(step, where, f"reduce needs a function, got {fn!r}")
        check_stage(self.pipeline.plan, RollingAggregateNode(step, (self.node.name,), where, None))
        if self.node.schema is None or UNKNOWN in dict(self.node.schema).values():
            raise self._fail(step, where, "reduce needs a stream whose field types are known; declare them with a "
                                          "map(..., schema=...) before key_by")
        return self._stage(RollingAggregateNode(step, (self.node.name,), where, self.node.schema, keys=self.keys,
                                                reduce_fn=fn, ttl_ms=_ttl(ttl, step, where)))

    def process(self, fn: KeyedProcessFunction, *, schema: Any, name: str | None = None) -> Stream:
        """Run ``fn``, a :class:`~headrace.KeyedProcessFunction` instance, on each key's records, with
        the state it declares and the timers it registers; ``schema`` gives the fields of the
        records it emits. Each key's state is kept under its key in Spark's state store."""
        step = self.pipeline._name(name, "process")
        where = user_location()
        check_process_function(fn, step, where)
        if schema is None:
            raise step_error(step, where, "give the fields of the records the function emits: schema={'field': "
                                          "'type', ...}, a DDL string, a dataclass or a TypedDict")
        output = schema_of(schema, f"step '{step}' ({where}) schema")
        # with event time, each emitted record has one (ctx.emit(record, timestamp=...))
        timed = RESULT_TIME if self.node.event_time is not None else None
        return self._stage(KeyedProcessNode(step, (self.node.name,), where, output, timed, fn=fn))


    def rolling(self, over: Any, *, name: str | None = None, **features: Agg) -> Stream:
        """Rolling features per key over a span of event time (docs/ml.md): each record with
        ``features`` (``spend=hr.sum("amount")``, ``n=hr.count()``; count, sum, mean, min, max)
        over the key's records whose event time lies in ``(t - over, t]``, ``t`` the record's,
        emitted once the watermark passes ``t``. The same values on a bounded and an unbounded
        input, as a range window over the whole input gives them."""
        from headrace.ml.rolling import RollingFeatures

        step = self.pipeline._name(name, "rolling")
        where = user_location()
        if self.node.event_time is None:
            raise self._fail(step, where, "rolling features span event time: declare it (event_time= on the source, "
                                          "or with_event_time) before key_by")
        span = to_millis(over, f"step '{step}' over")
        if span <= 0:
            raise self._fail(step, where, f"over must be a positive duration, got {over!r}")
        if not features or not all(isinstance(agg, Agg) for agg in features.values()):
            raise self._fail(step, where, "give each feature as name=aggregate, e.g. spend=hr.sum('amount'), "
                                          "n=hr.count()")
        self._check_columns(step, where, [agg.column for agg in features.values() if agg.column], "field")
        known = [(n, t) for n, t in self.node.schema or () if n != RESULT_TIME]
        taken = [n for n in features if n in dict(known)]
        if taken:
            raise self._fail(step, where, f"the feature {taken[0]!r} has the name of a field of the stream; name "
                                          "it otherwise")
        if self.node.schema is None:
            raise self._fail(step, where, "rolling needs a stream whose fields are known; declare its schema")
        output = (*known, *[(n, result_type(agg, dict(known).get(agg.column or "")) or "double")
                            for n, agg in features.items()])
        return self.process(RollingFeatures(span, dict(features)), schema=dict(output), name=step)

    def learn(self, model_factory: Callable[[], Any], *, label: str, features: Sequence[str] | None = None,
              metric: Callable[[], Any] | None = None, drift: bool = False, name: str | None = None) -> Stream:
        """Online learning per key (docs/ml.md): a River model per key, made by
        ``model_factory()``, predicts each record's ``label`` from its ``features`` (default:
        every field but the keys, the label and the event time), then learns from it, in event-
        time order. Emits the keys, the event time, the label, ``prediction``, ``metric`` (prequential: River's
        ``metric()``, default accuracy, or mean absolute error for a ``double`` label),
        ``drift`` (ADWIN on the error, a rise only; with ``drift=True``) and ``seen``."""
        from headrace.ml.online import DRIFT, METRIC, PREDICTION, SEEN, OnlineLearner

        step = self.pipeline._name(name, "learn")
        where = user_location()
        try:
            from river import metrics
        except ImportError:
            raise self._fail(step, where, "learn needs River: pip install river (or headrace's ml extra)") from None
        if not callable(model_factory):
            raise self._fail(step, where, f"learn needs a function that makes a River model, e.g. "
                                          f"lambda: linear_model.LogisticRegression(), got {model_factory!r}")
        self._check_columns(step, where, [label], "label field")
        known = dict(self.node.schema or ())
        read = list(features) if features is not None else [
            n for n in known if n not in (*self.keys, label, self.node.event_time)]
        self._check_columns(step, where, read, "feature")
        label_type = known.get(label, UNKNOWN)
        if label_type == UNKNOWN:
            raise self._fail(step, where, f"the label field {label!r} needs a known type; declare the stream's schema")
        measure = metric or (metrics.MAE if label_type == "double" else metrics.Accuracy)
        time = self.node.event_time
        schema = {**{k: known.get(k, "string") for k in self.keys}, **({time: "timestamp"} if time else {}),
                  label: label_type, PREDICTION: label_type, METRIC: "double", DRIFT: "boolean", SEEN: "long"}
        learner = OnlineLearner(model_factory, label, read, measure, drift, list(self.keys), time)
        return self.process(learner, schema=schema, name=step)


class WindowedStream:
    """A keyed (or whole) stream grouped into event-time windows; aggregate it to get a stream."""

    def __init__(self, stream: Stream, shape: WindowShape, keys: tuple[str, ...], name: str | None,
                 where: str, emission: Emission | None = None) -> None:
        if not isinstance(shape, WindowShape):
            raise PlanError(f"window ({where}): expected hr.Tumbling, hr.Sliding, hr.Session, hr.Count or "
                            f"hr.Global, got {shape!r}")
        self.stream, self.shape, self.keys, self.name, self.where = stream, shape, keys, name, where
        self.emission = emission or Emission()
        timeless = isinstance(shape, Count) or not self.emission.trigger.fires_on_time
        if isinstance(shape, Count) and not self.emission.is_default():
            raise PlanError(f"window ({where}): count windows fire every `slide` records; they take no trigger, "
                            "allowed lateness or accumulation")
        if isinstance(shape, Global) and not timeless and stream.node.event_time is None:
            raise PlanError(f"window ({where}): a global window without a CountTrigger fires when the input ends, "
                            "which needs event time: declare it, or give trigger=hr.CountTrigger(n)")
        if stream.node.event_time is None and not timeless and not isinstance(shape, Global):
            step = name or "window"
            why = why_no_event_time(stream.pipeline.plan, stream.node.name)
            if why:
                raise step_error(step, where, f"the stream from {stream.node.name!r} has no event time: {why}")
            raise step_error(step, where, f"the stream from {stream.node.name!r} has no event time; declare it with "
                                          ".with_event_time('field', max_out_of_orderness) (or event_time= on the "
                                          "source) before windowing")

    def aggregate(self, aggs: Mapping[str, Agg] | None = None, /, **named: Any) -> WindowResult:
        """Aggregates per key and window; output: the keys, ``window_start``, ``window_end`` and one
        column per aggregate. ``emit="final"`` gives one row per window once the watermark passes its
        end; ``emit="updates"`` a row each micro-batch that changes the window. ``emit=`` holding an
        aggregate is an output column called ``emit``."""
        options, named = _options(named, {"emit": "final"}, Agg)
        emit = options["emit"]
        stream = self.stream
        step = stream.pipeline._name(self.name, "window")
        aggs = dict(_merged(stream, step, self.where, aggs, named))
        if emit not in ("final", "updates"):
            raise step_error(step, self.where, f"emit must be 'final' or 'updates', got {emit!r}")
        checked = _check_aggs(stream, step, self.where, aggs, self._added_columns())
        schema = _aggregate_schema(stream, checked, windowed=True, panes=self._has_panes())
        if emit == "updates" and not self.emission.is_default():
            raise step_error(step, self.where, "emit='updates' is Spark's update mode for default windows; with a "
                                               "trigger, lateness or discarding panes the panes are the updates: "
                                               "use emit='final'")
        return self._finish(WindowAggregateNode(step, (stream.node.name,), self.where, schema, keys=self.keys,
                                                window=self.shape, aggs=checked, emit=emit, emission=self.emission))

    def count(self, *, emit: str = "final") -> WindowResult:
        return self.aggregate(emit=emit, count=Agg("count"))

    def reduce(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]) -> WindowResult:
        """Fold each window's records with ``fn(accumulated, record) -> record``; the output has the
        stream's fields (keys and window bounds first)."""
        return self._function("reduce", fn, None)

    def aggregate_with(self, function: AggregateFunction, *, schema: Any) -> WindowResult:
        """A user aggregate function (``create``, ``add``, ``merge``, ``result``); ``schema`` gives the
        fields of the dict ``result`` returns."""
        return self._function("aggregate_function", function, schema)

    def process(self, fn: Callable[..., Any], *, schema: Any) -> WindowResult:
        """``fn(key, (start_ms, end_ms), records) -> iterable of dicts`` with every record of the pane;
        ``schema`` gives the fields of the dicts."""
        return self._function("process", fn, schema)

    def _function(self, kind: str, fn: Any, schema: Any) -> WindowResult:
        stream = self.stream
        step = stream.pipeline._name(self.name, "window")
        if kind == "aggregate_function":
            missing = [m for m in ("create", "add", "merge", "result") if not callable(getattr(fn, m, None))]
            if missing:
                raise step_error(step, self.where, f"an aggregate function needs the methods create, add, merge and "
                                                   f"result; {type(fn).__name__} lacks {', '.join(missing)}")
        elif not callable(fn):
            raise step_error(step, self.where, f"{kind} needs a function, got {fn!r}")
        if kind == "reduce":
            if stream.node.schema is None or UNKNOWN in dict(stream.node.schema).values():
                raise step_error(step, self.where, "reduce needs a stream whose field types are known")
            results = tuple((n, t) for n, t in stream.node.schema if n not in self.keys)
        else:
            results = schema_of(schema, f"step '{step}' ({self.where}) schema")
        self._refuse_collisions(step, kind, results)
        keys = tuple((k, stream._type_of(k)) for k in self.keys)
        panes = (("pane_kind", "string"), ("pane_index", "long")) if self._has_panes() else ()
        output = (*keys, ("window_start", "timestamp"), ("window_end", "timestamp"), *panes, *results)
        return self._finish(WindowAggregateNode(step, (stream.node.name,), self.where, output, keys=self.keys,
                                                window=self.shape, emission=self.emission, function=kind, fn=fn,
                                                result_schema=results))

    def _has_panes(self) -> bool:
        return self.emission.has_panes(by_count=self.shape.by_count)

    def _added_columns(self) -> tuple[str, ...]:
        """The columns the window puts before its results (docs/windows.md, "Output columns")."""
        panes = ("pane_kind", "pane_index") if self._has_panes() else ()
        return (*self.keys, "window_start", "window_end", *panes)

    def _refuse_collisions(self, step: str, kind: str, results: Schema) -> None:
        added = self._added_columns()
        for name, _ in results:
            if name in added:
                fix = ("rename that field before the window (select or with_columns)" if kind == "reduce"
                       else f"rename {name!r} in schema=")
                raise step_error(step, self.where, f"the {kind.replace('_', ' ')}'s output field {name!r} collides "
                                                   f"with a column the window adds (its output starts with "
                                                   f"{', '.join(added)}); {fix}")

    def _finish(self, node: WindowAggregateNode) -> WindowResult:
        by_count = self.shape.by_count or not self.emission.trigger.fires_on_time
        if self.stream.node.event_time is not None and not by_count:
            node = dataclasses.replace(node, event_time=RESULT_TIME)  # each result at its window's end - 1 µs
        check_stage(self.stream.pipeline.plan, node)
        return WindowResult(self.stream.pipeline, self.stream._add(node))


class WindowResult(Stream):
    """The output of a window step, with access to its late side output."""

    def late_records(self, *, name: str | None = None) -> Stream:
        """The records this window step dropped as too late: ``step``, ``key``, ``event_time``, the
        ``window_start`` and ``window_end`` they missed, and the ``record``. Asking for them runs the
        window as a stateful processor."""
        step = self.pipeline._name(name, f"{self.node.name}_late")
        return self._follow(LateRecordsNode(step, (self.node.name,), user_location(), WINDOW_LATE_SCHEMA))


class JoinResult(Stream):
    """The output of a join of two streams, with access to its late side output."""

    def late_records(self, *, name: str | None = None) -> Stream:
        """The records this join dropped as too late (docs/joins.md): ``step``, ``side`` (``left``:
        the stream ``join`` was called on; ``right``: the other), ``key`` (the join key as text),
        ``event_time`` and the ``record`` as JSON. Each side's records are read a second time in
        each micro-batch to find them."""
        step = self.pipeline._name(name, f"{self.node.name}_late")
        return self._follow(LateRecordsNode(step, (self.node.name,), user_location(), JOIN_LATE_SCHEMA))


def _emission(trigger: Any, allowed_lateness: object, accumulation: str, step: str, where: str) -> Emission:
    if trigger is not None and not isinstance(trigger, Trigger):
        raise step_error(step, where, f"trigger must be hr.AfterWatermark(...) or hr.CountTrigger(n), got {trigger!r}")
    lateness = to_millis(allowed_lateness, f"step '{step}' allowed_lateness")
    if lateness < 0:
        raise step_error(step, where, f"allowed_lateness must not be negative, got {allowed_lateness!r}")
    if accumulation not in ("accumulating", "discarding"):
        raise step_error(step, where, f"accumulation must be 'accumulating' or 'discarding', got {accumulation!r}")
    return Emission(trigger or AfterWatermark(), lateness, accumulation == "accumulating")


def _ttl(ttl: Any, step: str, where: str) -> int | None:
    """A rolling step's time-to-live in milliseconds (None: keys are kept for ever)."""
    if ttl is None:
        return None
    millis = to_millis(ttl, f"step '{step}' ttl")
    if millis <= 0:
        raise step_error(step, where, f"ttl must be positive, got {ttl!r}")
    return millis


def _options(given: dict[str, Any], defaults: dict[str, Any], column_type: type) -> tuple[dict[str, Any],
                                                                                        dict[str, Any]]:
    """Split a step's keyword arguments into its options (``name=``, ``ttl=``, ``emit=``) and its
    columns: a keyword holding a ``column_type`` value is a column, whatever it is called, so a
    column can be called ``name``. The columns keep the order they were given in."""
    options = dict(defaults)
    columns = {}
    for key, value in given.items():
        if key in defaults and not isinstance(value, column_type):
            options[key] = value
        else:
            columns[key] = value
    return options, columns


def _merged(stream: Stream, step: str, where: str, mapping: Mapping[str, Any] | None,
            named: dict[str, Any]) -> list[tuple[str, Any]]:
    """The columns of a mapping given positionally, then those given by keyword."""
    if mapping is not None and not isinstance(mapping, Mapping):
        raise stream._fail(step, where, f"give the columns as keyword arguments or one mapping of names to "
                                        f"columns, got {mapping!r}")
    mapping = dict(mapping or {})
    twice = next((key for key in named if key in mapping), None)
    if twice is not None:
        raise stream._fail(step, where, f"the column {twice!r} is given twice, in the mapping and as {twice}=")
    return [*mapping.items(), *named.items()]


def _check_aggs(stream: Stream, step: str, where: str, aggs: dict[str, Agg],
                reserved: tuple[str, ...]) -> tuple[tuple[str, Agg], ...]:
    """Check each aggregate: a known function, a column it can read, an output name of its own
    (``reserved`` names the key and window columns of the output)."""
    if not aggs:
        raise step_error(step, where, "give at least one aggregate, e.g. aggregate(n=hr.count(), total=hr.sum('x'))")
    for out, agg in aggs.items():
        if not isinstance(agg, Agg) or agg.func not in FUNCTIONS:
            raise step_error(step, where, f"{out}={agg!r} is not an aggregate; use hr.count(), hr.sum(col), "
                                          "hr.min(col), hr.max(col) or hr.mean(col)")
        if out in reserved:
            raise step_error(step, where, f"the aggregate {out}={agg!r} would replace the output column {out!r} "
                                          f"(the output starts with {', '.join(reserved)}); give it another name")
        if agg.func != "count" and agg.column is None:
            raise step_error(step, where, f"{out}={agg!r} needs a column, e.g. hr.{agg.func}('price')")
        if agg.column is not None:
            stream._check_columns(step, where, [agg.column])
            kind = stream._type_of(agg.column)
            if agg.func in ("sum", "mean") and kind not in (*NUMERIC_TYPES, UNKNOWN):
                raise step_error(step, where, f"{out}={agg!r}: column {agg.column!r} is a {kind}; "
                                              f"{agg.func} needs a number ({', '.join(NUMERIC_TYPES)})")
    return tuple(aggs.items())


def _aggregate_schema(stream: Stream, aggs: tuple[tuple[str, Agg], ...], windowed: bool = False,
                      panes: bool = False) -> Schema | None:
    """The output fields of an aggregate: the keys, the window bounds and, for windows with
    triggers, lateness or discarding (``panes``), each pane's kind and index, then the aggregates."""
    keys = stream.node.keys or ()
    if stream.node.schema is None:
        return None
    types = dict(stream.node.schema)
    out = [(k, types.get(k, UNKNOWN)) for k in keys]
    if windowed:
        out += [("window_start", "timestamp"), ("window_end", "timestamp")]
    if panes:
        out += [("pane_kind", "string"), ("pane_index", "long")]
    for name, agg in aggs:
        out.append((name, result_type(agg, types.get(agg.column) if agg.column else None) or UNKNOWN))
    return tuple(out)
