"""The plan's nodes: frozen, JSON-able, free of Spark.

Every node has a unique ``name`` (its state identity), the names of its
``inputs``, where the user defined it (``defined_at``, ``file:line``), and what
is known of its output: ``schema`` (None when unknown), the ``event_time`` field
and the ``keys`` of a keyed stream. A handful of primitive kinds are lowered by
the compiler; ``map``, ``filter``, ``count`` and friends are built from them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from headrace.aggregates import Agg
from headrace.code_locations import function_label
from headrace.contract import SinkConnector, SourceConnector
from headrace.durations import describe_millis
from headrace.expr import Expr
from headrace.plan.call_policy import CallPolicy
from headrace.process import declared_state
from headrace.schema import Schema
from headrace.triggers import Emission
from headrace.windows import Tumbling, WindowShape

# The event time of a stateful step's results (a window's end − 1 µs, a process step's emit
# time), in a column no schema shows: it lets the results feed a later stateful step, and is
# dropped before Python steps and sinks (headrace/plan/stages.py).
RESULT_TIME = "_hr_event_time"


@dataclass(frozen=True)
class Node:
    kind: ClassVar[str] = "node"
    name: str
    inputs: tuple[str, ...]
    defined_at: str
    schema: Schema | None
    event_time: str | None = None
    keys: tuple[str, ...] | None = None

    def params(self) -> dict[str, Any]:
        """The node's own settings, for JSON and explain."""
        return {}

    def summary(self) -> str:
        """One line for explain."""
        return self.kind

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "inputs": list(self.inputs),
            "defined_at": self.defined_at,
            "schema": [list(pair) for pair in self.schema] if self.schema is not None else None,
            "event_time": self.event_time, "keys": list(self.keys) if self.keys is not None else None,
            **self.params(),
        }


@dataclass(frozen=True)
class SourceNode(Node):
    kind: ClassVar[str] = "source"
    connector: SourceConnector = field(default=None, compare=False)  # type: ignore[assignment]

    def params(self) -> dict[str, Any]:
        return {"connector": self.connector.describe(), "guarantee": self.connector.guarantee.value}

    def summary(self) -> str:
        return f"source {type(self.connector).__name__}"


@dataclass(frozen=True)
class TableNode(Node):
    """A static table for lookups: rows given in Python, or a file read once at start."""

    kind: ClassVar[str] = "table"
    rows: tuple[dict[str, Any], ...] | None = field(default=None, compare=False)
    path: str | None = None
    format: str | None = None

    def params(self) -> dict[str, Any]:
        return {"rows": len(self.rows) if self.rows is not None else None, "path": self.path, "format": self.format}

    def summary(self) -> str:
        return f"table ({len(self.rows)} rows)" if self.rows is not None else f"table {self.format} {self.path}"


@dataclass(frozen=True)
class PythonStep(Node):
    """A stateless step running a Python function: map, flat_map, filter, key (key_by a
    function) or map_batches (over a pyarrow.RecordBatch or a pandas DataFrame)."""

    kind: ClassVar[str] = "python"
    mode: str = "map"
    fn: Callable[..., Any] = field(default=None, compare=False)  # type: ignore[assignment]
    batch_format: str | None = None
    output_schema: Schema | None = None

    def params(self) -> dict[str, Any]:
        return {"mode": self.mode, "function": function_label(self.fn), "batch_format": self.batch_format}

    def summary(self) -> str:
        return f"{self.mode} {function_label(self.fn)}"


@dataclass(frozen=True)
class NativeStep(Node):
    """A stateless step of column expressions: filter, select or with_columns."""

    kind: ClassVar[str] = "native"
    mode: str = "filter"
    exprs: tuple[tuple[str, Expr], ...] = ()

    def params(self) -> dict[str, Any]:
        return {"mode": self.mode, "exprs": [[n, e.to_json()] for n, e in self.exprs]}

    def summary(self) -> str:
        if self.mode == "filter":
            return f"filter {self.exprs[0][1]!r}"
        return f"{self.mode} " + ", ".join(n if e.output_name() == n else f"{n}={e!r}" for n, e in self.exprs)


@dataclass(frozen=True)
class EventTimeNode(Node):
    """Declares the event-time field and the maximum out-of-orderness (the watermark delay)."""

    kind: ClassVar[str] = "event_time"
    delay_ms: int = 0

    def params(self) -> dict[str, Any]:
        return {"delay_ms": self.delay_ms}

    def summary(self) -> str:
        return f"event time {self.event_time!r}, max out-of-orderness {self.delay_ms} ms"


@dataclass(frozen=True)
class KeyByNode(Node):
    kind: ClassVar[str] = "key_by"

    def summary(self) -> str:
        return f"key by {', '.join(self.keys or ())}"


