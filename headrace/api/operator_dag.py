"""The DAG builder of Apex-style operators, on a ``hr.Pipeline``.

>>> import headrace as hr
>>> class Upper(hr.Operator):
...     lines = hr.InputPort()
...     out = hr.OutputPort("line string")
...     def process(self, record):
...         self.out.emit({"line": record["line"].upper()})
>>> p = hr.Pipeline("dag_doc")
>>> lines = p.source("lines", hr.testing.TestSource([[{"line": "a"}]], schema="line string"))
>>> upper = p.add_operator("upper", Upper(), partitions=2)
>>> p.add_stream("to_upper", lines, upper.lines)
>>> upper.out.stream().sink("out", hr.sinks.Null())
>>> print(next(line.strip() for line in p.explain().splitlines() if "operator Upper" in line))
upper      operator Upper x2 (lines <- lines shuffle) <- lines

``add_operator(name, operator, partitions=, application_window=)`` adds an operator and returns
its handle, whose attributes are its ports; ``add_stream(name, source, *sinks, grouping=)``
connects an output port (or a fluent ``Stream``) to input ports; ``handle.<port>.stream()`` is an
output port as a fluent ``Stream``. An output port with a ``unifier`` on an operator with several
partitions is read through the unifier: one instance that gets every partition's records of a
window. The nodes are the plan's (``OperatorNode``, ``PortNode``); nothing here touches Spark.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from headrace.apex_operators import Operator, input_ports, output_ports
from headrace.code_locations import user_location
from headrace.errors import PlanError, step_error
from headrace.groupings import Global, Grouping, LocalOrShuffle, grouping_of
from headrace.plan.graph import Plan
from headrace.plan.nodes import Edge, Node, OperatorNode, PortNode


@dataclass(frozen=True)
class InputPortRef:
    pipeline: Any
    operator: str
    port: str


@dataclass(frozen=True)
class OutputPortRef:
    pipeline: Any
    operator: str
    port: str

    def stream(self, name: str | None = None) -> Any:
        """The records emitted on this port as a fluent stream (the port needs a schema)."""
        where = user_location()
        plan: Plan = self.pipeline.plan
        source = _through_unifier(self, where)
        node = plan.nodes[source.operator]
        assert isinstance(node, OperatorNode)
        schema = dict(node.output_ports)[source.port]
        step = self.pipeline._name(name, f"{self.operator}_{self.port}")
        if schema is None:
            raise step_error(step, where, f"output port {self.port!r} of operator {self.operator!r} has no schema; "
                                          "declare one to use it in steps and sinks, e.g. "
                                          "hr.OutputPort('word string, count long')")
        port = PortNode(step, (source.operator,), where, schema, port=source.port, edge=_next_edge(plan))
        return self.pipeline.stream_of(plan.add(port))


class OperatorHandle:
    """What ``add_operator`` returns: the operator's ports as attributes."""

    def __init__(self, pipeline: Any, name: str, operator: Any) -> None:
        self._pipeline, self.name = pipeline, name
        self._inputs, self._outputs = input_ports(type(operator)), output_ports(type(operator))

    def __getattr__(self, port: str) -> Any:
        if port.startswith("_"):
            raise AttributeError(port)
        if port in self._inputs:
            return InputPortRef(self._pipeline, self.name, port)
        if port in self._outputs:
            return OutputPortRef(self._pipeline, self.name, port)
        known = ", ".join([*self._inputs, *self._outputs]) or "none"
        raise AttributeError(f"operator {self.name!r} has no port {port!r}; its ports: {known}")

    def __repr__(self) -> str:
        return f"OperatorHandle({self.name!r})"


