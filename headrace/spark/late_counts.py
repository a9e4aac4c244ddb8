"""The late records of Spark's own window operator, counted one by one.

Spark's window operator drops a late record after the partial aggregate before its shuffle, so
its count of them (``numRowsDroppedByWatermark``) is of the (key, window) groups that came late
in a micro-batch, not of records: the late records of one key and window count once, and a
record of a sliding window once for each window it missed. So headrace drops those rows itself,
just below each window aggregate that reads records (not an earlier stateful step's results), by
Spark's own rule, and Spark finds none late; two markers count the rows that enter and the rows
left (``marked_counts.py``), whose difference is the step's late records. Spark's rule: a row
whose window ends at or before the watermark the micro-batch judges late rows by, the batch's own
in a query with one stateful operator, the one of the batch before with several
(``stages.ALLOW_MULTIPLE``). A record is late once its every window has ended: a sliding window's
record is counted with its last window's row, and its other late rows are dropped uncounted.

That watermark reaches the plan through a file in the checkpoint, which a scalar subquery reads
as Spark plans each micro-batch (before ``foreachBatch`` runs it). It is written when the query
is compiled (for the micro-batch Spark runs first, from the checkpoint), and at the end of each
micro-batch in ``foreachBatch`` (Spark's watermark tracker, updated with the batch's plan, as
Spark updates it before the next batch). Before a micro-batch runs, the watermark Spark logged
for it is checked against the file's: a file ahead of it would drop rows that are on time, and
stops the query instead. So the sinks of such a query run in ``foreachBatch``
(``specs.counts_late_rows``), even one that Spark's own writer could write alone. What it costs:
three filters in the generated code a row, and a job a micro-batch that reads a 21-byte file.

The window aggregates are found in the DataFrame's analyzed plan and given a new child through
Spark's plan API (py4j), the same for the fluent API's windows and SQL's; Spark 4.x.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from headrace.environment import storage
from headrace.environment.checkpoints import COMMITS, OFFSETS, WATERMARK_KEY, batch_metadata, last_batch
from headrace.errors import HeadraceError
from headrace.spark.marked_counts import LATE_IN, LATE_KEPT, MarkedStep
from headrace.spark.specs import stateful_steps
from headrace.spark.step_counts import mark_records
from headrace.spark.watermarks import DELAY_KEY

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation

FILE_NAME = "headrace-judged-watermark"
WIDTH = 20  # every value written takes as many characters: Spark reads the file at the length it listed
LATE_BASE = 1_000_000  # a step's late-row markers: LATE_BASE * (its plan position + 1) + 2 * aggregate (+ 1)
# logical plan nodes that keep state: an aggregate above one of them reads its results, not records
_STATEFUL_NODES = ("Aggregate", "Deduplicate", "DeduplicateWithinWatermark", "FlatMapGroupsWithState",
                   "FlatMapGroupsInPandasWithState", "TransformWithState", "TransformWithStateInPySpark")


# -- the plan ---------------------------------------------------------------------------------------

def count_late_rows(df: DataFrame, lowering: Compilation, step: str) -> DataFrame:
    """``df`` with each window aggregate that reads records given, below it, the late rows
    dropped and counted under step ``step``'s markers (the module's docstring); as it is where
    the query counts nothing (a probe of the fields read, a plan compiled without a checkpoint)."""
    if not lowering.count_steps or lowering.probe_fields or not lowering.query_checkpoint:
        return df
    path = prepare(lowering.query_checkpoint, stateful_steps(lowering.plan) > 1)
    watermark = df.sparkSession.read.text(path).select(F.col("value").cast("long")).scalar()
    base = LATE_BASE * (list(lowering.plan.nodes).index(step) + 1)
    rewriter = _Rewriter(df, watermark, lambda index: _positions(lowering, step, base + 2 * index))
    return rewriter.rewritten()


def _positions(lowering: Compilation, step: str, position: int) -> tuple[int, int]:
    """The markers (rows in, rows kept) of one of ``step``'s window aggregates, noted for the count."""
    lowering.marks[position] = MarkedStep(step, 0, LATE_IN)
    lowering.marks[position + 1] = MarkedStep(step, 0, LATE_KEPT)
    return position, position + 1