@dataclass(frozen=True)
class RollingAggregateNode(Node):
    """Per-key running aggregates, updated and emitted for every key a micro-batch touches.
    With ``reduce_fn``, a custom reduce over whole records instead of built-in aggregates."""

    kind: ClassVar[str] = "rolling_aggregate"
    aggs: tuple[tuple[str, Agg], ...] = ()
    reduce_fn: Callable[..., Any] | None = field(default=None, compare=False)
    ttl_ms: int | None = None  # processing time after which a quiet key's state is removed

    def params(self) -> dict[str, Any]:
        return {"aggs": {n: a.to_json() for n, a in self.aggs},
                "reduce": function_label(self.reduce_fn) if self.reduce_fn else None, "ttl_ms": self.ttl_ms}

    def summary(self) -> str:
        what = (f"rolling reduce {function_label(self.reduce_fn)}" if self.reduce_fn is not None
                else "rolling " + ", ".join(f"{n}={a!r}" for n, a in self.aggs))
        return what + (f", keys expire after {describe_millis(self.ttl_ms)} quiet" if self.ttl_ms is not None else "")


@dataclass(frozen=True)
class WindowAggregateNode(Node):
    """Aggregates per key and event-time window. ``emit`` is ``final`` (one row when the
    watermark passes the window's end) or ``updates`` (a row each batch a window changes)."""

    kind: ClassVar[str] = "window_aggregate"
    window: WindowShape = field(default=None, compare=False)  # type: ignore[assignment]
    aggs: tuple[tuple[str, Agg], ...] = ()
    emit: str = "final"
    emission: Emission = field(default_factory=Emission)
    function: str = "aggregates"  # aggregates, reduce, aggregate_function or process
    fn: Any = field(default=None, compare=False)
    result_schema: Schema | None = None  # the output fields of a reduce, aggregate or process function

    def params(self) -> dict[str, Any]:
        return {"window": self.window.to_json(), "aggs": {n: a.to_json() for n, a in self.aggs}, "emit": self.emit,
                "emission": self.emission.to_json(), "function": self.function,
                "fn": function_label(self.fn) if callable(self.fn) else type(self.fn).__name__ if self.fn else None}

    def summary(self) -> str:
        if self.function == "aggregates":
            what = ", ".join(f"{n}={a!r}" for n, a in self.aggs)
        else:
            what = f"{self.function} {self.params()['fn']}"
        policy = "" if self.emission.is_default() else f", {self.emission.trigger.describe()}"
        if self.emission.allowed_lateness_ms:
            policy += f", allowed lateness {self.emission.allowed_lateness_ms} ms"
        if not self.emission.accumulating:
            policy += ", discarding"
        return f"window {self.window}: {what} (emit {self.emit}{policy})"


@dataclass(frozen=True)
class LateRecordsNode(Node):
    """The late side output of a window step: records dropped as too late, with the step
    and the window they missed."""

    kind: ClassVar[str] = "late_records"

    def summary(self) -> str:
        return f"late records of {self.inputs[0]}"


@dataclass(frozen=True)
class KeyedProcessNode(Node):
    """User code with declared per-key state and timers (a ``KeyedProcessFunction``); its
    output has the declared ``schema``."""

    kind: ClassVar[str] = "keyed_process"
    fn: Any = field(default=None, compare=False)

    def params(self) -> dict[str, Any]:
        states = declared_state(type(self.fn))
        return {"fn": type(self.fn).__name__, "state": {n: s.describe() for n, s in states.items()}}

    def summary(self) -> str:
        states = ", ".join(f"{n} ({s})" for n, s in self.params()["state"].items()) or "no state"
        return f"process {function_label(type(self.fn).process)}: {states}"


@dataclass(frozen=True)
class JoinNode(Node):
    """A stream joined with a static table (inputs: the stream, then the table)."""

    kind: ClassVar[str] = "join"
    on: tuple[str, ...] = ()
    how: str = "inner"

    def params(self) -> dict[str, Any]:
        return {"on": list(self.on), "how": self.how}

    def summary(self) -> str:
        return f"{self.how} join with table {self.inputs[1]!r} on {', '.join(self.on)}"


JOIN_WINDOW_FIELDS = ("window_start", "window_end")  # the fields a window join adds
# The late side output of a window step, and of a join of two streams (docs/windows.md, docs/joins.md)
WINDOW_LATE_SCHEMA = (("step", "string"), ("key", "string"), ("event_time", "timestamp"),
                      ("window_start", "timestamp"), ("window_end", "timestamp"), ("record", "string"))
JOIN_LATE_SCHEMA = (("step", "string"), ("side", "string"), ("key", "string"), ("event_time", "timestamp"),
                    ("record", "string"))


