"""Scoring in Spark's Python workers: each Arrow batch of a micro-batch at once, with one
version of a model loaded once per worker (``headrace/spark/score_lowering.py`` runs it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from headrace.ml.registry import load_model

SCORE, PREDICTION, MODEL_VERSION = "score", "prediction", "model_version"
_LOADED: dict[tuple[str, int], Any] = {}  # (registry, version) -> the model, in this worker


def model_of(registry: str, version: int) -> Any:
    key = (registry, version)
    if key not in _LOADED:
        _LOADED[key] = load_model(registry, version)
    return _LOADED[key]


def scores(model: Any, rows: Any) -> tuple[np.ndarray, np.ndarray]:
    """(score, prediction) of each row of the pandas DataFrame ``rows``: a classifier's score is
    the probability of its second class (of two), or of the class it predicts (of more); a
    regressor's, its prediction."""
    predicted = np.asarray(model.predict(rows))
    if hasattr(model, "predict_proba") and getattr(model, "classes_", None) is not None:
        probabilities = np.asarray(model.predict_proba(rows), dtype="float64")
        score = probabilities[:, 1] if probabilities.shape[1] == 2 else probabilities.max(axis=1)
    else:
        score = predicted.astype("float64")
    return score, predicted


ARROW_TYPES = {"long": pa.int64(), "double": pa.float64(), "string": pa.string(), "boolean": pa.bool_()}


def score_batches(batches: Iterator[pa.RecordBatch], registry: str, version: int, features: list[str],
                  prediction: str) -> Iterator[pa.RecordBatch]:
    """Each batch with ``score``, ``prediction`` (of Spark type ``prediction``) and
    ``model_version`` added."""
    model = model_of(registry, version)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        score, predicted = scores(model, batch.select(features).to_pandas())
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(score, pa.float64()), pa.array(predicted.tolist(), ARROW_TYPES[prediction]),
             pa.array(np.full(batch.num_rows, version, dtype="int64"))],
            names=[*batch.schema.names, SCORE, PREDICTION, MODEL_VERSION])
