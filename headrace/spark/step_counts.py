"""The records of the steps where counting costs nothing measurable, exact in every micro-batch:
a Spark observed metric (``hr_step_<step>``, ``records``) on the step's output in the streaming
query, which Spark reports with the batch's progress (``headrace/runtime/progress.py``).

An observed metric counts as rows pass, inside the tasks, with no second pass over the data, but
it is a plan node of its own, evaluated row by row without generated code: between two steps
that Spark compiles into one piece of generated code (a filter, a projection, a static join, the
partial aggregate before a shuffle) it cuts that code in two. Counted on every step, it cost YSB
14 % of its throughput (native 0.83 of hand-written PySpark instead of 0.97), and on the sources
alone still 6 % (0.91; docs/performance.md). So the steps counted are those whose output is
small or already leaves generated code: each stateful step (Spark's stateful operators are not
generated code) and each step only sinks read (the top of the query). A source's records are
Spark's count of what it read, for a pipeline with one source (``headrace/runtime/runner.py``);
with several, each source counts them in the observed metric it keeps anyway (of its dead
letters or its control rows: one more aggregate in a node that is there already), or in one of
its own when it keeps none (``headrace/spark/stateless.py``). A source's records include the
lines it sends to the dead letters, as the input rows of a single source do. A step that hands
on its input's records one for one has its input's count (``same_count_as_input``).

Control rows (watermark moves, the end-of-input flush) are not records and are not counted. Not
counted: the stateless steps between those above, static tables, sinks (a sink's records are
its input's), and what runs per micro-batch inside ``foreachBatch`` (operators and their ports,
and the steps below the query's root when the pipeline's sinks read different branches): their
rows are not in the streaming query. A step that Spark plans in several branches of the query is
counted once: Spark keeps one value per metric name.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.contract import CONTROL_COLUMN, RECORDS_FIELD, STEP_METRIC_PREFIX
from headrace.plan.graph import Plan
from headrace.plan.nodes import (
    EventTimeNode,
    KeyByNode,
    NativeStep,
    Node,
    OperatorNode,
    PortNode,
    PythonStep,
    SinkNode,
    SourceNode,
    TableNode,
)
from headrace.spark.specs import spec_of

NOT_COUNTED = (SinkNode, TableNode, OperatorNode, PortNode)


def counted(plan: Plan, node: Node) -> bool:
    """Whether the streaming query counts ``node``'s records: a stateful step, or a step only sinks read."""
    if isinstance(node, (*NOT_COUNTED, SourceNode)):
        return False
    consumers = plan.consumers(node.name)
    return spec_of(node).stateful or bool(consumers) and all(isinstance(c, SinkNode) for c in consumers)


def count_records(df: DataFrame, node: Node) -> DataFrame:
    """``df`` with its records counted under the step's metric."""
    records = (F.count(F.when(F.col(CONTROL_COLUMN).isNull(), 1)) if CONTROL_COLUMN in df.columns
               else F.count(F.lit(1)))
    return df.observe(f"{STEP_METRIC_PREFIX}{node.name}", records.alias(RECORDS_FIELD))


def same_count_as_input(plan: Plan) -> list[tuple[str, str]]:
    """(step, its input) for each step whose records are its input's, one for one: a projection
    (``select``, ``with_columns``), a Python ``map`` or key function (a function that raises stops
    the run), a ``key_by`` and the event time's declaration (late records are dropped by the
    stateful step after it). In the plan's order, so that a chain of them follows from its first
    input; a source's output is its records less its dead letters. A step the query counts keeps
    its own count (``headrace/runtime/progress.py``)."""
    pairs = []
    for node in plan.nodes.values():
        one_for_one = (isinstance(node, (EventTimeNode, KeyByNode))
                       or isinstance(node, NativeStep) and node.mode in ("select", "with_columns")
                       or isinstance(node, PythonStep) and node.mode in ("map", "key"))
        if one_for_one and len(node.inputs) == 1:
            pairs.append((node.name, node.inputs[0]))
    return pairs
