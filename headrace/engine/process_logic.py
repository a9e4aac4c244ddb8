"""The keyed process step's engine, free of Spark: runs a ``hr.KeyedProcessFunction``
(``headrace/process.py``) over one operator instance's :class:`ProcessState`.

A :class:`ProcessState` holds the state cells and timers of the keys it covers (one key's,
pickled under that key by the Spark driver in ``headrace/spark/process_lowering.py``).
:class:`ProcessLogic` fires the due timers first, then hands the function the micro-batch's
records in arrival order, each with the key's state in scope (``state_cells.KeyScope``).
"""

from __future__ import annotations

import dataclasses
import datetime
import heapq
import math
import numbers
import reprlib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from headrace.engine.state_cells import Cells, KeyScope, sweep
from headrace.errors import StepFunctionError
from headrace.process import EVENT_TIME, PROCESSING_TIME, Context, KeyedProcessFunction, Timer
from headrace.state import NEVER, StateUsageError

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother = 80, 80


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


_ACCEPTS: dict[str, tuple[type, ...]] = {
    "string": (str,), "long": (numbers.Integral,), "int": (numbers.Integral,), "double": (numbers.Real,),
    "float": (numbers.Real,), "boolean": (bool,), "timestamp": (datetime.datetime,), "date": (datetime.date,),
    "binary": (bytes, bytearray),
}


class ProcessLogic:
    """Runs a keyed process function over one instance's state."""

    def __init__(self, step: str, fn: KeyedProcessFunction, output: tuple[tuple[str, str], ...],
                 has_event_time: bool, label: str, timed: bool = False) -> None:
        self.step, self.fn, self.output, self.label = step, fn, output, label
        self.timed = timed  # each output row ends with its event time (a UTC datetime)
        self.fields = [name for name, _ in output]
        self.field_set = set(self.fields)
        self.has_event_time = has_event_time
        self.ctx = Context(self)
        self.out: list[tuple[Any, ...]] = []
        self.ended = False  # the watermark reached the end of a bounded input
        self.firing = False  # on_timer is running
        self.opened = False
        self.state: ProcessState | None = None  # the instance being run

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
        self.state, ctx.watermark, ctx.processing_time = state, watermark, now
        self.ended = ended
        if now >= state.next_expiry:
            self._sweep(state, now)
        if not ended:  # at the end, the last records (an earlier step's, released by the end) come first
            self._fire_due(state, watermark, now)
        process = self.fn.process
        if getattr(self.fn, "records_in_event_time_order", False):  # stable: arrival order within a time
            records = sorted(records, key=lambda entry: (entry[1] is not None, entry[1] or 0))
        for key, timestamp, record in records:
            ctx.key, ctx.timestamp = key, timestamp
            self._call(state, key, lambda record=record: process(record, ctx), "process", record)
            if not ended:
                self._fire_due(state, watermark, now)  # timers the record registered at or behind the clocks
        if ended:  # then every timer, those the records registered too
            self._fire_due(state, watermark, now)
        return self.out

    # -- what the Context calls (headrace.process.Engine) -----------------------------------------
    def emit(self, record: Any, timestamp: int | None = None) -> None:
        row = self.check_output(record)
        if self.timed:
            when = self.ctx.timestamp if timestamp is None else timestamp
            row = (*row, None if when is None else EPOCH + datetime.timedelta(milliseconds=when))
        self.out.append(row)

    def add_timer(self, key: Any, domain: str, time: int) -> None:
        state = self.state
        assert state is not None
        timers = state.timers.setdefault(key, set())
        if (domain, time) not in timers:
            timers.add((domain, time))
            state.sequence += 1
            heapq.heappush(state.heaps[domain], (time, state.sequence, key))

    def delete_timer(self, key: Any, domain: str, time: int) -> None:
        assert self.state is not None
        timers = self.state.timers.get(key)
        if timers is not None:
            timers.discard((domain, time))  # its heap entry is skipped when it comes up
            if not timers:
                del self.state.timers[key]

    # -- the engine --------------------------------------------------------------------------------
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
        # once the input has ended the watermark is past every time: a timer a record registers then fires too
        for domain, clock in ((PROCESSING_TIME, now), (EVENT_TIME, math.inf if self.ended else watermark)):
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
                self.firing = True
                try:
                    self._call(state, key, lambda timer=timer: self.fn.on_timer(timer, self.ctx), "on_timer", timer)
                finally:
                    self.firing = False

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

