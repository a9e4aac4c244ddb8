"""Keyed process functions: user code with declared per-key state and timers, free of Spark.

The user subclasses :class:`KeyedProcessFunction`, declares its state as class attributes
(``headrace/state.py``) and implements ``process(record, ctx)`` and, for timers,
``on_timer(timer, ctx)``. Event-time timers fire when the watermark reaches their time,
processing-time timers when processing time does.

This module is the public side: the function's base class, the :class:`Context` it is
handed and the :class:`Timer` that fires. The engine that runs it over a key's state and
timers is ``headrace/engine/process_logic.py``.
"""

from __future__ import annotations

import datetime
import numbers
import reprlib
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.errors import step_error
from headrace.state import State, StateUsageError

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
        from pyspark import cloudpickle  # here, not at the top: the module stays free of Spark

        cloudpickle.dumps(fn)
    except Exception as exc:
        raise step_error(step, where, f"{cls.__name__} cannot be sent to Spark's workers: {type(exc).__name__}: "
                                      f"{exc}; keep connections and files out of __init__ and open them in "
                                      "open()") from None


def _millis(value: Any, what: str) -> int:
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return int(moment.timestamp() * 1000)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise StateUsageError(f"{what} takes epoch milliseconds (int) or a datetime, got {_repr.repr(value)}")


class Engine(Protocol):
    """What a :class:`Context` needs from the engine running the function
    (``headrace.engine.process_logic.ProcessLogic``)."""

    fn: KeyedProcessFunction
    has_event_time: bool
    ended: bool  # the watermark reached the end of a bounded input
    firing: bool  # on_timer is running

    def emit(self, record: Any, timestamp: int | None) -> None: ...

    def add_timer(self, key: Any, domain: str, time: int) -> None: ...

    def delete_timer(self, key: Any, domain: str, time: int) -> None: ...


class Context:
    """What ``process`` and ``on_timer`` see: ``key``, ``timestamp`` (the record's event time
    or the timer's time, epoch ms), ``watermark`` (epoch ms, None before the first one),
    ``processing_time`` (epoch ms), ``emit(record, timestamp=None)`` and the timer calls."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.key: Any = None
        self.timestamp: int | None = None
        self.watermark: int | None = None
        self.processing_time: int = 0

    def emit(self, record: Any, timestamp: Any = None) -> None:
        """Send one output record: a dict (or dataclass instance) with the declared output fields.
        On a stream with event time the record's event time is ``timestamp`` (epoch ms or a
        datetime), by default ``ctx.timestamp`` (the record's, or the timer's time): a later
        window or process step reads it (docs/process.md)."""
        self._engine.emit(record, None if timestamp is None else _millis(timestamp, "emit(timestamp=...)"))

    def register_event_time_timer(self, time: Any) -> None:
        """Call ``on_timer`` when the watermark reaches ``time`` (epoch ms or a datetime)."""
        self._register(EVENT_TIME, time, "register_event_time_timer")

    def register_processing_time_timer(self, time: Any) -> None:
        """Call ``on_timer`` once processing time reaches ``time`` (epoch ms or a datetime)."""
        self._register(PROCESSING_TIME, time, "register_processing_time_timer")

    def delete_event_time_timer(self, time: Any) -> None:
        self._engine.delete_timer(self.key, EVENT_TIME, _millis(time, "delete_event_time_timer"))

    def delete_processing_time_timer(self, time: Any) -> None:
        self._engine.delete_timer(self.key, PROCESSING_TIME, _millis(time, "delete_processing_time_timer"))

    def _register(self, domain: str, when: Any, call: str) -> None:
        engine = self._engine
        if not overrides_on_timer(engine.fn):
            raise StateUsageError(f"{type(engine.fn).__name__} registers a timer but does not define "
                                  "on_timer(timer, ctx), which a firing timer calls")
        if domain == EVENT_TIME:
            if not engine.has_event_time:
                raise StateUsageError("an event-time timer needs event time, and this stream has none: declare it "
                                      "with .with_event_time('field', max_out_of_orderness) before key_by, or use "
                                      "a processing-time timer")
            if engine.ended and engine.firing:
                return  # the input has ended: the timers that fire at its end register none that would fire
        # A timer at or behind its clock fires at once, after the record being handled (as in Flink).
        engine.add_timer(self.key, domain, _millis(when, call))