@dataclass(frozen=True)
class StreamJoinNode(Node):
    """Two streams joined on equal keys, bounded in event time (inputs: left, right): an
    interval join (the right record's time within ``[left + lower_ms, left + upper_ms]``) or,
    with ``window``, a window join (both records in the same tumbling window). The output has
    the left record's fields, then the right's (a key of the same name on both sides once)."""

    kind: ClassVar[str] = "stream_join"
    left_on: tuple[str, ...] = ()
    right_on: tuple[str, ...] = ()
    how: str = "inner"  # inner, left, right or full
    lower_ms: int = 0
    upper_ms: int = 0
    window: Tumbling | None = field(default=None, compare=False)

    def params(self) -> dict[str, Any]:
        # A window join's state is kept under Spark's window column (``state_key``): a checkpoint whose
        # record lacks it kept its records under the window's start, which a restart refuses.
        bound: dict[str, Any] = ({"window": self.window.to_json(), "state_key": "window"} if self.window is not None
                                 else {"within_ms": [self.lower_ms, self.upper_ms]})
        return {"left_on": list(self.left_on), "right_on": list(self.right_on), "how": self.how, **bound}

    def summary(self) -> str:
        keys = ", ".join(a if a == b else f"{a} = {b}" for a, b in zip(self.left_on, self.right_on))
        bound = (f"in the same {self.window}" if self.window is not None else
                 f"right time within [{describe_millis(self.lower_ms)}, {describe_millis(self.upper_ms)}] "
                 "of the left's")
        return f"{self.how} join of {self.inputs[0]!r} with stream {self.inputs[1]!r} on {keys}, {bound}"


@dataclass(frozen=True)
class DedupeNode(Node):
    """Drops each record whose ``on`` fields equal those of an earlier record still remembered:
    the first record of a key passes, and the key is remembered until the watermark passes that
    record's event time + ``within_ms`` (None: the watermark's delay). Its output is its input's
    records, with their own event time (see docs/dedupe.md)."""

    kind: ClassVar[str] = "dedupe"
    on: tuple[str, ...] = ()
    within_ms: int | None = None

    def params(self) -> dict[str, Any]:
        return {"on": list(self.on), "within_ms": self.within_ms}

    def summary(self) -> str:
        within = "the max out-of-orderness" if self.within_ms is None else describe_millis(self.within_ms)
        return f"dedupe on {', '.join(self.on)}: keep the first, each key remembered for {within} of event time"


@dataclass(frozen=True)
class UnionNode(Node):
    kind: ClassVar[str] = "union"

    def summary(self) -> str:
        return f"union of {', '.join(self.inputs)}"


@dataclass(frozen=True)
class DeadLettersNode(Node):
    """The records its input sources could not parse: source, position, raw record, error."""

    kind: ClassVar[str] = "dead_letters"

    def summary(self) -> str:
        return f"dead letters of {', '.join(self.inputs)}"


@dataclass(frozen=True)
class SinkNode(Node):
    kind: ClassVar[str] = "sink"
    connector: SinkConnector = field(default=None, compare=False)  # type: ignore[assignment]

    def params(self) -> dict[str, Any]:
        return {"connector": self.connector.describe(), "guarantee": self.connector.guarantee.value}

    def summary(self) -> str:
        return f"sink {type(self.connector).__name__}"



@dataclass(frozen=True)
class Edge:
    """A stream into an operator's input port: from a step (``port`` None) or from another
    operator's output ``port``, routed by ``grouping`` over the operator's instances."""

    id: int
    source: str
    port: str | None
    target_port: str
    grouping: Any = None  # a headrace.groupings.Grouping
    stream: str = ""  # the stream's name (add_stream's name)
    locality: str | None = None  # "thread_local": the receiver runs in the sender's Python stage

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "from": self.source, "port": self.port, "to_port": self.target_port,
                "grouping": self.grouping.to_json(), "stream": self.stream, "locality": self.locality}


@dataclass(frozen=True)
class OperatorNode(Node):
    """An Apex operator or a Storm bolt: ``partitions`` instances, each with its own state (the
    operator's attributes), run once per streaming window (micro-batch) on the records its
    input ``edges`` route to it (see headrace/api/operator_dag.py and headrace/engine/instances.py)."""

    kind: ClassVar[str] = "operator"
    operator: Any = field(default=None, compare=False)
    partitions: int = 1
    application_window: int = 1
    edges: tuple[Edge, ...] = ()
    output_ports: tuple[tuple[str, Schema | None], ...] = ()
    api: str = "apex"  # "apex" or "storm": how records are handed to the instance

    def params(self) -> dict[str, Any]:
        return {"operator": type(self.operator).__name__, "partitions": self.partitions,
                "application_window": self.application_window, "edges": [e.to_json() for e in self.edges],
                "output_ports": [p for p, _ in self.output_ports], "api": self.api}

    def summary(self) -> str:
        window = f", application window {self.application_window}" if self.application_window > 1 else ""
        streams = "; ".join(f"{e.target_port} <- {e.source}{'.' + e.port if e.port else ''} "
                            f"{e.locality or e.grouping.describe()}" for e in self.edges)
        return f"operator {type(self.operator).__name__} x{self.partitions}{window} ({streams or 'no input'})"