class _Rewriter:
    """The analyzed plan of a DataFrame rebuilt with a new child under each window aggregate that
    reads records: one grouped by a window column carrying the watermark, with no stateful node
    below it."""

    def __init__(self, df: DataFrame, watermark: Column, positions: Callable[[int], tuple[int, int]]) -> None:
        self.df, self.watermark, self.positions = df, watermark, positions
        self.spark = df.sparkSession
        self.jvm: Any = self.spark._jvm
        self.found = 0

    def rewritten(self) -> DataFrame:
        plan, changed, _ = self._walk(self.df._jdf.queryExecution().analyzed())
        return self._frame(plan) if changed else self.df

    def _walk(self, plan: Any) -> tuple[Any, bool, bool]:
        """(the plan rebuilt, whether it changed, whether it keeps state)."""
        walked = [self._walk(child) for child in _children(plan)]
        children = [child for child, _, _ in walked]
        changed = any(child_changed for _, child_changed, _ in walked)
        stateful_below = any(stateful for _, _, stateful in walked)
        window = None if stateful_below else _window_grouping(plan)
        if window is not None:
            children, changed = [self._counted(children[0], window)], True
        if changed:
            plan = plan.withNewChildren(self._seq(children))
        return plan, changed, stateful_below or _keeps_state(plan)

    def _counted(self, child: Any, window: Any) -> Any:
        """``child`` (the rows an aggregate reads) between the markers of its late records, without them."""
        rows_in, rows_kept = self.positions(self.found)
        self.found += 1
        frame = self._frame(child)
        column = self._column(window)
        late = F.unix_micros(column.getField("end")) <= self.watermark
        last = _last_window(child, window)
        record_late = late if last is None else late & (column.getField("start") == self._column(last)["start"])
        counted = mark_records(mark_records(frame, rows_in).filter(~record_late), rows_kept)
        if last is not None:  # the late rows of a record's earlier windows, uncounted
            counted = counted.filter(~late)
        return counted._jdf.queryExecution().analyzed()

    def _frame(self, plan: Any) -> DataFrame:
        jdf = self.jvm.org.apache.spark.sql.classic.Dataset.ofRows(self.spark._jsparkSession, plan)
        return DataFrame(jdf, self.spark)

    def _column(self, expression: Any) -> Column:
        from pyspark.sql.classic.column import Column as ClassicColumn

        return ClassicColumn(self.jvm.org.apache.spark.sql.classic.ExpressionUtils.column(expression))

    def _seq(self, items: list[Any]) -> Any:
        values = self.jvm.java.util.ArrayList()
        for item in items:
            values.add(item)
        return self.jvm.scala.jdk.javaapi.CollectionConverters.asScala(values).toSeq()


def _children(plan: Any) -> list[Any]:
    children = plan.children()
    return [children.apply(index) for index in range(children.size())]


def _keeps_state(plan: Any) -> bool:
    name = str(plan.nodeName())
    if name == "Join":  # a join of two streams keeps both sides; one with a table keeps nothing
        return all(child.isStreaming() for child in _children(plan))
    return name in _STATEFUL_NODES and bool(plan.isStreaming())


def _window_grouping(plan: Any) -> Any:
    """The window column a streaming aggregate groups by, when it carries the watermark (Spark's
    ``window`` or ``session_window`` of the event time); None otherwise."""
    if str(plan.nodeName()) != "Aggregate" or not plan.isStreaming():
        return None
    grouping = plan.groupingExpressions()
    for index in range(grouping.size()):
        expression = grouping.apply(index)
        if (str(expression.getClass().getSimpleName()) == "AttributeReference"
                and expression.metadata().contains(DELAY_KEY) and expression.dataType().typeName() == "struct"):
            return expression
    return None


def _last_window(child: Any, window: Any) -> Any:
    """For a sliding window, the expression of each record's last window: the first of the windows
    Spark's ``Expand`` makes of a record (its latest start); None for a window of its own per record."""
    node = child
    while str(node.nodeName()) == "Filter":
        node = node.child()
    if str(node.nodeName()) != "Expand":
        return None
    output = node.output()
    for index in range(output.size()):
        if output.apply(index).exprId().equals(window.exprId()):
            return node.projections().apply(0).apply(index)
    return None


# -- the watermark each micro-batch judges late rows by ----------------------------------------------

