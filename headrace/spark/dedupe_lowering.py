"""A dedupe, lowered to Spark's own ``dropDuplicatesWithinWatermark``.

Spark keeps each key with the time it expires, its first record's event time plus the delay it
reads from the watermark's mark on the event-time column, and forgets it at the end of a
micro-batch whose watermark has reached that time. ``within`` is that delay: the mark says
``within`` on the way into the operator, and what it said before on the way out, so no later
step sees the change. Spark takes the one column with a mark as the event time and refuses two
(a join's output has both sides'), so the others lose theirs through the operator. Control rows
have moved the watermark before the dedupe, and go no further.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.plan.nodes import DedupeNode
from headrace.spark.stateless import without_control
from headrace.spark.watermarks import DELAY_KEY

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation



def _marked(df: DataFrame, marks: dict[str, dict[str, Any]]) -> DataFrame:
    """``df`` with the columns of ``marks`` carrying that metadata instead of their own."""
    return df.select(*[F.col(f"`{c}`").alias(c, metadata=marks[c]) if c in marks else F.col(f"`{c}`")
                       for c in df.columns])


def lower_dedupe(node: DedupeNode, lowering: Compilation) -> DataFrame:
    df = without_control(lowering.input(node))
    own = {f.name: f.metadata for f in df.schema.fields if DELAY_KEY in f.metadata}
    wanted = {name: {k: v for k, v in metadata.items() if k != DELAY_KEY} for name, metadata in own.items()}
    if node.event_time in own:
        delay = own[node.event_time][DELAY_KEY] if node.within_ms is None else node.within_ms
        wanted[str(node.event_time)][DELAY_KEY] = delay
    changed = {name: metadata for name, metadata in wanted.items() if metadata != own[name]}
    deduped = _marked(df, changed).dropDuplicatesWithinWatermark(list(node.on))
    return _marked(deduped, {name: own[name] for name in changed})
