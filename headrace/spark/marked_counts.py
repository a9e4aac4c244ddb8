"""The records of the marked steps of a micro-batch (``headrace/spark/step_counts.py``), read from
Spark's SQL metrics: each marker is a filter that keeps every row, and Spark counts the rows
that pass it ("number of output rows") inside the generated code, at no cost a batch shows.

Two places hold a batch's values:

* A query whose sinks run in ``foreachBatch``: the query's last execution (the batch's physical
  plan), read in the query's own thread once the sinks have written the batch
  (``headrace/spark/writer.py``), before the next batch replaces it. Spark's store of SQL
  executions has no values for it: the sinks run the plan's rows in executions of their own.
* A query Spark's own writer writes, and the steps lowered per batch inside ``foreachBatch``
  (below the query's root), which each sink's own write runs: the batch's executions in Spark's
  store of SQL executions (kept for the last 1,000 executions), read when the batch's progress
  report arrives (``headrace/runtime/runner.py``).

Both are taken with the batch's progress report (``take``), as ``sink_timings`` are. A marker
that Spark planned more than once (a step in several branches of the query, or run by two sinks'
writes) sees the same rows in each copy, and a copy that read the batch's cache instead sees
none: its largest value is the step's.

Works on the JVM objects it is handed; imports nothing of PySpark.
"""

from __future__ import annotations

import re
import threading
import time
from collections import OrderedDict
from typing import Any, NamedTuple

MARK_BASE = 1_000_000_000  # a step's marker: -(MARK_BASE + its position in the plan)
KEEP = 1000  # batches whose report never came (a query stopped meanwhile) are forgotten after this many
ROWS_METRIC = "numOutputRows"
DESCRIBED_FIELDS = 25  # how many fields a node's one-line description shows (a marker's condition is one)
ROWS_METRIC_NAME = "number of output rows"  # the same metric, as Spark's store of executions names it
EXECUTION_WAIT_S = 10.0  # how long a report waits for Spark's store to list and finish the batch's executions
# (on the run's thread, while Spark runs the next batch: a loaded machine's listener bus can lag seconds)
_MARKER = re.compile(r"Filter \(SPARK_PARTITION_ID\(\) > -(\d{10})\)")
_lock = threading.Lock()
_counts: OrderedDict[tuple[str, int], dict[int, int]] = OrderedDict()


GOOD_ROWS = "good rows"  # a source's marker counts its good rows: its dead letters are its input rows less them


class MarkedStep(NamedTuple):
    """A step counted by its marker, and how many copies of each source's control rows pass it
    (taken off its count: ``headrace/spark/step_counts.py``); ``counts`` says what the marker's
    count is of."""

    step: str
    control_copies: int
    counts: str = "records"


def marker(position: int) -> int:
    return MARK_BASE + position


def position_of(description: str) -> int | None:
    """The plan position a node's description marks, if it is a marker.

    >>> position_of("Filter (SPARK_PARTITION_ID() > -1000000003)"), position_of("Filter (a > 1)")
    (3, None)
    """
    found = _MARKER.search(description)
    return int(found.group(1)) - MARK_BASE if found else None


def record(query: str, batch: int, counts: dict[int, int]) -> None:
    """Note the markers' rows of a batch, beside those noted before (the largest of each)."""
    with _lock:
        noted = _counts.setdefault((query, batch), {})
        for position, rows in counts.items():
            _keep_largest(noted, position, rows)
        while len(_counts) > KEEP:
            _counts.popitem(last=False)


def take(query: str, batch: int) -> dict[int, int]:
    """The rows each marker (by plan position) passed in the query's batch, forgotten once taken.

    >>> record("q", 3, {2: 40}); record("q", 3, {2: 38, 5: 1}); take("q", 3), take("q", 3)
    ({2: 40, 5: 1}, {})
    """
    with _lock:
        return _counts.pop((query, batch), {})


def _keep_largest(counts: dict[int, int], position: int, rows: int) -> None:
    counts[position] = max(rows, counts.get(position, 0))


class PlanMarkers:
    """Reads the markers' rows from each batch's executed plan (an ``IncrementalExecution``'s).

    A plan's nodes are reached by their pre-order number (``plan.apply(n)``, the numbering that
    counts Spark's whole-stage-code and input-adapter nodes). The first batch looks at every node
    (two calls into the JVM a node) and notes where the markers are; later batches, whose plans
    have the same shape, go straight to them (four calls a marker), and look again when a node
    there is no longer the marker or a marker of ``expected`` was not found (Spark leaves out the
    branch of a source that had no data in a batch)."""

    def __init__(self, expected: set[int]) -> None:
        self._expected = set(expected)  # the positions marked in the query
        self._where: dict[int, list[int]] = {}  # marked position -> node numbers

    def _find(self, plan: Any) -> None:
        self._where = {}
        number = 0
        while (node := plan.apply(number)) is not None:
            if node.nodeName() == "Filter":
                position = position_of(node.simpleString(DESCRIBED_FIELDS))
                if position is not None:
                    self._where.setdefault(position, []).append(number)
            number += 1

    def _read(self, plan: Any) -> dict[int, int] | None:
        counts: dict[int, int] = {}
        for position, numbers in self._where.items():
            for number in numbers:
                node = plan.apply(number)
                if node is None or position_of(node.simpleString(DESCRIBED_FIELDS)) != position:
                    return None
                _keep_largest(counts, position, int(node.longMetric(ROWS_METRIC).value()))
        return counts

    def read(self, execution: Any) -> dict[int, int]:
        """Each marker's rows in the executed plan."""
        plan = execution.executedPlan()
        counts = self._read(plan) if self._where.keys() >= self._expected else None
        if counts is None:
            self._find(plan)
            counts = self._read(plan) or {}
        return counts

    def read_last_execution(self, query_name: str, batch: int, jquery: Any) -> None:
        """Record the markers' rows of ``batch`` from the query's last execution (``jquery`` is
        Spark's ``StreamExecution``), when it is that batch's."""
        execution = jquery.lastExecution()
        if execution is not None and int(execution.currentBatchId()) == batch:
            record(query_name, batch, self.read(execution))


