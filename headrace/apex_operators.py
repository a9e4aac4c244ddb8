"""Apex-style operators: ``Operator`` with input and output ports, windows and a context.

An operator is a class. Its ports are class attributes; its state is its other attributes::

    class WordCounter(hr.Operator):
        words = hr.InputPort()                          # records arrive at process_words
        counts = hr.OutputPort("word string, count long")

        def __init__(self):
            self.totals = {}                            # state: checkpointed with every window

        def process_words(self, record):
            self.totals[record["word"]] = self.totals.get(record["word"], 0) + 1

        def end_window(self):
            for word, n in sorted(self.totals.items()):
                self.counts.emit({"word": word, "count": n})

The life of an instance, once per streaming window (one micro-batch; its id is the batch id):
``setup(context)``, ``committed(window_id - 1)`` when the instance ran before, then
``begin_window(window_id)`` at the start of an application window, the handlers of each record
in a fixed order, ``end_window()`` at the end of an application window (or of a bounded
input), ``teardown()``. Everything in the instance's ``__dict__`` except the names in
``transient`` is its state, saved after every window (headrace/environment/operator_snapshots.py) and
restored before the next, so an instance is deployed afresh from its checkpoint each window:
open connections in ``setup`` and close them in ``teardown``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from headrace.schema import Schema, schema_of

RUNTIME_ATTRIBUTE = "_hr_runtime"  # set on an instance while it runs a window; never state


@dataclass(frozen=True)
class OperatorContext:
    """What ``setup`` is told: which instance this is and of which window."""

    operator: str  # the operator's name in the pipeline
    partition: int  # this instance's index, from 0
    partitions: int  # how many instances the operator has
    window_id: int  # the streaming window (micro-batch id) being run
    application_window_count: int  # streaming windows per application window
    processing_time_ms: int  # the micro-batch's time (the same when a batch is replayed)


class InputPort:
    """An input port. Its records go to the method ``handler`` (default ``process_<port>``, or
    ``process`` when the operator has one input port)."""

    def __init__(self, handler: str | None = None) -> None:
        self.handler = handler
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def handler_name(self, operator_class: type) -> str:
        if self.handler:
            return self.handler
        own = f"process_{self.name}"
        if hasattr(operator_class, own) or len(input_ports(operator_class)) > 1:
            return own
        return "process"

    def __repr__(self) -> str:
        return f"InputPort({self.name!r})"


class OutputPort:
    """An output port: ``self.<port>.emit(record)`` sends a record (a dict, a dataclass
    instance or a tuple) on every stream leaving the port. ``schema`` (DDL text, a record
    class or ``(name, type)`` pairs) is needed where the port feeds a step or a sink.
    ``unifier``: an ``hr.Unifier`` merging the instances' records of each window when the
    operator has several partitions."""

    def __init__(self, schema: Any = None, *, unifier: Any = None) -> None:
        self.schema_spec = schema
        self.unifier = unifier
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def schema(self, where: str) -> Schema | None:
        return None if self.schema_spec is None else schema_of(self.schema_spec, where)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        runtime = instance.__dict__.get(RUNTIME_ATTRIBUTE)
        if runtime is None:
            raise RuntimeError(f"output port {self.name!r} of {type(instance).__name__} can emit only while "
                               "the operator runs a window (in a handler, begin_window, end_window or committed)")
        return runtime.emitter(self.name)

    def __repr__(self) -> str:
        return f"OutputPort({self.name!r})"


class Operator:
    """Base class of Apex-style operators (see the module's docstring)."""

    transient: ClassVar[tuple[str, ...]] = ()  # attributes that are not state

    def setup(self, context: OperatorContext) -> None:
        """The instance is deployed (from its checkpoint) to run a window."""

    def begin_window(self, window_id: int) -> None:
        """An application window starts with streaming window ``window_id``."""

    def end_window(self) -> None:
        """The application window ends: emit what it computed."""

    def committed(self, window_id: int) -> None:
        """Every sink has committed window ``window_id`` (called before the next window's
        ``begin_window``; again if that window is replayed)."""

    def teardown(self) -> None:
        """The instance is done with this window."""


class Unifier(Operator):
    """Merges the records an output port's partitions emit in a window, in one instance.
    The default passes them on; override ``process`` (and ``end_window``) to combine them."""

    input = InputPort()
    output = OutputPort()

    def process(self, record: Any) -> None:
        self.output.emit(record)


def input_ports(operator_class: type) -> dict[str, InputPort]:
    return {name: value for klass in reversed(operator_class.__mro__) for name, value in vars(klass).items()
            if isinstance(value, InputPort)}


def output_ports(operator_class: type) -> dict[str, OutputPort]:
    return {name: value for klass in reversed(operator_class.__mro__) for name, value in vars(klass).items()
            if isinstance(value, OutputPort)}