def watermark_file(checkpoint: str) -> str:
    return storage.join(checkpoint, FILE_NAME)


def prepare(checkpoint: str, several: bool) -> str:
    """Write, for the micro-batch Spark runs first from ``checkpoint``, the watermark it judges
    late rows by; returns the file's path."""
    path = watermark_file(checkpoint)
    _write(path, _micros(first_watermark_ms(checkpoint, several)))
    return path


def first_watermark_ms(checkpoint: str, several: bool) -> int:
    """The watermark (ms) the micro-batch Spark runs first from ``checkpoint`` judges late rows
    by: a logged batch not committed runs again with its own; after a committed one, the next
    runs with the watermark Spark committed for it (and never less than the last one's)."""
    last = last_batch(checkpoint, OFFSETS)
    if last is None:
        return 0
    committed = last_batch(checkpoint, COMMITS)
    if committed is None or committed < last:  # batch ``last`` runs again
        return _logged_ms(checkpoint, last - 1 if several else last)
    if several:
        return _logged_ms(checkpoint, last)
    return max(_logged_ms(checkpoint, last), _committed_next_ms(checkpoint, last))


def _logged_ms(checkpoint: str, batch: int) -> int:
    return int(batch_metadata(checkpoint, batch).get(WATERMARK_KEY, 0)) if batch >= 0 else 0


def _committed_next_ms(checkpoint: str, batch: int) -> int:
    import json

    try:
        lines = storage.read_text(storage.join(checkpoint, COMMITS, str(batch))).splitlines()
        return int(json.loads(lines[1]).get("nextBatchWatermarkMs", 0))
    except (OSError, ValueError, IndexError):
        return 0


def _micros(watermark_ms: int) -> int:
    """Spark compares a window's end in µs with the watermark in ms times 1000, 0 (the watermark
    before any) included: a window ending at or before 1970 is late from the start."""
    return watermark_ms * 1000


def _write(path: str, micros: int) -> None:
    text = f"{micros:0{WIDTH}d}\n"
    if storage.is_remote(path):
        storage.write_text(path, text)
        return
    local = storage.local_path(path)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    temporary = f"{os.path.dirname(local)}/.{os.path.basename(local)}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "w") as handle:
        handle.write(text)
    os.replace(temporary, local)


def _read(path: str) -> int:
    return int(storage.read_text(path).strip())


class PerBatch:
    """In ``foreachBatch``: the file checked before each micro-batch runs, and written for the
    next one after it ran."""

    def __init__(self, checkpoint: str, several: bool) -> None:
        self.checkpoint, self.several = checkpoint, several
        self.path = watermark_file(checkpoint)

    def around(self, dispatch: Callable[[DataFrame, int], None],
               query: Callable[[], Any]) -> Callable[[DataFrame, int], None]:
        """``dispatch`` between the check and the write; ``query()`` is Spark's StreamExecution."""
        def run(df: DataFrame, batch_id: int) -> None:
            self.check(batch_id)
            dispatch(df, batch_id)
            self.write_next(batch_id, query())
        return run

    def check(self, batch_id: int) -> None:
        """Refuse to run a micro-batch planned with a watermark ahead of the one Spark logged for it."""
        logged = _micros(_logged_ms(self.checkpoint, batch_id - 1 if self.several else batch_id))
        try:
            planned = _read(self.path)
        except FileNotFoundError:
            return  # no window aggregate read it (count_late_rows found none)
        if planned > logged:
            raise HeadraceError(f"micro-batch {batch_id} was planned to drop the rows of windows ending at or "
                                f"before {planned} µs as late, but Spark judges it by the watermark {logged} µs: "
                                "it would drop rows that are on time; restart the pipeline (its checkpoint gives "
                                "the watermark again)")

    def write_next(self, batch_id: int, jquery: Any) -> None:
        """The watermark the next micro-batch judges late rows by: this one's, with several stateful
        operators; otherwise Spark's tracker updated with this batch's plan."""
        if self.several or jquery is None:
            # (without the query at hand, this batch's own: never ahead of the next one's)
            _write(self.path, _micros(_logged_ms(self.checkpoint, batch_id)))
            return
        tracker = jquery.watermarkTracker()
        tracker.updateWatermark(jquery.lastExecution().executedPlan())
        _write(self.path, _micros(int(tracker.currentWatermark())))
