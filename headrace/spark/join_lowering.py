"""A join of two streams, lowered to Spark's own stream-stream join.

Spark keeps each side's records in its state store and evicts them when the watermark shows
that no record of the other side can match any more. An interval join tells it so by its
condition, which bounds one side's event time by the other's. A window join is Spark's own
join on equal window columns: each side's ``window(time)`` carries the watermark's mark (and
its event time loses it on the way in, so Spark judges the side by the window alone), and
Spark drops a record whose window ended at or before the watermark, and evicts a window's
records once the watermark reaches its end. An outer join's unmatched record is emitted when
it is evicted. The output's event times get their marks back, for a stateful step after the
join. Control rows (watermark moves, the end-of-input flush) have moved each side's watermark
before the join, and go no further.

Spark drops a side's record whose event time (a window join: whose window's end) is at or
before the watermark it judges late records by, and says nothing more of it. A join whose
late records are asked for (``late_records()``) hands on, besides its pairs, each side's
records (``JOIN_PART``: "left" or "right"); the micro-batch keeps those that Spark's rule
makes late (``join_late_records``), read with the watermark the micro-batch ran with from
Spark's offset log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructField

from headrace.environment.checkpoints import WATERMARK_KEY, batch_metadata
from headrace.plan.nodes import JOIN_WINDOW_FIELDS, StreamJoinNode
from headrace.spark.specs import stateful_steps
from headrace.spark.stateless import without_control
from headrace.spark.watermarks import DELAY_KEY

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation

SPARK_HOW = {"inner": "inner", "left": "left_outer", "right": "right_outer", "full": "full_outer"}
LEFT_WINDOW, RIGHT_WINDOW = "_hr_left_window", "_hr_right_window"
# The raw output of a join whose late records are asked for: each row is a pair, or a side's record
JOIN_PART, LATE_TIME = "_hr_join_part", "_hr_late_time"
SIDE_RECORD = {"left": "_hr_late_left", "right": "_hr_late_right"}


def judged_by_window(df: DataFrame, time: str, column: str, size_ms: int, offset_ms: int) -> DataFrame:
    """``df`` with the tumbling window of its event time ``time`` as the struct ``column``, which
    carries the watermark's mark, while ``time`` loses it: Spark then judges and evicts the
    side's records by their window's end, as its own join on equal windows does."""
    size = f"{size_ms} milliseconds"
    window = F.window(F.col(f"`{time}`"), size, size, f"{offset_ms} milliseconds")
    return with_marks(df.withColumn(column, window), {time: None})


def with_marks(df: DataFrame, marks: dict[str, Any]) -> DataFrame:
    """``df`` with the watermark's mark of each column of ``marks`` set to its value there (a
    delay in ms), or taken off (None); the columns' other metadata kept."""
    def metadata(field: StructField) -> dict[str, Any]:
        kept = {k: v for k, v in field.metadata.items() if k != DELAY_KEY}
        return kept if marks[field.name] is None else {**kept, DELAY_KEY: marks[field.name]}

    return df.select(*[F.col(f"`{f.name}`").alias(f.name, metadata=metadata(f)) if f.name in marks
                       else F.col(f"`{f.name}`") for f in df.schema.fields])


def _delay(df: DataFrame, time: str) -> Any:
    return next((f.metadata.get(DELAY_KEY) for f in df.schema.fields if f.name == time), None)


def _within(right_time: str, left_time: str, millis: int, op: str) -> Column:
    return F.expr(f"`{right_time}` {op} `{left_time}` + INTERVAL {millis} MILLISECONDS")


def lower_stream_join(node: StreamJoinNode, lowering: Compilation) -> DataFrame:
    sides = without_control(lowering.input(node, 0)), without_control(lowering.input(node, 1))
    left, right = sides
    left_time = lowering.plan.nodes[node.inputs[0]].event_time
    right_time = lowering.plan.nodes[node.inputs[1]].event_time
    assert left_time is not None and right_time is not None  # stream_join refuses a side without
    window = node.window
    if window is not None:
        left = judged_by_window(left, left_time, LEFT_WINDOW, window.size_ms, window.offset_ms)
        right = judged_by_window(right, right_time, RIGHT_WINDOW, window.size_ms, window.offset_ms)
    # the right side's fields under names of their own (the sides may share names: a self-join), each
    # with its metadata said again: Catalyst, collapsing projections, would give a renamed column the
    # metadata of the column under it, the watermark's mark a window join took off among it
    hidden = {name: f"_hr_right_{number}" for number, name in enumerate(right.columns)}
    right = right.select([F.col(f"`{field.name}`").alias(hidden[field.name], metadata=field.metadata)
                          for field in right.schema.fields])
    condition = [F.col(f"`{a}`") == F.col(hidden[b]) for a, b in zip(node.left_on, node.right_on)]
    if window is not None:
        condition.append(F.col(LEFT_WINDOW) == F.col(hidden[RIGHT_WINDOW]))
    else:
        condition += [_within(hidden[right_time], left_time, node.lower_ms, ">="),
                      _within(hidden[right_time], left_time, node.upper_ms, "<=")]
    joined = left.join(right, on=condition, how=SPARK_HOW[node.how])
    pairs = joined.select(_output_columns(node, left.columns, list(hidden.items())))
    if window is not None:  # the event times carry their marks again, for a stateful step after the join
        pairs = with_marks(pairs, {left_time: _delay(sides[0], left_time), right_time: _delay(sides[1], right_time)})
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
    that Spark's join dropped, those whose event time (a window join: whose window's end) is at or
    before the watermark it judges late records by (Spark's ``eventTimeWatermarkForLateEvents``):
    with one stateful operator in the query, the micro-batch's own; with several, the one of the
    micro-batch before. Lowered in the streaming query (no micro-batch: the plan's frames, the
    probe of the fields read), every record of each side stands: the writer runs the sinks of
    these records in foreachBatch only (``specs.late_records_of_joins``)."""
    late = F.lit(True)
    if lowering.batch_id is not None and lowering.checkpoint is not None:
        judged_by = lowering.batch_id if stateful_steps(lowering.plan) == 1 else lowering.batch_id - 1
        watermark = int(batch_metadata(lowering.checkpoint, judged_by).get(WATERMARK_KEY, 0)) if judged_by >= 0 else 0
        late = _judged_time(node) <= F.lit(watermark)
    parts = []
    for side, keys in (("left", node.left_on), ("right", node.right_on)):
        record = F.col(SIDE_RECORD[side])
        key = (record[keys[0]].cast("string") if len(keys) == 1
               else F.to_json(F.struct(*[record[k].alias(k) for k in keys])))
        parts.append(raw.filter((F.col(JOIN_PART) == side) & late)
                     .select(F.lit(node.name).alias("step"), F.lit(side).alias("side"), key.alias("key"),
                             F.col(LATE_TIME).alias("event_time"), F.to_json(record).alias("record")))
    return parts[0].unionByName(parts[1])


def _judged_time(node: StreamJoinNode) -> Column:
    """What Spark's join compares with the watermark, in ms: a record's event time, or in a window
    join the end of its window."""
    time = F.unix_millis(F.col(LATE_TIME))
    if node.window is None:
        return time
    size, offset = node.window.size_ms, node.window.offset_ms
    return F.floor((time - offset) / size) * size + offset + size


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
        window = F.col(LEFT_WINDOW) if node.how in ("inner", "left") else F.coalesce(
            F.col(LEFT_WINDOW), F.col(hidden[RIGHT_WINDOW]))
        columns += [window[part].alias(field) for part, field in zip(("start", "end"), JOIN_WINDOW_FIELDS)]
    return columns
