"""Run one operator instance over one streaming window: the engine behind Apex operators and
Storm bolts, free of Spark.

The Spark stage (headrace/spark/operator_stage.py) hands each instance the rows routed to it
in a micro-batch, in a fixed order, and gets back the rows it emits (each already routed to
an instance of the next operator) and its new state. Rows are tuples
``(edge, target, order, payload, flush)``: ``edge`` is the stream's id (``HEARTBEAT_EDGE``: a row
that only makes the instance run; ``STATE_EDGE``: the instance's state; ``FAILED_EDGE``: the
spout tuples a Storm bolt failed), ``payload`` a pickled record, ``flush`` marks the end of a
bounded input on that stream.
"""

from __future__ import annotations

import datetime
import decimal
import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import cloudpickle

from headrace.apex_operators import RUNTIME_ATTRIBUTE, OperatorContext, input_ports
from headrace.code_locations import function_label
from headrace.errors import StepFunctionError
from headrace.groupings import Grouping

PLAIN_TYPES = frozenset((str, int, float, bool, type(None), bytes, datetime.datetime, datetime.date, decimal.Decimal))
HEARTBEAT_EDGE = -1
STATE_EDGE = -3
FAILED_EDGE = -4  # payload: the (spout, tuple number) roots a bolt failed in the window
ORDER_BITS = 40  # an emitted row's order: its instance above these bits, its emission count below
Row = tuple[int, int, int, bytes | None, bool]


@dataclass(frozen=True)
class Route:
    """A stream leaving an output port: its edge id, grouping and the receiver's instance count."""

    edge: int
    grouping: Grouping
    instances: int


@dataclass(frozen=True)
class WindowSpec:
    """What every instance of one operator needs to run one window."""

    operator: str
    template: bytes  # the operator as the user built it, pickled: a fresh instance's state
    partitions: int
    port_of_edge: dict[int, str]  # incoming edge -> input port
    routes: dict[str, tuple[Route, ...]]  # output port -> streams leaving it
    application_window: int
    window_id: int
    processing_time_ms: int
    states: dict[int, bytes] = field(default_factory=dict)  # instance -> its state after the last window


class InstanceRuntime:
    """Collects what an instance emits in a window, routed and ordered."""

    def __init__(self, spec: WindowSpec, index: int) -> None:
        self.spec, self.index = spec, index
        self.rows: list[Row] = []
        self.sent = {r.edge: [0] * r.instances for routes in spec.routes.values() for r in routes}
        self.count = 0
        self.input_ended = False  # every input stream ended (a bounded input) in this window

    def emitter(self, port: str) -> Emitter:
        return Emitter(self, port)

    def emit(self, port: str, record: Any, task: int | None = None) -> None:
        routes = self.spec.routes.get(port, ())
        if not routes:
            return
        payload = dumps(record)
        order = (self.index << ORDER_BITS) | self.count
        self.count += 1
        for route in routes:
            if task is not None:
                if not isinstance(task, int) or not 0 <= task < route.instances:
                    raise ValueError(f"emit_direct to task {task!r}: the receiving bolt has tasks 0 to "
                                     f"{route.instances - 1}")
                targets = [task]
            else:
                targets = route.grouping.targets(record, route.instances, emitter=self.index,
                                                 sent=self.sent[route.edge])
            for target in targets:
                self.sent[route.edge][target] += 1
                self.rows.append((route.edge, target, order, payload, False))

    def flush(self) -> None:
        """The input ended: tell every instance downstream."""
        for routes in self.spec.routes.values():
            for route in routes:
                for target in range(route.instances):
                    self.rows.append((route.edge, target, (self.index << ORDER_BITS) | self.count, None, True))


@dataclass(frozen=True)
class Emitter:
    runtime: InstanceRuntime
    port: str

    def emit(self, record: Any) -> None:
        self.runtime.emit(self.port, record)

    def emit_direct(self, task: int, record: Any) -> None:
        self.runtime.emit(self.port, record, task)


def dumps(record: Any) -> bytes:
    """A record as bytes: plain data (a dict, tuple or list of plain values) with pickle's C
    pickler, about 5 times faster; anything else (instances of the user's classes) with
    cloudpickle, so classes defined in a script travel by value."""
    values = record.values() if type(record) is dict else record if type(record) in (tuple, list) else None
    if values is not None and all(type(v) in PLAIN_TYPES for v in values):
        return pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)
    return cloudpickle.dumps(record)


