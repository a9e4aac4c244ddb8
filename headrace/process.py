"""Keyed process functions: user code with declared per-key state and timers, free of Spark.

The user subclasses :class:`KeyedProcessFunction`, declares its state as class attributes
(``headrace/state.py``) and implements ``process(record, ctx)`` and, for timers,
``on_timer(timer, ctx)``. :class:`ProcessLogic` runs it over one operator instance's
:class:`ProcessState` (every key of the instance, pickled in one cell by the Spark driver in
``headrace/spark/process.py``): due timers first, then the micro-batch's records in
arrival order. Event-time timers fire when the watermark reaches their time, processing-time
timers when processing time does.
"""

from __future__ import annotations

import dataclasses
import datetime
import heapq
import numbers
import reprlib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from headrace.errors import StepFunctionError
from headrace.state import NEVER, Cells, KeyScope, State, StateUsageError, sweep

EVENT_TIME = "event_time"
PROCESSING_TIME = "processing_time"

_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother = 80, 80


@dataclass(frozen=True)
class Timer:
    """A timer that fired: its ``time`` (epoch ms) and ``domain`` (event_time or processing_time)."""

    time: int
    domain: str

    @property
    def datetime(self) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(self.time / 1000, tz=datetime.UTC)


class KeyedProcessFunction:
    """Per-key user code. Declare state as class attributes (``hr.ValueState``,
    ``hr.ListState``, ``hr.MapState``); implement ``process(record, ctx)`` and, if the function
    registers timers, ``on_timer(timer, ctx)``. ``open()`` runs once per operator instance
    before its first record. Instance attributes set in ``__init__`` or ``open`` are
    configuration: setting one while records flow is an error, since it would be shared by
    every key and lost on restart."""

    def open(self) -> None:
        """Called once per operator instance before the first record or timer."""

    def process(self, record: dict[str, Any], ctx: Context) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process(record, ctx)")

    def on_timer(self, timer: Timer, ctx: Context) -> None:
        """Called for each timer that fires."""

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_hr_scope") is not None and not isinstance(getattr(type(self), name, None), State):
            cls = type(self).__name__
            raise StateUsageError(
                f"{cls} set self.{name} while handling a record or timer, but {name!r} is not declared state: an "
                f"instance attribute is shared by every key and lost on restart; declare it as a class attribute, "
                f"e.g. `{name} = hr.ValueState()`, and write it with self.{name}.set(...)")
        object.__setattr__(self, name, value)


def declared_state(cls: type) -> dict[str, State]:
    """The state a process function class declares, by name."""
    found: dict[str, State] = {}
    for klass in reversed(cls.__mro__):
        found.update({n: v for n, v in vars(klass).items() if isinstance(v, State)})
    return found


def overrides_on_timer(fn: KeyedProcessFunction) -> bool:
    return type(fn).on_timer is not KeyedProcessFunction.on_timer


def check_process_function(fn: Any, step: str, where: str) -> None:
    """Refuse, as the pipeline is built, a process function that cannot run."""
    from headrace.plan.graph import step_error

    if isinstance(fn, type):
        raise step_error(step, where, f"process needs an instance of the function class: {fn.__name__}(), not the "
                                      "class itself")
    if not isinstance(fn, KeyedProcessFunction):
        raise step_error(step, where, f"process needs an instance of a hr.KeyedProcessFunction subclass, got "
                                      f"{_repr.repr(fn)}; for a function of one window's records use "
                                      "window(...).process(fn)")
    cls = type(fn)
    if cls.process is KeyedProcessFunction.process:
        raise step_error(step, where, f"{cls.__name__} does not implement process(record, ctx)")
    misplaced = [n for n, v in vars(fn).items() if isinstance(v, State)]
    if misplaced:
        raise step_error(step, where, f"{cls.__name__} declares state {', '.join(map(repr, misplaced))} on the "
                                      "instance; declare state as class attributes, e.g. `class "
                                      f"{cls.__name__}(hr.KeyedProcessFunction): {misplaced[0]} = hr.ValueState()`")
    try:
        from pyspark import cloudpickle

        cloudpickle.dumps(fn)
    except Exception as exc:
        raise step_error(step, where, f"{cls.__name__} cannot be sent to Spark's workers: {type(exc).__name__}: "
                                      f"{exc}; keep connections and files out of __init__ and open them in "
                                      "open()") from None


@dataclass
class ProcessState:
    """Everything one operator instance keeps: per-key state cells and timers."""

    cells: dict[Any, Cells] = field(default_factory=dict)
    timers: dict[Any, set[tuple[str, int]]] = field(default_factory=dict)  # key -> {(domain, time)}
    heaps: dict[str, list[tuple[int, int, Any]]] = field(
        default_factory=lambda: {EVENT_TIME: [], PROCESSING_TIME: []})   # (time, sequence, key)
    sequence: int = 0
    next_expiry: float = NEVER
    clock: int = 0                                                       # the test clock


