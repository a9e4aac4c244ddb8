"""Storm-style spouts, bolts and tuples, run on headrace's operator runtime (docs/topologies.md).

A bolt is an ``hr.Operator`` whose records are tuples::

    class SplitSentence(hr.Bolt):
        declare_output_fields = ("word",)              # the default stream's fields

        def process(self, tuple):
            for word in tuple["sentence"].split():
                self.emit([word], anchors=tuple)

    class WordCount(hr.Bolt):
        declare_output_fields = "word string, count long"   # typed: it can go to a sink

        def __init__(self):
            self.counts = {}                           # state, checkpointed every micro-batch

        def process(self, tuple):
            word = tuple.get_string("word")
            self.counts[word] = self.counts.get(word, 0) + 1
            self.emit([word, self.counts[word]])

A bolt task is an operator instance: it runs once per micro-batch (a streaming window) on the
tuples routed to it, and everything in its ``__dict__`` is its state. ``prepare(context)`` runs
once in a task's life (what it sets is state, like ``__init__``); ``setup``/``teardown`` run
around every micro-batch (for connections, listed in ``transient``). A spout runs on the driver:
headrace calls ``next_tuple()`` to fill each micro-batch and spools what it emits before Spark
logs the batch's offsets (headrace/connectors/spout.py), so a replay reads the same tuples.
"""

from __future__ import annotations

import datetime
import keyword
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import cloudpickle

from headrace.apex_operators import RUNTIME_ATTRIBUTE, Operator
from headrace.code_locations import function_label, user_location
from headrace.durations import to_millis
from headrace.engine.instances import FAILED_EDGE
from headrace.engine.tuple_windows import LATE, Activation, WindowBuffer, WindowConfig
from headrace.errors import PlanError, StepFunctionError
from headrace.schema import Schema, is_record_class, schema_of

DEFAULT_STREAM = "default"
TICK_COMPONENT, TICK_STREAM = "__system", "__tick"  # Storm's Constants.SYSTEM_COMPONENT_ID / SYSTEM_TICK_STREAM_ID
SEQ_FIELD, TASK_FIELD = "_hr_seq", "_hr_task"  # a spout's tuple number and task, carried beside its fields
HIDDEN_PREFIX = "_hr_"


# ---------------------------------------------------------------------------------------------
# Tuples

class Tuple:
    """A Storm tuple: ``values`` named by ``fields``, and where it comes from.

    >>> t = Tuple(["storm", 3], ("word", "count"), source_component="split", source_task=1)
    >>> t["word"], t[1], t.get_integer("count"), t.source_stream, t.is_tick()
    ('storm', 3, 3, 'default', False)
    """

    __slots__ = ("values", "fields", "source_component", "source_stream", "source_task", "_roots")

    def __init__(self, values: Iterable[Any], fields: Iterable[str], *, source_component: str = "",
                 source_stream: str = DEFAULT_STREAM, source_task: int = 0,
                 roots: frozenset[Any] = frozenset()) -> None:
        self.values = tuple(values)
        self.fields = tuple(fields)
        self.source_component = source_component
        self.source_stream = source_stream
        self.source_task = source_task
        self._roots = roots  # the spout tuples this one descends from (through anchors)

    def _describe_source(self) -> str:
        return f"{self.source_component}:{self.source_stream}"

    def value_by_field(self, field: str) -> Any:
        try:
            return self.values[self.fields.index(field)]
        except ValueError:
            raise KeyError(f"the tuple from {self._describe_source()} has no field {field!r}; its fields: "
                           f"{', '.join(self.fields) or 'none'}") from None

    def __getitem__(self, key: int | str) -> Any:
        return self.values[key] if isinstance(key, int) else self.value_by_field(key)

    def get(self, field: str, default: Any = None) -> Any:
        return self.values[self.fields.index(field)] if field in self.fields else default

    def get_value(self, key: int | str) -> Any:
        return self[key]

    def _typed(self, key: int | str, kinds: tuple[type, ...], what: str) -> Any:
        value = self[key]
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            name = key if isinstance(key, str) else self.fields[key] if key < len(self.fields) else key
            raise TypeError(f"field {name!r} of the tuple from {self._describe_source()} is {value!r} "
                            f"({type(value).__name__}), not {what}")
        return value

    def get_string(self, key: int | str) -> str:
        return str(self._typed(key, (str,), "a string"))

    def get_integer(self, key: int | str) -> int:
        return int(self._typed(key, (int,), "an integer"))

    get_long = get_integer

    def get_double(self, key: int | str) -> float:
        return float(self._typed(key, (float, int), "a number"))

    get_float = get_double

    def get_boolean(self, key: int | str) -> bool:
        return bool(self._typed(key, (bool,), "a boolean"))

    def get_binary(self, key: int | str) -> bytes:
        return bytes(self._typed(key, (bytes, bytearray), "bytes"))

    def select(self, fields: Iterable[str]) -> list[Any]:
        return [self.value_by_field(f) for f in fields]

    def contains(self, field: str) -> bool:
        return field in self.fields

    __contains__ = contains

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(self.fields, self.values, strict=True))

    _hr_as_dict = as_dict  # how an output port turns a tuple into a row (headrace/spark/operator_stage.py)

    def is_tick(self) -> bool:
        return self.source_component == TICK_COMPONENT and self.source_stream == TICK_STREAM

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tuple) and (self.values, self.fields, self.source_component, self.source_stream,
                                             self.source_task) == (other.values, other.fields, other.source_component,
                                                                   other.source_stream, other.source_task)

    def __hash__(self) -> int:
        return hash((self.fields, self.source_component, self.source_stream, self.source_task))

    def __repr__(self) -> str:
        values = ", ".join(f"{f}={v!r}" for f, v in zip(self.fields, self.values, strict=False))
        return f"Tuple({values}; from {self._describe_source()} task {self.source_task})"


