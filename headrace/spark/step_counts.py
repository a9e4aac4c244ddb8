"""The records of every step, exact in every micro-batch, counted where it costs nothing measurable.

* A stateful step: a Spark observed metric (``hr_step_<step>``, ``records``) on its output in the
  streaming query, which Spark reports with the batch's progress (``headrace/runtime/progress.py``).
  An observed metric counts as rows pass, inside the tasks, with no second pass over the data,
  but it is a plan node of its own, evaluated row by row without generated code: between two
  steps that Spark compiles into one piece of generated code (a filter, a projection, a static
  join, the partial aggregate before a shuffle) it cuts that code in two. Counted on every step,
  it cost YSB 14 % of its throughput (native 0.83 of hand-written PySpark instead of 0.97), and
  on the sources alone still 6 % (0.91; docs/performance.md). A stateful operator's output
  leaves generated code anyway.
* A source: Spark's count of what it read, for a pipeline with one source
  (``headrace/runtime/runner.py``); with several, each source counts its records in the observed
  metric it keeps anyway (of its dead letters or its control rows: one more aggregate in a node
  that is there already), or in one of its own when it keeps none (``headrace/spark/stateless.py``).
  A source's records include the lines it sends to the dead letters, as the input rows of a
  single source do. A pipeline's one source, read once, counts its dead letters as its input
  rows less a marker's count of its good rows (below), with no observed metric on its rows.
* A step that hands on its input's records one for one: its input's count (``same_count_as_input``).

* The other stateless steps (a filter, a flat map, a join with a table, a union, an SQL step that
  does more than project its one stream, a fused Python stage that changes the number of records),
  in the query or lowered per micro-batch inside ``foreachBatch`` below the query's root, are
  counted from Spark's own SQL metrics: each is *marked* by a filter that keeps every row
  (``spark_partition_id() > -<mark>``, which Catalyst neither merges with another filter nor
  pushes down, being non-deterministic) and stays in the generated code, and the marker's "number
  of output rows" is the step's output, read after the batch
  (``headrace/spark/marked_counts.py``). A marked step whose rows carry control rows has them
  taken off: those of every source, times the paths by which each reaches the step, when all of
  the pipeline's sources reach it by as many paths (otherwise it is not counted). A step inside a
  fused Python stage has its count from the stage's next step when that one hands on its records
  one for one (``same_count_as_output``).

Control rows (watermark moves, the end-of-input flush) are not records and are not counted. Not
counted: static tables, sinks (a sink's records are its input's), a Python filter or flat map
fused with a later one that also changes the number of records, and operators with their ports
(Python, per micro-batch). A step that Spark plans in several branches of the query is counted
once: Spark keeps one value per metric name, and each copy of a marker sees the same rows.
"""

from __future__ import annotations

from collections import Counter

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
    SqlNode,
    TableNode,
)
from headrace.spark.marked_counts import marker
from headrace.spark.specs import python_chains, spec_of

NOT_COUNTED = (SinkNode, TableNode, OperatorNode, PortNode)


def counted(plan: Plan, node: Node) -> bool:
    """Whether the streaming query counts ``node``'s records by an observed metric: a stateful step."""
    return not isinstance(node, (*NOT_COUNTED, SourceNode)) and spec_of(node).stateful


def one_for_one(node: Node) -> bool:
    """Whether ``node`` hands on its input's records one for one (see ``same_count_as_input``)."""
    return (isinstance(node, (EventTimeNode, KeyByNode))
            or isinstance(node, NativeStep) and node.mode in ("select", "with_columns")
            or isinstance(node, PythonStep) and node.mode in ("map", "key")
            or isinstance(node, SqlNode) and node.each_record)


def marked(plan: Plan, node: Node, in_query: bool = True) -> bool:
    """Whether ``node`` is marked to count its records from Spark's SQL metrics: a stateless step
    that changes the number of records (or ends a fused Python stage that does), in the streaming
    query (``in_query``) where no observed metric counts it, or lowered per micro-batch inside
    ``foreachBatch``."""
    if isinstance(node, (*NOT_COUNTED, SourceNode)) or spec_of(node).stateful or spec_of(node).own_state:
        return False
    if in_query and counted(plan, node):
        return False
    if isinstance(node, PythonStep):
        chain = next((c for c in python_chains(plan) if c[-1] == node.name), None)
        return chain is not None and not all(one_for_one(plan.nodes[name]) for name in chain)
    return not one_for_one(node)


def mark_records(df: DataFrame, position: int) -> DataFrame:
    """``df`` under the marker of the step at ``position`` in the plan (``marked_counts.marker``)."""
    return df.filter(F.spark_partition_id() > F.lit(-marker(position)))


def control_paths(plan: Plan, name: str) -> int | None:
    """How many copies of each control row of the pipeline's sources reach step ``name``'s output
    (the paths from each source to it, through stateless steps), when every source reaches it by
    as many paths; None otherwise, or when a stateful step lies on the way."""
    paths: Counter[str] = Counter()
    todo = [name]
    while todo:
        node = plan.nodes[todo.pop()]
        if isinstance(node, SourceNode):
            paths[node.name] += 1
        elif spec_of(node).stateful or spec_of(node).own_state:
            return None
        else:
            todo.extend(node.inputs)
    counts = {paths[source.name] for source in plan.sources()}
    return counts.pop() if len(counts) == 1 else None


def count_records(df: DataFrame, node: Node) -> DataFrame:
    """``df`` with its records counted under the step's metric."""
    records = (F.count(F.when(F.col(CONTROL_COLUMN).isNull(), 1)) if CONTROL_COLUMN in df.columns
               else F.count(F.lit(1)))
    return df.observe(f"{STEP_METRIC_PREFIX}{node.name}", records.alias(RECORDS_FIELD))


def same_count_as_input(plan: Plan) -> list[tuple[str, str]]:
    """(step, its input) for each step whose records are its input's, one for one: a projection
    (``select``, ``with_columns``, an SQL step that only projects), a Python ``map`` or key function
    (a function that raises stops the run), a ``key_by`` and the event time's declaration (late
    records are dropped by the stateful step after it). In the plan's order, so that a chain of
    them follows from its first input; a source's output is its records less its dead letters. A
    step the query counts keeps its own count (``headrace/runtime/progress.py``)."""
    return [(node.name, node.inputs[0]) for node in plan.nodes.values()
            if one_for_one(node) and len(node.inputs) == 1]


def same_count_as_output(plan: Plan) -> list[tuple[str, str]]:
    """(step, its one consumer) for each step of a fused Python stage but its last whose
    consumer hands on its records one for one: the step's records are its consumer's. Latest
    first, so that a run of them follows from the stage's last step (which the query marks)."""
    pairs = []
    for chain in python_chains(plan):
        for step, after in zip(chain, chain[1:]):
            if one_for_one(plan.nodes[after]) and len(plan.consumers(step)) == 1:
                pairs.append((step, after))
    return pairs[::-1]