def _millis(value: Any, what: str) -> int:
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return int(moment.timestamp() * 1000)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise StateUsageError(f"{what} takes epoch milliseconds (int) or a datetime, got {_repr.repr(value)}")


_ACCEPTS: dict[str, tuple[type, ...]] = {
    "string": (str,), "long": (numbers.Integral,), "int": (numbers.Integral,), "double": (numbers.Real,),
    "float": (numbers.Real,), "boolean": (bool,), "timestamp": (datetime.datetime,), "date": (datetime.date,),
    "binary": (bytes, bytearray),
}


class Context:
    """What ``process`` and ``on_timer`` see: ``key``, ``timestamp`` (the record's event time
    or the timer's time, epoch ms), ``watermark`` (epoch ms, None before the first one),
    ``processing_time`` (epoch ms), ``emit(record)`` and the timer calls."""

    def __init__(self, logic: ProcessLogic) -> None:
        self._logic = logic
        self.key: Any = None
        self.timestamp: int | None = None
        self.watermark: int | None = None
        self.processing_time: int = 0
        self._state: ProcessState | None = None

    def emit(self, record: Any) -> None:
        """Send one output record: a dict (or dataclass instance) with the declared output fields."""
        self._logic.out.append(self._logic.check_output(record))

    def register_event_time_timer(self, time: Any) -> None:
        """Call ``on_timer`` when the watermark reaches ``time`` (epoch ms or a datetime)."""
        self._register(EVENT_TIME, time, "register_event_time_timer")

    def register_processing_time_timer(self, time: Any) -> None:
        """Call ``on_timer`` once processing time reaches ``time`` (epoch ms or a datetime)."""
        self._register(PROCESSING_TIME, time, "register_processing_time_timer")

    def delete_event_time_timer(self, time: Any) -> None:
        self._delete(EVENT_TIME, _millis(time, "delete_event_time_timer"))

    def delete_processing_time_timer(self, time: Any) -> None:
        self._delete(PROCESSING_TIME, _millis(time, "delete_processing_time_timer"))

    def _register(self, domain: str, when: Any, call: str) -> None:
        logic, state = self._logic, self._state
        assert state is not None
        if not overrides_on_timer(logic.fn):
            raise StateUsageError(f"{type(logic.fn).__name__} registers a timer but does not define "
                                  "on_timer(timer, ctx), which a firing timer calls")
        if domain == EVENT_TIME:
            if not logic.has_event_time:
                raise StateUsageError("an event-time timer needs event time, and this stream has none: declare it "
                                      "with .with_event_time('field', max_out_of_orderness) before key_by, or use "
                                      "a processing-time timer")
            if logic.ended:
                return  # the input has ended: no watermark will come to fire it
        # A timer at or behind its clock fires at once, after the record being handled (as in Flink).
        time = _millis(when, call)
        timers = state.timers.setdefault(self.key, set())
        if (domain, time) not in timers:
            timers.add((domain, time))
            state.sequence += 1
            heapq.heappush(state.heaps[domain], (time, state.sequence, self.key))

    def _delete(self, domain: str, time: int) -> None:
        assert self._state is not None
        timers = self._state.timers.get(self.key)
        if timers is not None:
            timers.discard((domain, time))  # its heap entry is skipped when it comes up
            if not timers:
                del self._state.timers[self.key]