@dataclass(frozen=True)
class PortNode(Node):
    """The records an operator emits on an output ``port``, as a stream of rows with the port's
    schema, for steps and sinks of the fluent API."""

    kind: ClassVar[str] = "port"
    port: str = ""
    edge: int = 0

    def params(self) -> dict[str, Any]:
        return {"port": self.port, "edge": self.edge}

    def summary(self) -> str:
        return f"output port {self.inputs[0]}.{self.port}"


@dataclass(frozen=True)
class SqlFunction:
    """A Python function registered for the pipeline's SQL queries (``pipeline.udf``)."""

    name: str
    fn: Callable[..., Any] = field(compare=False)
    returns: str = "string"  # a column type (headrace/schema.py)
    defined_at: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "function": function_label(self.fn), "returns": self.returns,
                "defined_at": self.defined_at}


# The shapes of an SQL query (``headrace/plan/sql_query.py`` tells them apart) and the Spark
# output mode of each; None: stateless.
STATELESS, WINDOWED, AGGREGATE, DISTINCT = "stateless", "windowed aggregate", "aggregate", "distinct"
JOINED = "join of streams"  # Spark's stream-stream join, maybe then a windowed aggregate
CHAINED_WINDOWS = "windows of windows"  # windowed aggregates of windowed aggregates
SQL_OUTPUT_MODES: dict[str, str | None] = {STATELESS: None, WINDOWED: "append", AGGREGATE: "update", DISTINCT: "append",
                                           JOINED: "append", CHAINED_WINDOWS: "append"}


@dataclass(frozen=True)
class SqlNode(Node):
    """A Spark SQL query over the plan's streams and tables (``inputs``: the steps it reads, in
    order of appearance in the query). ``shape`` is what the query is (``headrace/plan/sql_query.py``):
    ``stateless``, ``windowed aggregate``, ``windows of windows``, ``aggregate``, ``distinct`` or ``join of
    streams``."""

    kind: ClassVar[str] = "sql"
    query: str = ""
    shape: str = "stateless"
    reads: tuple[tuple[str, str], ...] = ()  # (a name in the query, the input it reads)
    each_record: bool = False  # a projection of one stream: a row for each of its records

    def params(self) -> dict[str, Any]:
        return {"query": self.query, "shape": self.shape, "reads": dict(self.reads)}

    def summary(self) -> str:
        text = " ".join(self.query.split())
        return f"SQL {self.shape}: {text if len(text) <= 72 else text[:69] + '...'}"


@dataclass(frozen=True)
class ScoreNode(Node):
    """Each record scored by the newest model version of a registry (``headrace/ml``), the version
    chosen per micro-batch and kept in the checkpoint; adds ``score``, ``prediction`` and
    ``model_version`` to the record."""

    kind: ClassVar[str] = "score"
    registry: str = ""
    features: tuple[str, ...] = ()
    prediction: str = "double"  # the Spark type of the predictions (the registry's manifest)

    def params(self) -> dict[str, Any]:
        return {"registry": self.registry, "features": list(self.features), "prediction": self.prediction}

    def summary(self) -> str:
        return f"score with the newest model in {self.registry} (features {', '.join(self.features)})"


@dataclass(frozen=True)
class EnrichNode(Node):
    """Each record's call to an outside service (``stream.enrich``, headrace/engine/enrichment.py):
    the fields the call returns are added; a record whose calls all failed goes to the dead
    letters (when the pipeline asks for this step's) or stops the pipeline."""

    kind: ClassVar[str] = "enrich"
    fn: Callable[..., Any] = field(default=None, compare=False)  # type: ignore[assignment]
    added: tuple[tuple[str, str], ...] = ()  # the fields the calls add, with their types
    calls: CallPolicy = CallPolicy()

    def params(self) -> dict[str, Any]:
        key = self.calls.cache_key
        return {"function": self.function(), "added": [list(pair) for pair in self.added],
                **dataclasses.asdict(self.calls), "cache_key": list(key) if key is not None else None}

    def function(self) -> str:
        """The function's label; a callable object (such as ``hr.HttpJson``) by its repr."""
        return function_label(self.fn) if hasattr(self.fn, "__code__") else repr(self.fn)

    def summary(self) -> str:
        return (f"enrich with {self.function()} (adds {', '.join(n for n, _ in self.added)}; "
                f"{self.calls.concurrency} calls at a time, {self.calls.retries} retries)")