def tuple_of(record: Any, component: str, stream: str) -> Tuple:
    """A record from a fluent stream, a source or an Apex operator as a tuple: its fields in
    order; a spout's row also carries its tuple number and task (hidden fields)."""
    if isinstance(record, Tuple):
        return record
    if isinstance(record, Mapping):
        values = dict(record)
    elif hasattr(record, "__dataclass_fields__"):
        values = {name: getattr(record, name) for name in record.__dataclass_fields__}
    else:
        raise TypeError(f"a bolt takes tuples, dicts or dataclass instances; {component}:{stream} sent "
                        f"{type(record).__name__} {record!r:.200}")
    seq, task = values.pop(SEQ_FIELD, None), values.pop(TASK_FIELD, None)
    roots = frozenset({(component, seq)}) if seq is not None else frozenset()
    return Tuple(values.values(), values.keys(), source_component=component, source_stream=stream,
                 source_task=int(task or 0), roots=roots)


# ---------------------------------------------------------------------------------------------
# Declared streams

@dataclass(frozen=True)
class StreamDeclaration:
    """A declared output stream: its fields (None: each tuple's own, for a late-tuple stream),
    their types when given, and whether it is direct."""

    name: str
    fields: tuple[str, ...] | None
    schema: Schema | None = None
    direct: bool = False

    def describe_fields(self) -> str:
        if self.schema is not None:
            return ", ".join(f"{n} {t}" for n, t in self.schema)
        return ", ".join(self.fields) if self.fields is not None else "the fields of each tuple"