class ExecutionStore:
    """Spark's store of SQL executions, searched for the executions of one query's batches."""

    def __init__(self, jsession: Any, query_id: str) -> None:
        self._store = jsession.sharedState().statusStore()
        self._query = f"id = {query_id}"
        self._next_id = 0  # executions below it have been looked at
        self._where: dict[int, tuple[int, list[tuple[int, int]]]] = {}  # see _markers_of

    def _executions_of(self, batch: int, wait: bool = True) -> list[int]:
        """The ids of the batch's executions (their description names the query and the batch: a
        batch's execution, and those it runs inside it) among those Spark started since the ones
        last taken, waiting (``wait``) up to ``EXECUTION_WAIT_S`` for Spark's store to list one."""
        suffix = f"batch = {batch}"
        deadline = time.monotonic() + EXECUTION_WAIT_S
        while True:
            count = int(self._store.executionsCount())
            found = []
            if count:
                oldest, newest = (self._id_at(0), self._id_at(count - 1))
                for execution_id in range(max(self._next_id, oldest), newest + 1):
                    option = self._store.execution(execution_id)
                    if option.isEmpty():
                        continue
                    description = option.get().description() or ""
                    if self._query in description and description.endswith(suffix):
                        found.append(execution_id)
            if found or not wait or time.monotonic() > deadline:
                return found
            time.sleep(0.01)

    def _id_at(self, index: int) -> int:
        """The id of the store's execution at ``index``, in the order of their ids."""
        return int(self._store.executionsList(index, 1).apply(0).executionId())

    def _finished(self, execution_id: int) -> bool:
        """Whether Spark's store has finished the execution (its last tasks' values in), waiting up
        to ``EXECUTION_WAIT_S``."""
        deadline = time.monotonic() + EXECUTION_WAIT_S
        while self._store.execution(execution_id).get().completionTime().isEmpty():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def _finished_executions_of(self, batch: int) -> list[int]:
        """All of the batch's executions, once Spark's store has finished them; none when one does
        not finish in time. The store may list the batch's first execution before those it runs
        inside it (the batch's report and the store's listener are on queues of their own), but
        lists them all before it finishes the first: so once those found have finished, it looks
        again, until no more come."""
        executions: list[int] = []
        found = self._executions_of(batch)
        while found:
            if not all(self._finished(execution_id) for execution_id in found):
                return []
            executions += found
            self._next_id = found[-1] + 1
            found = self._executions_of(batch, wait=False)
        return executions

    def read(self, query_name: str, batch: int) -> None:
        """Record the markers' rows of ``batch`` from its executions, once Spark's store has
        finished them: the largest value of each marker (an execution that ran none has none)."""
        executions = self._finished_executions_of(batch)
        if not executions:
            return
        counts: dict[int, int] = {}
        for ordinal, execution_id in enumerate(executions):
            values = self._store.executionMetrics(execution_id)
            nodes = self._store.planGraph(execution_id).allNodes()
            for index, position in self._markers_of(ordinal, nodes):
                rows = _rows_in_store(nodes.apply(index), values)
                if rows is not None:
                    _keep_largest(counts, position, rows)
        record(query_name, batch, counts)

    def _markers_of(self, ordinal: int, nodes: Any) -> list[tuple[int, int]]:
        """(node index, marked position) of each marker among an execution's plan graph's nodes,
        the ``ordinal``-th of its batch: where the same execution of the last batch had them, when
        its graph has as many nodes and they are still there (two calls a marker), else found
        among all nodes (two a node; Spark leaves out the branch of a source without data)."""
        size = int(nodes.size())
        noted = self._where.get(ordinal)
        if noted is not None and noted[0] == size and all(position_of(nodes.apply(index).desc()) == position
                                                          for index, position in noted[1]):
            return noted[1]
        found = [(index, position) for index in range(size)
                 if (position := position_of(nodes.apply(index).desc())) is not None]
        self._where[ordinal] = (size, found)
        return found


def _rows_in_store(node: Any, values: Any) -> int | None:
    """A plan graph node's "number of output rows" among an execution's metric values (Spark's
    text, such as ``1,234``), or None when the execution did not run it."""
    metrics = node.metrics()
    for index in range(metrics.size()):
        metric = metrics.apply(index)
        if metric.name() == ROWS_METRIC_NAME and values.contains(metric.accumulatorId()):
            return int(values.apply(metric.accumulatorId()).replace(",", ""))
    return None