class ProcessLogic:
    """Runs a keyed process function over one instance's state."""

    def __init__(self, step: str, fn: KeyedProcessFunction, output: tuple[tuple[str, str], ...],
                 has_event_time: bool, label: str) -> None:
        self.step, self.fn, self.output, self.label = step, fn, output, label
        self.fields = [name for name, _ in output]
        self.field_set = set(self.fields)
        self.has_event_time = has_event_time
        self.ctx = Context(self)
        self.out: list[tuple[Any, ...]] = []
        self.ended = False  # the watermark reached the end of a bounded input
        self.opened = False

    def open(self) -> None:
        if not self.opened:
            self._guard(lambda: self.fn.open(), "open", None, None)
            self.opened = True

    def run(self, state: ProcessState, records: Iterable[tuple[Any, int | None, dict[str, Any]]],
            watermark: int | None, now: int, ended: bool = False) -> list[tuple[Any, ...]]:
        """Fire the due timers, then handle ``records`` (key, event time, record); returns the
        output rows, in the order of the output schema."""
        self.open()
        self.out = []
        ctx = self.ctx
        ctx._state, ctx.watermark, ctx.processing_time = state, watermark, now
        self.ended = ended
        if now >= state.next_expiry:
            self._sweep(state, now)
        self._fire_due(state, watermark, now)
        process = self.fn.process
        for key, timestamp, record in records:
            ctx.key, ctx.timestamp = key, timestamp
            self._call(state, key, lambda record=record: process(record, ctx), "process", record)
            self._fire_due(state, watermark, now)  # timers the record registered at or behind the clocks
        return self.out

    def next_timer(self, state: ProcessState, domain: str) -> int | None:
        """The time of the instance's earliest pending timer of ``domain``."""
        heap = state.heaps[domain]
        while heap:
            time, _, key = heap[0]
            if (domain, time) in state.timers.get(key, ()):
                return time
            heapq.heappop(heap)  # deleted or already fired
        return None

    def _fire_due(self, state: ProcessState, watermark: int | None, now: int) -> None:
        for domain, clock in ((PROCESSING_TIME, now), (EVENT_TIME, watermark)):
            if clock is None:
                continue
            heap = state.heaps[domain]
            while heap and heap[0][0] <= clock:
                time, _, key = heapq.heappop(heap)
                timers = state.timers.get(key)
                if timers is None or (domain, time) not in timers:
                    continue  # deleted
                timers.discard((domain, time))
                if not timers:
                    del state.timers[key]
                timer = Timer(time, domain)
                self.ctx.key, self.ctx.timestamp = key, time
                self._call(state, key, lambda timer=timer: self.fn.on_timer(timer, self.ctx), "on_timer", timer)

    def _call(self, state: ProcessState, key: Any, call: Any, method: str, subject: Any) -> None:
        cells = state.cells.get(key)
        if cells is None:
            cells = state.cells[key] = {}
        self.fn.__dict__["_hr_scope"] = KeyScope(cells, self.ctx.processing_time, state)
        try:
            self._guard(call, method, key, subject)
        finally:
            self.fn.__dict__["_hr_scope"] = None
            if not cells:
                del state.cells[key]

    def _guard(self, call: Any, method: str, key: Any, subject: Any) -> None:
        try:
            call()
        except StepFunctionError:
            raise
        except StateUsageError as exc:
            raise StepFunctionError(f"step '{self.step}' ({self._where(method)}): {exc}{self._about(key, subject)}"
                                    ) from exc
        except Exception as exc:
            raise StepFunctionError(f"step '{self.step}' ({self._where(method)}) raised {type(exc).__name__}: "
                                    f"{exc}{self._about(key, subject)}") from exc

    def _where(self, method: str) -> str:
        return self.label if method == "process" else f"{type(self.fn).__name__}.{method}"

    @staticmethod
    def _about(key: Any, subject: Any) -> str:
        if subject is None:
            return ""
        what = "timer" if isinstance(subject, Timer) else "record"
        return f" (key: {_repr.repr(key)}, {what}: {_repr.repr(subject)})"

    def _sweep(self, state: ProcessState, now: int) -> None:
        upcoming = NEVER
        for key in list(state.cells):
            cells = state.cells[key]
            upcoming = min(upcoming, sweep(cells, now))
            if not cells:
                del state.cells[key]
        state.next_expiry = upcoming

    def check_output(self, record: Any) -> tuple[Any, ...]:
        """The record as a row of the output schema, or a StateUsageError saying why it does not fit."""
        if dataclasses.is_dataclass(record) and not isinstance(record, type):
            record = dataclasses.asdict(record)
        if not isinstance(record, Mapping):
            raise StateUsageError(f"emitted {type(record).__name__} {_repr.repr(record)}; emit a dict or a "
                                  f"dataclass instance with the output fields {', '.join(self.fields)}")
        if record.keys() != self.field_set:
            missing = [f for f in self.fields if f not in record]
            extra = [f for f in record if f not in self.field_set]
            problems = ([f"missing {', '.join(map(repr, missing))}"] if missing else []) + (
                [f"unexpected {', '.join(map(repr, extra))}"] if extra else [])
            raise StateUsageError(f"emitted {_repr.repr(dict(record))}, which does not fit the output schema "
                                  f"({self._schema_text()}): {'; '.join(problems)}")
        row = []
        for name, type_name in self.output:
            value = record[name]
            accepted = _ACCEPTS.get(type_name, (object,))
            if value is not None and (not isinstance(value, accepted) or (
                    isinstance(value, bool) and type_name not in ("boolean",))
                    or (type_name == "date" and isinstance(value, datetime.datetime))):
                raise StateUsageError(f"emitted field {name!r} = {_repr.repr(value)} ({type(value).__name__}), "
                                      f"which does not fit its declared type {type_name} "
                                      f"(record: {_repr.repr(dict(record))})")
            if type_name in ("double", "float") and value is not None and not isinstance(value, float):
                value = float(typing.cast(numbers.Real, value))
            row.append(value)
        return tuple(row)

    def _schema_text(self) -> str:
        return ", ".join(f"{n} {t}" for n, t in self.output)


def to_watermark(raw: int, end_of_input: int) -> tuple[int | None, bool]:
    """Spark's watermark (ms; 0 or less before the first) as (watermark or None, input ended)."""
    if raw >= end_of_input:
        return raw, True
    return (raw if raw > 0 else None), False