def fields_of(spec: Any, where: str) -> tuple[tuple[str, ...], Schema | None]:
    """Field names, and types when every field has one: ``"word string, count long"``,
    ``("word", "count")``, ``["word string"]``, ``[("word", "string")]``, a dataclass."""
    if isinstance(spec, str):
        parts: list[Any] = [p.strip() for p in spec.split(",")]
    elif isinstance(spec, (list, tuple)):
        parts = list(spec)
    elif isinstance(spec, Mapping) or is_record_class(spec):
        typed = schema_of(spec, where)
        return tuple(n for n, _ in typed), typed
    else:
        raise PlanError(f"{where}: cannot read fields from {spec!r}; give names ('word', 'count'), or names with "
                        "types ('word string, count long')")
    if not parts or any(p == "" for p in parts):
        raise PlanError(f"{where}: give at least one field, e.g. ('word',) or 'word string'; got {spec!r}")
    schema: Schema | None = None
    if all(isinstance(p, str) and len(p.split()) == 1 for p in parts):
        names = tuple(parts)
    elif all((isinstance(p, str) and len(p.split()) == 2) or (isinstance(p, (list, tuple)) and len(p) == 2)
             for p in parts):
        schema = schema_of([tuple(p.split()) if isinstance(p, str) else tuple(p) for p in parts], where)
        names = tuple(n for n, _ in schema)
    else:
        raise PlanError(f"{where}: give every field a type or none: {spec!r} mixes them (write "
                        "'word string, count long' or ('word', 'count'))")
    if len(set(names)) != len(names):
        raise PlanError(f"{where}: a field name appears twice in {list(names)}")
    reserved = [n for n in names if n.startswith(HIDDEN_PREFIX)]
    if reserved:
        raise PlanError(f"{where}: field names starting with {HIDDEN_PREFIX!r} are headrace's own; rename {reserved}")
    return names, schema


def check_stream_id(stream: Any, where: str) -> str:
    if not isinstance(stream, str) or not stream.isidentifier() or keyword.iskeyword(stream) or \
            stream.startswith("__"):
        raise PlanError(f"{where}: stream id {stream!r} must be an identifier (letters, digits and _) not "
                        "starting with '__' (Storm's system streams)")
    return stream


class OutputFieldsDeclarer:
    """What ``declare_output_fields(self, declarer)`` is given (Storm's OutputFieldsDeclarer)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.streams: dict[str, StreamDeclaration] = {}

    def declare(self, fields: Any, direct: bool = False) -> None:
        """Declare the default stream."""
        self.declare_stream(DEFAULT_STREAM, fields, direct)

    def declare_stream(self, stream_id: str, fields: Any, direct: bool = False) -> None:
        check_stream_id(stream_id, self.where)
        if stream_id in self.streams:
            raise PlanError(f"{self.where}: stream {stream_id!r} is declared twice")
        if not isinstance(direct, bool):
            raise PlanError(f"{self.where}: direct must be True or False, got {direct!r}")
        names, schema = fields_of(fields, f"{self.where}, stream {stream_id!r}")
        self.streams[stream_id] = StreamDeclaration(stream_id, names, schema, direct)


def declared_streams(component: Any, where: str) -> dict[str, StreamDeclaration]:
    """A bolt's or spout's output streams, from ``declare_output_fields``: a method taking a
    declarer, or an attribute holding the default stream's fields or a dict stream -> fields."""
    declarer = OutputFieldsDeclarer(where)
    spec = getattr(component, "declare_output_fields", None)
    if callable(spec) and not is_record_class(spec):
        try:
            spec(declarer)
        except PlanError:
            raise
        except Exception as exc:
            raise PlanError(f"{where}: declare_output_fields raised {type(exc).__name__}: {exc}") from exc
    elif isinstance(spec, Mapping):
        for stream, fields in spec.items():
            declarer.declare_stream(stream, fields)
    elif spec not in (None, (), [], ""):
        declarer.declare(spec)
    return declarer.streams


# ---------------------------------------------------------------------------------------------
# Bolts

@dataclass(frozen=True)
class TopologyContext:
    """What ``prepare`` and ``open`` are told: which task of which component this is."""

    component_id: str
    task_index: int  # from 0
    parallelism: int  # the component's number of tasks
    window_id: int | None = None  # the streaming window (micro-batch) being run; None for a spout
    processing_time_ms: int | None = None


