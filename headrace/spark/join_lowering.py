"""A join of two streams, lowered to Spark's own stream-stream join.

Spark keeps each side's records in its state store and evicts them when the watermark shows
that no record of the other side can match any more; it can tell that only from a condition
that bounds one side's event time by the other's, so every join carries one: the interval of
an interval join, and for a window join the window's span around the equal window starts.
An outer join's unmatched record is emitted when it is evicted. Control rows (watermark moves,
the end-of-input flush) have moved each side's watermark before the join, and go no further.

Spark drops a side's record whose event time is at or before the watermark it judges late
records by, and says nothing more of it. A join whose late records are asked for
(``late_records()``) hands on, besides its pairs, each side's records (``JOIN_PART``: "left" or
"right"); the micro-batch keeps those that Spark's rule makes late (``join_late_records``), read
with the watermark the micro-batch ran with from Spark's offset log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from headrace.environment.checkpoints import WATERMARK_KEY, batch_metadata
from headrace.plan.nodes import JOIN_WINDOW_FIELDS, StreamJoinNode
from headrace.spark.specs import stateful_steps
from headrace.spark.stateless import without_control

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation

SPARK_HOW = {"inner": "inner", "left": "left_outer", "right": "right_outer", "full": "full_outer"}
LEFT_WINDOW, RIGHT_WINDOW = "_hr_left_window", "_hr_right_window"
# The raw output of a join whose late records are asked for: each row is a pair, or a side's record
JOIN_PART, LATE_TIME = "_hr_join_part", "_hr_late_time"
SIDE_RECORD = {"left": "_hr_late_left", "right": "_hr_late_right"}


def _window_start(df: DataFrame, time: str, node: StreamJoinNode, column: str) -> DataFrame:
    window = node.window
    assert window is not None
    size = f"{window.size_ms} milliseconds"
    start = F.window(F.col(f"`{time}`"), size, size, f"{window.offset_ms} milliseconds").start  # type: ignore[attr-defined]
    return df.withColumn(column, start)


def _within(right_time: str, left_time: str, millis: int, op: str) -> Column:
    return F.expr(f"`{right_time}` {op} `{left_time}` + INTERVAL {millis} MILLISECONDS")


def lower_stream_join(node: StreamJoinNode, lowering: Compilation) -> DataFrame:
    sides = without_control(lowering.input(node, 0)), without_control(lowering.input(node, 1))
    left, right = sides
    left_time = lowering.plan.nodes[node.inputs[0]].event_time
    right_time = lowering.plan.nodes[node.inputs[1]].event_time
    assert left_time is not None and right_time is not None  # stream_join refuses a side without
    if node.window is not None:
        left = _window_start(left, left_time, node, LEFT_WINDOW)
        right = _window_start(right, right_time, node, RIGHT_WINDOW)
    # the right side's fields under names of their own: the sides may share names (a self-join)
    hidden = {name: f"_hr_right_{number}" for number, name in enumerate(right.columns)}
    right = right.select([F.col(f"`{name}`").alias(alias) for name, alias in hidden.items()])
    condition = [F.col(f"`{a}`") == F.col(hidden[b]) for a, b in zip(node.left_on, node.right_on)]
    condition += [_within(hidden[right_time], left_time, node.lower_ms, ">="),
                  _within(hidden[right_time], left_time, node.upper_ms, "<=")]
    if node.window is not None:
        condition.append(F.col(LEFT_WINDOW) == F.col(hidden[RIGHT_WINDOW]))
    joined = left.join(right, on=condition, how=SPARK_HOW[node.how])
    pairs = joined.select(_output_columns(node, left.columns, list(hidden.items())))
    if not lowering.plan.late_output_asked(node.name):
        return pairs
    raw = pairs.withColumn(JOIN_PART, F.lit("pair"))
    for side, frame, time in (("left", sides[0], left_time), ("right", sides[1], right_time)):
        records = frame.select(F.lit(side).alias(JOIN_PART), F.col(f"`{time}`").alias(LATE_TIME),
                               F.struct(*[F.col(f"`{c}`") for c in frame.columns]).alias(SIDE_RECORD[side]))
        raw = raw.unionByName(records, allowMissingColumns=True)
    lowering.raw_outputs[node.name] = raw
    return join_pairs(raw)


def join_pairs(raw: DataFrame) -> DataFrame:
    """The pairs of a join's raw output (see the module's docstring), with the step's columns."""
    internal = {JOIN_PART, LATE_TIME, *SIDE_RECORD.values()}
    return raw.filter(F.col(JOIN_PART) == "pair").select(*[F.col(f"`{c}`") for c in raw.columns if c not in internal])


def join_late_records(raw: DataFrame, node: StreamJoinNode, lowering: Compilation) -> DataFrame:
    """The late side output of a join, in a micro-batch of its raw output: the records of each side
    that Spark's join dropped, those at or before the watermark it judges late records by (Spark's
    ``eventTimeWatermarkForLateEvents``): with one stateful operator in the query, the
    micro-batch's own; with several, the one of the micro-batch before. Lowered in the streaming
    query (no micro-batch: the plan's frames, the probe of the fields read), every record of
    each side stands: the writer runs the sinks of these records in foreachBatch only
    (``specs.late_records_of_joins``)."""
    late = F.lit(True)
    if lowering.batch_id is not None and lowering.checkpoint is not None:
        judged_by = lowering.batch_id if stateful_steps(lowering.plan) == 1 else lowering.batch_id - 1
        watermark = int(batch_metadata(lowering.checkpoint, judged_by).get(WATERMARK_KEY, 0)) if judged_by >= 0 else 0
        late = F.col(LATE_TIME) <= F.timestamp_millis(F.lit(watermark))
    parts = []
    for side, keys in (("left", node.left_on), ("right", node.right_on)):
        record = F.col(SIDE_RECORD[side])
        key = (record[keys[0]].cast("string") if len(keys) == 1
               else F.to_json(F.struct(*[record[k].alias(k) for k in keys])))
        parts.append(raw.filter((F.col(JOIN_PART) == side) & late)
                     .select(F.lit(node.name).alias("step"), F.lit(side).alias("side"), key.alias("key"),
                             F.col(LATE_TIME).alias("event_time"), F.to_json(record).alias("record")))
    return parts[0].unionByName(parts[1])


def _output_columns(node: StreamJoinNode, left_columns: list[str], right: list[tuple[str, str]]) -> list[Column]:
    """The left record's fields, then the right's; a key of the same name on both sides once
    (from the side a record came from, in an outer join)."""
    shared = {a: b for a, b in zip(node.left_on, node.right_on) if a == b}
    hidden = dict(right)
    columns = []
    for name in left_columns:
        if name == LEFT_WINDOW:
            continue
        mine = F.col(f"`{name}`")
        if name in shared and node.how in ("right", "full"):
            mine = F.coalesce(mine, F.col(hidden[name])) if node.how == "full" else F.col(hidden[name])
        columns.append(mine.alias(name))
    columns += [F.col(alias).alias(name) for name, alias in right if name not in shared and name != RIGHT_WINDOW]
    if node.window is not None:
        start = F.col(LEFT_WINDOW) if node.how in ("inner", "left") else F.coalesce(
            F.col(LEFT_WINDOW), F.col(hidden[RIGHT_WINDOW]))
        end = start + F.expr(f"INTERVAL {node.window.size_ms} MILLISECONDS")
        columns += [start.alias(JOIN_WINDOW_FIELDS[0]), end.alias(JOIN_WINDOW_FIELDS[1])]
    return columns
