"""A score step (``stream.score``), lowered in each micro-batch inside foreachBatch, where the
batch id is known.

The model version a micro-batch is scored with is chosen once, when the batch first runs: the
registry's newest, written to ``<checkpoint>/models/<step>/<batch id>`` before any record is
scored. A batch that runs again (a restart replays the batch a crash interrupted) reads that
file, so it is scored with the same version, whatever was published since; a newer version
takes over from the next new micro-batch, without a restart. A scikit-learn model scores the
records in Spark's Python workers, an Arrow batch at a time (``headrace/ml/scoring.py``); a Spark
MLlib PipelineModel scores them in Spark itself, loaded once by the driver.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from headrace.environment import storage
from headrace.errors import StepFunctionError
from headrace.ml import registry
from headrace.ml.scoring import MODEL_VERSION, PREDICTION, SCORE, score_batches
from headrace.plan.nodes import ScoreNode

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation

MODELS_DIR = "models"
KEPT_BATCHES = 100  # the version files of this many batches back are kept (Spark keeps as many offsets)


_SPARK_MODELS: dict[tuple[str, int], Any] = {}  # (registry, version) -> the JVM's PipelineModel, loaded once


def lower_score(node: ScoreNode, lowering: Compilation) -> DataFrame:
    if lowering.batch_id is None or lowering.checkpoint is None:
        raise AssertionError(f"score step {node.name!r} is lowered outside a micro-batch")
    version = batch_version(node, lowering.checkpoint, lowering.batch_id)
    df = lowering.input(node)
    if registry.manifest(node.registry, version).flavor == registry.SPARK:
        return _spark_scored(df, node, version)
    schema = (f"{', '.join(f'`{name}` {kind}' for name, kind in df.dtypes)}, {SCORE} double, "
              f"{PREDICTION} {node.prediction}, {MODEL_VERSION} bigint")
    score = functools.partial(score_batches, registry=node.registry, version=version,
                              features=list(node.features), prediction=node.prediction)
    return df.mapInArrow(score, schema)


def batch_version(node: ScoreNode, checkpoint: str, batch_id: int) -> int:
    """The version micro-batch ``batch_id`` is scored with: the one recorded for it, else the
    registry's newest, recorded now."""
    folder = storage.join(checkpoint, MODELS_DIR, node.name)
    recorded = storage.join(folder, str(batch_id))
    try:
        return int(storage.read_text(recorded))
    except FileNotFoundError:
        pass
    version = registry.latest_version(node.registry)
    if version is None:
        raise StepFunctionError(f"score step '{node.name}' ({node.defined_at}): the registry {node.registry} holds "
                                "no model: publish one with hr.ml.publish(...)")
    check_version(node, version)
    storage.write_text(recorded, str(version))
    old = storage.join(folder, str(batch_id - KEPT_BATCHES))
    if batch_id >= KEPT_BATCHES and storage.exists(old):
        storage.delete_tree(old)
    return version


def recorded_version(checkpoint: str, step: str, batch_id: int) -> int | None:
    """The model version score step ``step`` scored micro-batch ``batch_id`` with, if recorded
    (a local checkpoint; the progress figures show it)."""
    try:
        return int(storage.read_text(storage.join(checkpoint, MODELS_DIR, step, str(batch_id))))
    except (FileNotFoundError, ValueError):
        return None


def check_version(node: ScoreNode, version: int) -> None:
    """Refuse a version the step's output cannot take: its features or its prediction's type
    differ from those the pipeline was built with."""
    found = registry.manifest(node.registry, version)
    if found.feature_names != list(node.features) or found.prediction != node.prediction:
        raise StepFunctionError(
            f"score step '{node.name}' ({node.defined_at}): model version {version} in {node.registry} reads "
            f"{', '.join(found.feature_names)} and predicts {found.prediction}, but the pipeline was built for a "
            f"model that reads {', '.join(node.features)} and predicts {node.prediction}; publish a model of the "
            "same features and kind of prediction, or start the pipeline again to score with the new one")