class _BoltRun:
    """What a bolt task needs while it runs one streaming window (never state)."""

    def __init__(self, bolt: Bolt, runtime: Any) -> None:
        spec = runtime.spec
        self.runtime, self.component, self.task = runtime, spec.operator, runtime.index
        self.window, self.now = spec.window_id, spec.processing_time_ms
        self.streams = declared_streams(bolt, f"bolt '{self.component}'")
        late = getattr(bolt, "_hr_window", None)
        if late is not None and late.late_stream and late.late_stream not in self.streams:
            self.streams[late.late_stream] = StreamDeclaration(late.late_stream, None)
        self.default_anchors: list[Tuple] = []  # a windowed bolt's window: what its emits are anchored to
        self.failed_roots: set[tuple[str, int]] = set()  # the spout tuples of the tuples failed in this window
        self.context = TopologyContext(self.component, self.task, spec.partitions, self.window, self.now)

    def error(self, message: str) -> StepFunctionError:
        return StepFunctionError(f"bolt '{self.component}' ({user_location()}), task {self.task}, window "
                                 f"{self.window}: {message}")

    def stream(self, stream: str, direct: bool) -> StreamDeclaration:
        declaration = self.streams.get(stream)
        if declaration is None:
            raise self.error(f"emit on stream {stream!r}, which the bolt does not declare (declared: "
                             f"{', '.join(self.streams) or 'none'}); declare it in declare_output_fields")
        if direct and not declaration.direct:
            raise self.error(f"emit_direct on stream {stream!r}, which is not declared direct; declare it with "
                             f"declarer.declare_stream({stream!r}, fields, direct=True)")
        if not direct and declaration.direct:
            raise self.error(f"stream {stream!r} is declared direct: emit on it with emit_direct(task, values)")
        return declaration

    def tuple(self, declaration: StreamDeclaration, values: Any, anchors: Any) -> Tuple:
        if isinstance(values, Tuple):  # a late tuple, passed on with its fields (or the declared ones)
            if declaration.fields is None:
                values = dict(zip(values.fields, values.values, strict=True))
                declaration = replace(declaration, fields=tuple(values))
            else:
                values = values.as_dict()
        if isinstance(values, Mapping) and declaration.fields is not None:
            missing = [f for f in declaration.fields if f not in values]
            if missing or len(values) != len(declaration.fields):
                raise self.error(f"emitted {dict(values)!r:.200} on stream {declaration.name!r}, whose fields are "
                                 f"({declaration.describe_fields()})")
            fields, values = declaration.fields, [values[f] for f in declaration.fields]
        elif isinstance(values, (list, tuple)) and declaration.fields is not None:
            fields = declaration.fields
            if len(values) != len(fields):
                raise self.error(f"emitted {len(values)} value(s) {list(values)!r:.200} on stream "
                                 f"{declaration.name!r}, which declares {len(fields)} field(s) "
                                 f"({declaration.describe_fields()})")
        else:
            raise self.error(f"emit takes a list of values (or a dict by field name), got {values!r:.200}")
        if anchors is None:
            anchored: Iterable[Tuple] = self.default_anchors
        else:
            anchored = [anchors] if isinstance(anchors, Tuple) else list(anchors)
            bad = [a for a in anchored if not isinstance(a, Tuple)]
            if bad:
                raise self.error(f"anchors must be tuples the bolt received, got {bad[0]!r:.200}")
        roots = frozenset().union(*(a._roots for a in anchored))
        return Tuple(values, fields, source_component=self.component, source_stream=declaration.name,
                     source_task=self.task, roots=roots)