def add_operator(pipeline: Any, name: str, operator: Any, *, partitions: int = 1,
                 application_window: int = 1, api: str = "apex") -> OperatorHandle:
    where = user_location()
    if isinstance(operator, type):
        raise step_error(name, where, f"give an instance of the operator, e.g. {operator.__name__}(), not the class")
    if not isinstance(operator, Operator):
        raise step_error(name, where, f"expected an hr.Operator (or a Storm bolt), got {type(operator).__name__}")
    for what, value in (("partitions", partitions), ("application_window", application_window)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise step_error(name, where, f"{what} must be a whole number of at least 1, got {value!r}")
    kind = type(operator)
    if api == "apex":
        for port_name, port in input_ports(kind).items():
            handler = port.handler_name(kind)
            if not callable(getattr(operator, handler, None)):
                raise step_error(name, where, f"{kind.__name__} has input port {port_name!r} but no method "
                                              f"{handler}(self, record) to handle its records")
    ports = tuple((n, p.schema(f"step '{name}' output port {n!r}")) for n, p in output_ports(kind).items())
    pipeline.plan.add(OperatorNode(name, (), where, None, operator=operator, partitions=partitions,
                                   application_window=application_window, output_ports=ports, api=api))
    return OperatorHandle(pipeline, name, operator)


def add_stream(pipeline: Any, name: str, source: Any, *sinks: Any, grouping: Any = None,
               locality: str | None = None, many_per_port: bool = False) -> None:
    """Connect ``source`` (an output port, or a fluent stream) to the input ports ``sinks``.
    ``locality="thread_local"``: each receiving operator runs in the Python stage of the sending
    one, instance i beside instance i (same partitions; the stream must be its only input).
    A fluent stream comes as its plan node (``Pipeline.add_stream`` passes ``stream.node``)."""

    where = user_location()
    plan: Plan = pipeline.plan
    if not sinks:
        raise PlanError(f"stream {name!r} ({where}): give at least one input port to connect {name!r} to")
    if locality not in (None, "thread_local"):
        raise PlanError(f"stream {name!r} ({where}): locality must be None or 'thread_local', got {locality!r}")
    if locality is not None and grouping is not None:
        raise PlanError(f"stream {name!r} ({where}): a thread-local stream takes no grouping (instance i sends to "
                        f"instance i); drop grouping={grouping!r}")
    try:
        routing: Grouping = LocalOrShuffle() if locality else grouping_of(grouping or "shuffle",
                                                                           f"stream {name!r} ({where})")
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if isinstance(source, OutputPortRef):
        source = _through_unifier(source, where)
        origin, port = source.operator, source.port
    elif isinstance(source, Node):
        origin, port = source.name, None
    else:
        raise PlanError(f"stream {name!r} ({where}): its source must be an operator's output port or a stream, "
                        f"got {source!r}")
    for sink in sinks:
        if not isinstance(sink, InputPortRef):
            raise PlanError(f"stream {name!r} ({where}): {sink!r} is not an operator's input port")
        node = plan.nodes[sink.operator]
        assert isinstance(node, OperatorNode)
        _check_locality(plan, name, where, origin, port, node, locality)
        taken = [e for e in node.edges if e.target_port == sink.port]
        if taken and not many_per_port:
            raise PlanError(f"stream {name!r} ({where}): input port {sink.operator}.{sink.port} already takes "
                            f"stream {taken[0].stream!r}; an input port takes one stream")
        edge = Edge(_next_edge(plan), origin, port, sink.port, routing, name, locality)
        inputs = node.inputs if origin in node.inputs else (*node.inputs, origin)
        plan.replace(replace(node, inputs=inputs, edges=(*node.edges, edge)))


def _check_locality(plan: Plan, stream: str, where: str, origin: str, port: str | None, receiver: OperatorNode,
                    locality: str | None) -> None:
    """A thread-local stream joins two operators with the same partitions, and is the
    receiver's only input."""
    fused = [e for e in receiver.edges if e.locality]
    if fused:
        raise PlanError(f"stream {stream!r} ({where}): operator {receiver.name!r} runs in the stage of "
                        f"{fused[0].source!r} (thread-local stream {fused[0].stream!r}), so it takes no other stream")
    if locality is None:
        return
    sender = plan.nodes[origin]
    if port is None or not isinstance(sender, OperatorNode):
        raise PlanError(f"stream {stream!r} ({where}): a thread-local stream goes from an operator's output port "
                        f"to another operator; {origin!r} is not an operator")
    if receiver.edges:
        raise PlanError(f"stream {stream!r} ({where}): operator {receiver.name!r} already takes stream "
                        f"{receiver.edges[0].stream!r}; a thread-local stream must be its only input")
    if sender.partitions != receiver.partitions:
        raise PlanError(f"stream {stream!r} ({where}): a thread-local stream joins operators with the same "
                        f"partitions; {sender.name!r} has {sender.partitions}, {receiver.name!r} has "
                        f"{receiver.partitions}")


def _through_unifier(ref: OutputPortRef, where: str) -> OutputPortRef:
    """The port to read for ``ref``: the unifier's output when the port has a unifier and the
    operator several partitions (the unifier is added on first use)."""
    plan: Plan = ref.pipeline.plan
    node = plan.nodes[ref.operator]
    assert isinstance(node, OperatorNode)
    port = output_ports(type(node.operator)).get(ref.port)  # a Storm bolt's streams have none
    unifier = port.unifier if port is not None else None
    if unifier is None or node.partitions == 1:
        return ref
    name = f"{ref.operator}_{ref.port}_unifier"
    if name not in plan.nodes:
        ins, outs = input_ports(type(unifier)), output_ports(type(unifier))
        if not isinstance(unifier, Operator) or len(ins) != 1 or len(outs) != 1:
            raise step_error(ref.operator, node.defined_at, f"the unifier of output port {ref.port!r} must be an "
                                                            "hr.Unifier (an operator with one input port and one "
                                                            f"output port), got {unifier!r}")
        (in_port,), (out_port,) = ins, outs
        edge = Edge(_next_edge(plan), ref.operator, ref.port, in_port, Global(), f"{ref.operator}.{ref.port} unified")
        declared = outs[out_port].schema(f"step '{name}' output port {out_port!r}")
        schema = declared if declared is not None else dict(node.output_ports)[ref.port]
        plan.add(OperatorNode(name, (ref.operator,), where, None, operator=unifier, partitions=1, edges=(edge,),
                              output_ports=((out_port, schema),)))
    unified = plan.nodes[name]
    assert isinstance(unified, OperatorNode)
    return OutputPortRef(ref.pipeline, name, unified.output_ports[0][0])


def _next_edge(plan: Plan) -> int:
    ids = [e.id for n in plan.nodes.values() if isinstance(n, OperatorNode) for e in n.edges]
    ids += [n.edge for n in plan.nodes.values() if isinstance(n, PortNode)]
    return max(ids, default=-1) + 1
