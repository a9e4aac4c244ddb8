"""The plan: an ordered set of nodes joined by name, validated as it grows."""

from __future__ import annotations

import json
from typing import Any

from headrace.code_locations import remember_definitions
from headrace.contract import Guarantee
from headrace.errors import PlanError, step_error
from headrace.plan.nodes import (
    LateRecordsNode,
    Node,
    OperatorNode,
    SinkNode,
    SourceNode,
    SqlFunction,
    TableNode,
)


class Plan:
    """Nodes in the order they were added (inputs always come first)."""

    def __init__(self, name: str, guarantee: Guarantee | None = None, trigger: str = "micro-batch") -> None:
        self.name = name
        self.requested_guarantee = guarantee
        self.trigger = trigger  # "micro-batch" or "real-time" (headrace/spark/real_time.py)
        self.batch_duration: Any = None  # adaptive admission's target (headrace/environment/admission.py)
        self.nodes: dict[str, Node] = {}
        self.functions: dict[str, SqlFunction] = {}  # Python functions the SQL queries may call

    def add(self, node: Node) -> Node:
        if node.name in self.nodes:
            first = self.nodes[node.name]
            raise step_error(node.name, node.defined_at,
                             f"the name is already used by the {first.kind} step defined at {first.defined_at}; "
                             "every step needs a unique name (it identifies the step's state)")
        for input_name in node.inputs:
            if input_name not in self.nodes:
                raise step_error(node.name, node.defined_at, f"input {input_name!r} is not in pipeline {self.name!r}")
        remember_definitions(node)  # user code is named by its file in Spark's workers too
        self.nodes[node.name] = node
        return node

    def replace(self, node: Node) -> Node:
        """Replace the node of the same name (an operator given a new input stream), keeping the
        nodes in an order where inputs come first; a stream that would close a cycle is refused."""
        for input_name in node.inputs:
            if input_name not in self.nodes:
                raise step_error(node.name, node.defined_at, f"input {input_name!r} is not in pipeline {self.name!r}")
        remember_definitions(node)
        nodes = {**self.nodes, node.name: node}
        ordered: dict[str, Node] = {}
        visiting: list[str] = []

        def place(name: str) -> None:
            if name in ordered:
                return
            if name in visiting:
                cycle = " -> ".join([*visiting[visiting.index(name):], name])
                raise step_error(node.name, node.defined_at, f"this stream would close a cycle ({cycle}); "
                                                             "a pipeline is a directed acyclic graph")
            visiting.append(name)
            for input_name in nodes[name].inputs:
                place(input_name)
            visiting.pop()
            ordered[name] = nodes[name]
        for name in nodes:
            place(name)
        self.nodes = ordered
        return node

    def consumers(self, name: str) -> list[Node]:
        return [n for n in self.nodes.values() if name in n.inputs]

    def late_output_asked(self, name: str) -> bool:
        """Whether some step reads the late side output of step ``name`` (``late_records()``)."""
        return any(isinstance(n, LateRecordsNode) for n in self.consumers(name))

    def sources(self) -> list[SourceNode]:
        return [n for n in self.nodes.values() if isinstance(n, SourceNode)]

    def sinks(self) -> list[SinkNode]:
        return [n for n in self.nodes.values() if isinstance(n, SinkNode)]

    def spark_packages(self) -> list[Any]:
        """The Spark packages (``headrace.environment.jars.Package``) the connectors need."""
        nodes: list[Any] = [*self.sources(), *self.sinks()]
        return [package for node in nodes for package in node.connector.spark_packages()]

    def upstream(self, name: str) -> set[str]:
        """Every node that feeds ``name``, directly or not."""
        seen: set[str] = set()
        todo = list(self.nodes[name].inputs)
        while todo:
            current = todo.pop()
            if current not in seen:
                seen.add(current)
                todo.extend(self.nodes[current].inputs)
        return seen

    def guarantee(self) -> tuple[Guarantee, list[str]]:
        """The pipeline's guarantee (its weakest connector) and why."""
        connectors = [(n.name, n.connector) for n in self.sources()] + [(n.name, n.connector) for n in self.sinks()]
        parts = [(name, connector.guarantee) for name, connector in connectors]
        weakest = Guarantee.weakest([g for _, g in parts])
        return weakest, [f"{name}: {g.value}" for name, g in parts]

    def validate(self) -> None:
        """Whole-pipeline checks; single steps are checked as they are added."""
        if not self.sources():
            raise PlanError(f"pipeline {self.name!r} has no source; add one with pipeline.source(...)")
        if not self.sinks():
            raise PlanError(f"pipeline {self.name!r} has no sink; send a stream somewhere with stream.sink(...)")
        for node in self.nodes.values():
            if isinstance(node, (SinkNode, TableNode, OperatorNode)) or self.consumers(node.name):
                continue
            raise step_error(node.name, node.defined_at,
                             "this stream goes nowhere: send it to a sink with .sink(...) or remove the step")
        wanted = self.requested_guarantee
        if wanted is not None:
            actual, _ = self.guarantee()
            if actual.rank > wanted.rank:
                ends: list[SourceNode | SinkNode] = [*self.sources(), *self.sinks()]
                weak = [f"{n.kind} {n.name!r} ({type(n.connector).__name__} at {n.defined_at}) is "
                        f"{n.connector.guarantee.value}" for n in ends if n.connector.guarantee.rank > wanted.rank]
                raise PlanError(f"pipeline {self.name!r} asks for {wanted.value} but can only give "
                                f"{actual.value}: {', '.join(weak)}; use connectors that give "
                                f"{wanted.value} or ask for less")

    def to_json(self) -> dict[str, Any]:
        guarantee, parts = self.guarantee()
        return {"pipeline": self.name, "guarantee": guarantee.value, "guarantee_by_connector": parts,
                "trigger": self.trigger, "nodes": [n.to_json() for n in self.nodes.values()],
                **({"functions": [f.to_json() for f in self.functions.values()]} if self.functions else {})}

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), indent=2, default=str)
