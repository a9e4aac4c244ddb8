"""What the local runner cannot run, refused before it runs anything, naming the step and
saying what to do."""

from __future__ import annotations

from headrace.connectors.null_sink import Null
from headrace.connectors.scripted import TestSink, TestSource
from headrace.errors import PlanError
from headrace.plan.graph import Plan
from headrace.plan.nodes import NativeStep, Node, SinkNode, SourceNode, TableNode
from headrace.testing.local.expressions import refusal
from headrace.testing.local.operators import OPERATORS

ON_SPARK = "run it on Spark with headrace.testing.run_to_completion"

_WHY = {
    "sql": "an SQL step needs Spark SQL",
    "operator": "Apex operators and Storm bolts run on headrace's operator runtime on Spark",
    "port": "Apex operators and Storm bolts run on headrace's operator runtime on Spark",
    "enrich": "an enrich step calls outside services on Spark's executors",
    "score": "a score step loads models on Spark",
    "dead_letters": "dead letters come from sources that parse records and from enrich steps",
}


def refuse(plan: Plan) -> None:
    """Raise a PlanError for the first step the local runner cannot run."""
    for node in plan.nodes.values():
        why = _why(node)
        if why is not None:
            raise PlanError(f"step '{node.name}' ({node.defined_at}): the local runner cannot run it: {why}; "
                            f"{ON_SPARK}")


def _why(node: Node) -> str | None:
    if isinstance(node, SourceNode) and not isinstance(node.connector, TestSource):
        return (f"it reads {type(node.connector).__name__}, and the local runner reads only "
                "headrace.testing.TestSource")
    if isinstance(node, SinkNode) and not isinstance(node.connector, (TestSink, Null)):
        return (f"it writes to {type(node.connector).__name__}, and the local runner writes only to "
                "headrace.testing.TestSink and the null sink")
    if isinstance(node, TableNode) and node.rows is None:
        return f"the table is read from the file {node.path}; give its rows=[...] instead"
    if isinstance(node, NativeStep):
        for _, e in node.exprs:
            why = refusal(e)
            if why is not None:
                return why
    if type(node) not in OPERATORS:
        return _WHY.get(node.kind, f"it has no local operator for {node.kind} steps")
    return None
