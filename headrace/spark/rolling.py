"""Rolling per-key reduce with a user function, on Spark's ``applyInPandasWithState``.

The accumulated record of each key is kept pickled in Spark's state store, so it is
checkpointed and replayed with the batch.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql.streaming.state import GroupStateTimeout

from headrace.errors import StepFunctionError
from headrace.plan.nodes import RollingAggregateNode, function_label
from headrace.schema import to_ddl


def reduce_per_key(df: DataFrame, node: RollingAggregateNode) -> DataFrame:
    assert node.schema is not None and node.reduce_fn is not None
    names = [n for n, _ in node.schema]
    fn, step, label = node.reduce_fn, node.name, function_label(node.reduce_fn)

    def reduce_group(key: Any, frames: Iterator[pd.DataFrame], state: Any) -> Iterator[pd.DataFrame]:
        accumulated = pickle.loads(state.get[0]) if state.exists else None
        for frame in frames:
            for record in frame[names].to_dict("records"):
                if accumulated is None:
                    accumulated = record
                    continue
                try:
                    result = fn(dict(accumulated), record)
                except Exception as exc:
                    raise StepFunctionError(f"step '{step}' ({label}) raised {type(exc).__name__}: {exc} "
                                            f"(accumulated: {accumulated!r}, record: {record!r})") from exc
                if not isinstance(result, dict):
                    raise StepFunctionError(f"step '{step}' ({label}) returned a {type(result).__name__}; a reduce "
                                            f"function must return a dict with the fields {names}")
                accumulated = {n: result.get(n) for n in names}
        state.update((pickle.dumps(accumulated),))
        yield pd.DataFrame([accumulated], columns=names)

    keys = list(node.keys or ())
    return df.groupBy(*keys).applyInPandasWithState(
        reduce_group, outputStructType=to_ddl(node.schema), stateStructType="accumulated binary",
        outputMode="update", timeoutConf=GroupStateTimeout.NoTimeout)