def restore(spec: WindowSpec, index: int) -> tuple[Any, dict[str, Any]]:
    """A fresh instance from the template with its saved state, and the engine's own flags."""
    instance = pickle.loads(spec.template)
    flags: dict[str, Any] = {"ran": False, "open": False}
    saved = spec.states.get(index)
    if saved is not None:
        attributes, flags = pickle.loads(saved)
        instance.__dict__.update(attributes)
    return instance, flags


def snapshot(instance: Any, flags: dict[str, Any]) -> bytes:
    skip = {RUNTIME_ATTRIBUTE, *getattr(instance, "transient", ())}
    attributes = {k: v for k, v in instance.__dict__.items() if k not in skip}
    return cloudpickle.dumps((attributes, flags))


def handlers_of(instance: Any) -> dict[str, Callable[[Any], None]]:
    """Input port -> the bound method its records go to (a Storm bolt gives its own)."""
    own = getattr(instance, "_hr_handlers", None)
    if own is not None:
        return dict(own())
    return {name: getattr(instance, port.handler_name(type(instance)))
            for name, port in input_ports(type(instance)).items()}


def run_window(spec: WindowSpec, index: int, rows: Iterable[tuple[int, bytes | None, bool]]) -> list[Row]:
    """Run instance ``index`` over its ``(edge, payload, flush)`` rows, already in order: what it
    emits, then its state row."""
    instance, flags = restore(spec, index)
    runtime = InstanceRuntime(spec, index)
    instance.__dict__[RUNTIME_ATTRIBUTE] = runtime
    window = spec.window_id
    context = OperatorContext(spec.operator, index, spec.partitions, window, spec.application_window,
                              spec.processing_time_ms)
    call = _caller(spec, index, runtime)
    call(instance.setup, context)
    if flags["ran"]:
        call(instance.committed, window - 1)
    if not flags["open"]:
        call(instance.begin_window, window)
        flags["open"] = True
    handlers = handlers_of(instance)
    ended = False
    for edge, payload, flush in rows:
        if edge == HEARTBEAT_EDGE:
            continue
        if flush:
            ended = True
            continue
        record = pickle.loads(payload) if payload is not None else None
        call(handlers[spec.port_of_edge[edge]], record, record=record)
    runtime.input_ended = ended
    tick = getattr(instance, "_hr_after_records", None)
    if tick is not None:
        call(tick, spec.processing_time_ms)
    if ended or (window + 1) % spec.application_window == 0:
        call(instance.end_window)
        flags["open"] = False
    call(instance.teardown)
    if ended:
        runtime.flush()
    flags["ran"] = True
    del instance.__dict__[RUNTIME_ATTRIBUTE]
    runtime.rows.append((STATE_EDGE, index, 0, snapshot(instance, flags), False))
    return runtime.rows


def run_chain(specs: list[WindowSpec], index: int, rows: Iterable[tuple[int, bytes | None, bool]],
              fused: dict[int, int]) -> list[Row]:
    """Run instance ``index`` of each operator of a thread-local chain (Apex's THREAD_LOCAL), in
    one call: ``specs[0]`` gets ``rows``; a record emitted on an edge inside the chain (``fused``:
    edge -> the position of the operator it feeds) goes straight to that operator's instance of
    the same index, in emission order. Returns the rows leaving the chain, then one state row per
    operator (its position in ``order``)."""
    inputs: dict[int, list[tuple[int, bytes | None, bool]]] = {0: list(rows)}
    out: list[Row] = []
    for position, spec in enumerate(specs):
        for edge, target, order, payload, flush in run_window(spec, index, inputs.get(position, [])):
            if edge in fused:
                if target == index:
                    inputs.setdefault(fused[edge], []).append((edge, payload, flush))
            elif edge == STATE_EDGE:
                out.append((edge, target, position, payload, flush))
            else:
                out.append((edge, target, order, payload, flush))
    return out


def _caller(spec: WindowSpec, index: int, runtime: InstanceRuntime) -> Callable[..., None]:
    def call(method: Callable[..., Any], *args: Any, record: Any = None) -> None:
        try:
            method(*args)
        except StepFunctionError:
            raise
        except Exception as exc:
            where = function_label(getattr(method, "__func__", method))
            about = f" on record {record!r:.300}" if record is not None else ""
            raise StepFunctionError(
                f"operator '{spec.operator}' ({where}), partition {index}, window {spec.window_id}: "
                f"{method.__name__} raised {type(exc).__name__}: {exc}{about}") from exc
    return call
