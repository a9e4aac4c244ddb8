"""Rolling per-key aggregates: built-in aggregates on Spark's own ``groupBy`` aggregate; a
reduce with a user function on Spark's ``applyInPandasWithState``; a reduce or built-in
aggregates whose keys expire (``ttl=``) on ``transformWithStateInPandas`` with Spark's state
TTL.

Each key's accumulator is kept pickled in Spark's state store, so it is checkpointed and
replayed with the batch. With a time-to-live, a key whose state was last written ``ttl`` of
processing time ago is forgotten: its next record starts it again from nothing.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor
from pyspark.sql.streaming.state import GroupStateTimeout

from headrace.engine.rolling import Fold, reduce_fold
from headrace.engine.window_functions import BuiltinAggregates
from headrace.lazy_modules import LazyModule
from headrace.plan.nodes import RollingAggregateNode
from headrace.schema import to_ddl
from headrace.spark.expressions import aggregate_columns
from headrace.spark.stateful import SEQUENCE, exact_integers, group_frame, integer_fields, key_value, records_of
from headrace.spark.stateless import without_control

if TYPE_CHECKING:
    import pandas as pd

    from headrace.spark.compilation import Compilation
else:
    pd = LazyModule("pandas")  # imported on first use: building and checking a plan needs no pandas



def lower_rolling(node: RollingAggregateNode, lowering: Compilation) -> DataFrame:
    df = without_control(lowering.input(node))
    if node.reduce_fn is None and node.ttl_ms is None:
        return df.groupBy(*[F.col(f"`{k}`") for k in node.keys or ()]).agg(*aggregate_columns(node.aggs))
    return _fold_per_key(df, node)


def _reduce(node: RollingAggregateNode) -> tuple[Fold, Callable[[Any, Any], dict[str, Any]]]:
    assert node.schema is not None and node.reduce_fn is not None
    return reduce_fold(node.name, node.reduce_fn, [n for n, _ in node.schema]), lambda key, accumulated: accumulated


def _aggregates(node: RollingAggregateNode) -> tuple[Fold, Callable[[Any, Any], dict[str, Any]]]:
    aggregates = BuiltinAggregates(node.aggs)
    keys = list(node.keys or ())

    def fold(accumulator: Any, record: dict[str, Any]) -> Any:
        return aggregates.add(aggregates.create() if accumulator is None else accumulator, record)

    def result(key: Any, accumulator: Any) -> dict[str, Any]:
        values = key if len(keys) > 1 else (key,)
        return {**dict(zip(keys, values)), **aggregates.result(accumulator, key, (None, None))[0]}

    return fold, result


class _ExpiringFold(StatefulProcessor):
    """A key's accumulator in one value state with Spark's state TTL: a key whose state was
    last written ``ttl`` ago reads as new, and Spark's TTL cleanup removes it. Unlike a
    processing-time timeout, TTL needs no micro-batch of its own."""

    def __init__(self, fold_frames: Callable[[Any, Any, Iterator[pd.DataFrame]], tuple[Any, pd.DataFrame]],
                 ttl_ms: int) -> None:
        self.fold_frames, self.ttl_ms = fold_frames, ttl_ms

    def init(self, handle: Any) -> None:
        self.accumulator = handle.getValueState("accumulated", "accumulated binary", self.ttl_ms)

    def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[pd.DataFrame]:
        stored = self.accumulator.get()
        accumulated, out = self.fold_frames(key, None if stored is None else pickle.loads(stored[0]), rows)
        self.accumulator.update((pickle.dumps(accumulated),))
        yield out

    def close(self) -> None:
        pass


def _fold_per_key(df: DataFrame, node: RollingAggregateNode) -> DataFrame:
    """The step as a fold of each key's records in Python, in source order (see
    ``headrace/spark/stateful.py``), so a replayed batch folds them the same way."""
    assert node.schema is not None
    keys = list(node.keys or ())
    fold, result = _reduce(node) if node.reduce_fn is not None else _aggregates(node)
    fields = [c for c in df.columns if node.reduce_fn is not None or c in {a.column for _, a in node.aggs}]
    integers = integer_fields(df, fields)
    df = exact_integers(df, integers).withColumn(SEQUENCE, F.spark_partition_id())
    names, columns = [n for n, _ in node.schema], pd.Index(df.columns)

    def fold_frames(key: Any, accumulated: Any, frames: Iterator[pd.DataFrame]) -> tuple[Any, pd.DataFrame]:
        for record in records_of(group_frame(frames, columns), fields, integers):
            accumulated = fold(accumulated, record)
        return accumulated, pd.DataFrame([result(key_value(tuple(key), keys, integers), accumulated)], columns=names)

    grouped = df.groupBy(*[F.col(f"`{k}`") for k in keys])
    if node.ttl_ms is not None:
        return grouped.transformWithStateInPandas(
            statefulProcessor=_ExpiringFold(fold_frames, node.ttl_ms), outputStructType=to_ddl(node.schema),
            outputMode="Update", timeMode="ProcessingTime")

    def per_key(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        accumulated, out = fold_frames(key, pickle.loads(state.get[0]) if state.exists else None, frames)
        state.update((pickle.dumps(accumulated),))
        yield out

    return grouped.applyInPandasWithState(
        per_key, outputStructType=to_ddl(node.schema), stateStructType="accumulated binary",
        outputMode="update", timeoutConf=GroupStateTimeout.NoTimeout)