@dataclass(frozen=True)
class LinearScorer:
    """A PipelineModel of a VectorAssembler and a binary LogisticRegressionModel, as numbers:
    its score is ``1 / (1 + exp(-(w . x + b)))`` over the assembled features, the prediction
    whether the score is above the threshold (MLlib's own formulas, in its order)."""

    inputs: tuple[str, ...]
    weights: tuple[float, ...]
    intercept: float
    threshold: float

    def columns(self, step: str) -> tuple[Column, Column]:
        """(score, prediction) as native Spark expressions; a null feature fails the batch, as the
        VectorAssembler fails it."""
        margin = None
        for name, weight in zip(self.inputs, self.weights):
            term = F.col(f"`{name}`").cast("double") * F.lit(weight)
            margin = term if margin is None else margin + term
        assert margin is not None
        score = F.lit(1.0) / (F.lit(1.0) + F.exp(-(margin + F.lit(self.intercept))))
        missing = functools.reduce(lambda a, b: a | b, [F.col(f"`{n}`").isNull() for n in self.inputs])
        score = F.when(missing, F.raise_error(F.lit(f"score step '{step}': a record has a null feature "
                                                    f"({', '.join(self.inputs)}); the model's VectorAssembler "
                                                    "takes no nulls"))).otherwise(score)
        return score, F.when(score > F.lit(self.threshold), F.lit(1.0)).otherwise(F.lit(0.0))


_LINEAR: dict[tuple[str, int], LinearScorer | None] = {}  # (registry, version) -> the model as numbers, if linear


def linear_scorer(model: Any) -> LinearScorer | None:
    """The JVM PipelineModel ``model`` as a ``LinearScorer``, when it is exactly a VectorAssembler
    (keeping invalid values an error) then a binary LogisticRegressionModel reading its output."""
    stages = list(model.stages())
    if len(stages) != 2:
        return None
    assembler, regression = stages
    if (assembler.getClass().getName() != "org.apache.spark.ml.feature.VectorAssembler"
            or regression.getClass().getName() != "org.apache.spark.ml.classification.LogisticRegressionModel"
            or assembler.getHandleInvalid() != "error" or regression.numClasses() != 2
            or regression.getFeaturesCol() != assembler.getOutputCol() or regression.isDefined(
                regression.thresholds()) and regression.isSet(regression.thresholds())):
        return None
    return LinearScorer(tuple(assembler.getInputCols()), tuple(regression.coefficients().toArray()),
                        float(regression.intercept()), float(regression.getThreshold()))


def _spark_scored(df: DataFrame, node: ScoreNode, version: int) -> DataFrame:
    """A Spark MLlib PipelineModel's scores, computed by Spark itself (no Python): its
    ``probability`` of the second class of two (of the class it predicts, of more), else its
    ``prediction``. A vector assembler and a binary logistic regression are compiled to a
    native expression (``LinearScorer``): no vectors, and a smaller plan to build per batch."""
    from pyspark.ml.functions import vector_to_array

    key = (node.registry, version)
    if key not in _SPARK_MODELS:  # the JVM's model: one call per batch (the Python wrapper's copies its params)
        jvm: Any = df.sparkSession._jvm
        _SPARK_MODELS[key] = jvm.org.apache.spark.ml.PipelineModel.load(registry.spark_model_path(node.registry,
                                                                                                  version))
        _LINEAR[key] = linear_scorer(_SPARK_MODELS[key])
    linear = _LINEAR[key]
    if linear is not None:
        score, prediction = linear.columns(node.name)
        return df.select(*[F.col(f"`{name}`") for name in df.columns], score.alias(SCORE),
                         prediction.alias(PREDICTION), F.lit(version).cast("long").alias(MODEL_VERSION))
    scored = DataFrame(_SPARK_MODELS[key].transform(df._jdf), df.sparkSession)
    if "probability" in scored.columns:
        probabilities = vector_to_array(F.col("probability"))
        score = F.when(F.size(probabilities) == 2, probabilities[1]).otherwise(F.array_max(probabilities))
    else:
        score = F.col("prediction").cast("double")
    return scored.select(*[F.col(f"`{name}`") for name in df.columns], score.alias(SCORE),
                         F.col("prediction").cast("double").alias(PREDICTION),
                         F.lit(version).cast("long").alias(MODEL_VERSION))