class Bolt(Operator):
    """A Storm bolt: ``process(tuple)`` for every tuple it subscribed to, ``emit`` to send.

    ``declare_output_fields``: the fields of the streams it emits (see ``declared_streams``).
    ``tick_every``: a duration ("10s"): the bolt gets a tick tuple (``tuple.is_tick()``) at the end
    of each micro-batch whose processing time crossed a multiple of it.
    """

    declare_output_fields: ClassVar[Any] = ()
    tick_every: ClassVar[Any] = None

    def prepare(self, context: TopologyContext) -> None:
        """Once in a task's life, before its first tuple; what it sets is state."""

    def process(self, tuple: Tuple) -> None:
        raise NotImplementedError

    # -- what bolts call ------------------------------------------------------------------------
    def emit(self, values: Any, anchors: Tuple | Sequence[Tuple] | None = None, stream: str = DEFAULT_STREAM) -> None:
        """Emit ``values`` (a list in the order of the stream's fields, or a dict by field name) on
        ``stream``, anchored to ``anchors`` (the tuples it descends from)."""
        run = self._hr_run("emit")
        tup = run.tuple(run.stream(stream, direct=False), values, anchors)
        self._hr_send(run, stream, tup, None)

    def emit_direct(self, task: int, values: Any, anchors: Tuple | Sequence[Tuple] | None = None,
                    stream: str = DEFAULT_STREAM) -> None:
        """Emit to task ``task`` of each bolt that subscribed to ``stream`` with a direct grouping."""
        run = self._hr_run("emit_direct")
        tup = run.tuple(run.stream(stream, direct=True), values, anchors)
        self._hr_send(run, stream, tup, task)

    def ack(self, tuple: Tuple) -> None:
        """Mark ``tuple`` processed (counted; a micro-batch is acknowledged as a whole when it commits)."""
        self._hr_received(self._hr_run("ack"), tuple, "ack")
        self.__dict__["_hr_acked"] = self.__dict__.get("_hr_acked", 0) + 1

    def fail(self, tuple: Tuple) -> None:
        """Mark ``tuple`` failed: when its micro-batch commits, the spouts it descends from get
        ``fail(msg_id)`` instead of ``ack(msg_id)``; the batch itself is not replayed."""
        run = self._hr_run("fail")
        run.failed_roots.update(self._hr_received(run, tuple, "fail")._roots)
        self.__dict__["_hr_failed"] = self.__dict__.get("_hr_failed", 0) + 1

    @staticmethod
    def _hr_received(run: _BoltRun, tup: Any, doing: str) -> Tuple:
        if not isinstance(tup, Tuple):
            raise run.error(f"{doing} takes a tuple the bolt received, got {tup!r:.200}")
        return tup

    @property
    def acked(self) -> int:
        """Tuples this task acknowledged so far."""
        return int(self.__dict__.get("_hr_acked", 0))

    @property
    def failed(self) -> int:
        """Tuples this task failed so far."""
        return int(self.__dict__.get("_hr_failed", 0))

    # -- the engine's side (headrace/engine/instances.py) ------------------------------------------
    def _hr_run(self, doing: str) -> _BoltRun:
        runtime = self.__dict__.get(RUNTIME_ATTRIBUTE)
        run = getattr(runtime, "bolt", None)
        if run is None:
            raise RuntimeError(f"{type(self).__name__}.{doing} works only while the bolt runs (in process, "
                               "execute or prepare)")
        return run

    def _hr_send(self, run: _BoltRun, stream: str, tup: Tuple, task: int | None) -> None:
        try:
            run.runtime.emit(stream, tup, task)
        except ValueError as exc:
            raise run.error(str(exc)) from None

    def _hr_handlers(self) -> dict[str, Callable[[Any], None]]:
        """Input port -> handler; a bolt's ports are named ``<component>.<stream>``."""
        runtime = self.__dict__[RUNTIME_ATTRIBUTE]
        run = runtime.bolt = _BoltRun(self, runtime)
        if not self.__dict__.get("_hr_prepared"):
            self._hr_call(run, self.prepare, run.context)
            self.__dict__["_hr_prepared"] = True

        def handler(port: str) -> Callable[[Any], None]:
            component, stream = port.rsplit(".", 1)

            def receive(record: Any) -> None:
                try:
                    tup = tuple_of(record, component, stream)
                except TypeError as exc:
                    raise run.error(str(exc)) from None
                self._hr_receive(run, tup)
            return receive
        return {port: handler(port) for port in set(runtime.spec.port_of_edge.values())}

    def _hr_receive(self, run: _BoltRun, tup: Tuple) -> None:
        self._hr_call(run, self.process, tup, about=tup)

    def _hr_call(self, run: _BoltRun, method: Callable[..., Any], *args: Any, about: Any = None) -> None:
        try:
            method(*args)
        except StepFunctionError:
            raise
        except Exception as exc:
            what = f" on {about!r:.300}" if about is not None else ""
            raise StepFunctionError(
                f"bolt '{run.component}' ({function_label(getattr(method, '__func__', method))}), task {run.task}, "
                f"window {run.window}: {getattr(method, '__name__', 'a method')} raised {type(exc).__name__}: "
                f"{exc}{what}") from exc

    def _hr_after_records(self, processing_time_ms: int) -> None:
        """After a window's tuples (the engine's hook): timers, then the failed tuples' roots."""
        run = self._hr_run("end the window")
        self._hr_timers(run, processing_time_ms)
        if run.failed_roots:
            run.runtime.rows.append((FAILED_EDGE, run.task, 0, cloudpickle.dumps(sorted(run.failed_roots)), False))

    def _hr_timers(self, run: _BoltRun, processing_time_ms: int) -> None:
        """The tick tuple, when the processing time crossed a multiple of ``tick_every`` since the
        previous window (one tick, however many multiples it crossed)."""
        every = tick_millis(self)
        if every is None:
            return
        previous = self.__dict__.get("_hr_tick_time")
        self.__dict__["_hr_tick_time"] = processing_time_ms
        if previous is not None and processing_time_ms // every > previous // every:
            tick = Tuple([processing_time_ms // every * every], ("time_ms",), source_component=TICK_COMPONENT,
                         source_stream=TICK_STREAM, source_task=-1)
            self._hr_receive(run, tick)


def tick_millis(bolt: Any) -> int | None:
    every = getattr(bolt, "tick_every", None)
    if every is None:
        return None
    millis = to_millis(every, f"{type(bolt).__name__}.tick_every")
    if millis <= 0:
        raise PlanError(f"{type(bolt).__name__}.tick_every must be a positive duration such as '10s', got {every!r}")
    return millis


# ---------------------------------------------------------------------------------------------
# Windowed bolts

class TupleWindow:
    """The tuples of one window activation (Storm's TupleWindow)."""

    def __init__(self, activation: Activation) -> None:
        self._activation = activation

    def get(self) -> list[Tuple]:
        """Every tuple in the window, in arrival order."""
        return list(self._activation.tuples)

    def get_new(self) -> list[Tuple]:
        """The tuples that were not in the previous activation."""
        return list(self._activation.new)

    def get_expired(self) -> list[Tuple]:
        """The tuples that left the window since the previous activation."""
        return list(self._activation.expired)

    def get_start_timestamp(self) -> int | None:
        """The window's start in ms (duration windows), inclusive."""
        return self._activation.start

    def get_end_timestamp(self) -> int | None:
        """The window's end in ms (duration windows), exclusive."""
        return self._activation.end

    def __len__(self) -> int:
        return len(self._activation.tuples)

    def __repr__(self) -> str:
        span = f" [{self._activation.start}, {self._activation.end})" if self._activation.end is not None else ""
        return f"TupleWindow({len(self)} tuples{span})"


def _size(value: Any, what: str, where: str) -> tuple[int, bool]:
    """A window length or interval: a whole number of tuples, or a duration ('10s', a timedelta)."""
    if isinstance(value, bool) or value is None:
        raise PlanError(f"{where}: {what} must be a number of tuples (an int) or a duration ('10s'), got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise PlanError(f"{where}: {what} must be at least 1 tuple, got {value!r}")
        return value, True
    millis = to_millis(value, f"{where}: {what}")
    if millis < 1:
        raise PlanError(f"{where}: {what} must be a positive duration, got {value!r}")
    return millis, False


class BaseWindowedBolt(Bolt):
    """A bolt that gets windows of tuples: configure with ``with_window`` (and, for event time,
    ``with_timestamp_field``, ``with_lag``, ``with_late_tuple_stream``); override ``execute``.
    Its emits are anchored to the window's tuples. The buffered tuples are the task's state."""

    def execute(self, window: TupleWindow) -> None:
        raise NotImplementedError

    # -- configuration (returns the bolt, Storm's builder style) ----------------------------------
    def _configured(self, method: str) -> tuple[WindowConfig, str]:
        """The window configured so far, for a call of ``method`` after ``with_window``, and how
        messages name that call."""
        where = f"{type(self).__name__}.{method} ({user_location()})"
        config = self.__dict__.get("_hr_window")
        if config is None:
            raise PlanError(f"{where}: call with_window(...) first")
        return config, where

    def _set_window(self, config: WindowConfig) -> BaseWindowedBolt:
        self.__dict__["_hr_window"] = config
        return self

    def with_window(self, length: Any, sliding_interval: Any = None) -> BaseWindowedBolt:
        """A window of ``length`` (tuples: an int; time: '10s') activated every ``sliding_interval``
        (the same unit); tumbling when no interval is given."""
        where = f"{type(self).__name__}.with_window ({user_location()})"
        size, counts = _size(length, "the window length", where)
        every, every_counts = (size, counts) if sliding_interval is None else \
            _size(sliding_interval, "the sliding interval", where)
        if counts != every_counts:
            raise PlanError(f"{where}: the length ({length!r}) and the sliding interval ({sliding_interval!r}) must "
                            "both be counts of tuples or both durations")
        old = self.__dict__.get("_hr_window")
        extra = {} if old is None else {"timestamp_field": old.timestamp_field, "lag_ms": old.lag_ms,
                                        "late_stream": old.late_stream}
        return self._set_window(WindowConfig(size, counts, every, every_counts, **extra))

    def with_tumbling_window(self, length: Any) -> BaseWindowedBolt:
        return self.with_window(length)

    def with_timestamp_field(self, field: str) -> BaseWindowedBolt:
        """Event time: each tuple's time is this field (epoch ms or a datetime)."""
        config, where = self._configured("with_timestamp_field")
        if not isinstance(field, str) or not field:
            raise PlanError(f"{where}: the timestamp field must be a field name, got {field!r}")
        if config.length_counts:
            raise PlanError(f"{where}: event-time windows are durations; give with_window a duration such as '10s'")
        return self._set_window(replace(config, timestamp_field=field))

    def with_lag(self, lag: Any) -> BaseWindowedBolt:
        """How far behind the largest timestamp seen the watermark stays (Storm's lag)."""
        config, where = self._configured("with_lag")
        millis = to_millis(lag, f"{where}: lag")
        if millis < 0:
            raise PlanError(f"{where}: the lag must not be negative, got {lag!r}")
        return self._set_window(replace(config, lag_ms=millis))

    def with_late_tuple_stream(self, stream: str) -> BaseWindowedBolt:
        """Emit late tuples (older than the watermark when they arrive) on ``stream``."""
        config, where = self._configured("with_late_tuple_stream")
        return self._set_window(replace(config, late_stream=check_stream_id(stream, where)))

    @property
    def window_config(self) -> WindowConfig | None:
        return self.__dict__.get("_hr_window")

    # -- the engine's side: tuples go to the window, windows to execute -----------------------------
    def _hr_buffer(self) -> WindowBuffer:
        buffer = self.__dict__.get("_hr_tuples")
        if buffer is None:
            buffer = self.__dict__["_hr_tuples"] = WindowBuffer(self.__dict__["_hr_window"])
        return buffer

    def _hr_receive(self, run: _BoltRun, tup: Tuple) -> None:
        buffer = self._hr_buffer()
        config = buffer.config
        time = None
        if config.event_time:
            assert config.timestamp_field is not None
            time = _timestamp(tup, config.timestamp_field, run)
        activations = buffer.add(tup, now=run.now, time=time, stream=f"{tup.source_component}:{tup.source_stream}")
        if activations is LATE:
            if config.late_stream:
                self._hr_send(run, config.late_stream, run.tuple(run.streams[config.late_stream], tup, [tup]), None)
            return
        self._hr_execute(run, activations)

    def _hr_execute(self, run: _BoltRun, activations: list[Activation]) -> None:
        for activation in activations:
            run.default_anchors = list(activation.tuples)
            try:
                self._hr_call(run, self.execute, TupleWindow(activation))
            finally:
                run.default_anchors = []

    def _hr_timers(self, run: _BoltRun, processing_time_ms: int) -> None:
        """Move the watermark (or the processing time) and activate the windows it passed; at
        the end of a bounded input, every duration window still holding tuples."""
        buffer = self._hr_buffer()
        self._hr_execute(run, buffer.advance(processing_time_ms))
        if getattr(run.runtime, "input_ended", False):
            self._hr_execute(run, buffer.flush())

    @property
    def late_tuples(self) -> int:
        """Late tuples this task has seen (emitted on the late-tuple stream, or dropped)."""
        buffer = self.__dict__.get("_hr_tuples")
        return buffer.late if buffer is not None else 0


def _timestamp(tup: Tuple, field: str, run: _BoltRun) -> int:
    if field not in tup.fields:
        raise run.error(f"the tuple {tup!r:.200} has no timestamp field {field!r}; the window's "
                        "with_timestamp_field names a field of every tuple the bolt gets")
    value = tup.value_by_field(field)
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return int(moment.timestamp() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    raise run.error(f"the timestamp field {field!r} of {tup!r:.200} is {value!r}; it must be epoch "
                    "milliseconds or a datetime")


# ---------------------------------------------------------------------------------------------
# Spouts

class Spout:
    """A Storm spout: headrace calls ``next_tuple()`` on the driver to fill each micro-batch;
    it calls ``self.emit(values, msg_id=...)`` for each tuple (or nothing when it has none now).

    ``open(context)`` runs once in the spout's life (what it sets is state, saved with every
    batch's tuples); ``activate()`` each time it starts running (start or restart: connect
    here, and list such attributes in ``transient``); ``deactivate()`` when the pipeline stops.
    ``ack(msg_id)`` runs once the micro-batch that carried the tuple has committed;
    ``fail(msg_id)`` instead when a bolt failed a tuple anchored to it. ``bounded = True``: the
    input ends (a pipeline then runs to its end) when ``next_tuple`` emits nothing and
    ``finished()`` says so (by default the first time it emits nothing; a spout that emits
    failed tuples again returns False while some are pending). A spout declares one stream,
    with types: they are the columns of its micro-batches.
    """

    declare_output_fields: ClassVar[Any] = ()
    bounded: ClassVar[bool] = False
    transient: ClassVar[tuple[str, ...]] = ()

    def open(self, context: TopologyContext) -> None:
        """Once in the spout's life, before its first ``next_tuple``."""

    def activate(self) -> None:
        """The spout starts running (again): open connections."""

    def deactivate(self) -> None:
        """The pipeline stops."""

    def next_tuple(self) -> None:
        raise NotImplementedError

    def finished(self) -> bool:
        """A bounded spout that emitted nothing: whether its input has ended."""
        return True

    def ack(self, msg_id: Any) -> None:
        """The tuple emitted with ``msg_id`` was processed and its micro-batch committed."""

    def fail(self, msg_id: Any) -> None:
        """A bolt failed the tuple emitted with ``msg_id`` (its micro-batch committed anyway)."""

    def emit(self, values: Any, msg_id: Any = None, stream: str = DEFAULT_STREAM) -> None:
        """Emit one tuple: ``values`` in the order of the declared fields (or a dict by name)."""
        collector = self.__dict__.get(COLLECTOR_ATTRIBUTE)
        if collector is None:
            raise RuntimeError(f"{type(self).__name__}.emit works only inside next_tuple (to emit a failed tuple "
                               "again, keep it in fail() and emit it from next_tuple)")
        collector(values, msg_id, stream)


COLLECTOR_ATTRIBUTE = "_hr_collector"  # set on a spout while next_tuple runs; never state


def spout_stream(spout: Any, where: str) -> StreamDeclaration:
    """The one stream a spout declares, with types."""
    streams = declared_streams(spout, where)
    if len(streams) != 1:
        raise PlanError(f"{where}: a spout declares exactly one stream (declare_output_fields = 'word string'), "
                        f"got {len(streams)}: {', '.join(streams) or 'none'}")
    (declaration,) = streams.values()
    if declaration.schema is None:
        raise PlanError(f"{where}: a spout's fields need types, e.g. declare_output_fields = 'word string': they are "
                        f"the columns of its micro-batches (got {', '.join(declaration.fields or ())})")
    if declaration.direct:
        raise PlanError(f"{where}: a spout's stream cannot be direct (its tuples are routed by the bolts' groupings)")
    return declaration


def spout_label(spout: Any, method: str) -> str:
    fn = getattr(type(spout), method, None)
    return function_label(fn) if fn is not None else f"{type(spout).__name__}.{method}"


