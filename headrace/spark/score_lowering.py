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
    manifest = registry.manifest(node.registry, version)
    if manifest.flavor == registry.SPARK:
        return _spark_scored(df, node, version)
    key = (node.registry, version)
    if key not in _LINEAR:  # a binary logistic regression runs as a native expression, without Python
        _LINEAR[key] = sklearn_linear_scorer(registry.load_model(node.registry, version), manifest.features)
    linear = _LINEAR[key]
    if linear is not None:
        return _linear_scored(df, node, version, linear)
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
    """A binary logistic regression as numbers (an MLlib VectorAssembler and
    LogisticRegressionModel, or a scikit-learn LogisticRegression): its score is
    ``1 / (1 + exp(-(w . x + b)))``, the formula both use, in their order; its prediction the
    positive label when the score is above ``threshold`` (MLlib) or the margin above 0
    (scikit-learn's ``predict``)."""

    inputs: tuple[str, ...]
    weights: tuple[float, ...]
    intercept: float
    labels: tuple[Any, Any]  # (negative, positive)
    threshold: float | None  # None: predicted by the margin's sign

    def columns(self, step: str, prediction_type: str) -> tuple[Column, Column]:
        """(score, prediction) as native Spark expressions; a null or NaN feature fails the batch,
        as the model itself refuses it."""
        margin = None
        for name, weight in zip(self.inputs, self.weights):
            term = F.col(f"`{name}`").cast("double") * F.lit(weight)
            margin = term if margin is None else margin + term
        assert margin is not None
        margin = margin + F.lit(self.intercept)
        score = F.lit(1.0) / (F.lit(1.0) + F.exp(-margin))
        invalid = functools.reduce(lambda a, b: a | b, [F.col(f"`{n}`").isNull() | F.isnan(F.col(f"`{n}`"))
                                                        for n in self.inputs])
        score = F.when(invalid, F.raise_error(F.lit(f"score step '{step}': a record has a null or NaN feature "
                                                    f"({', '.join(self.inputs)}), which the model takes none of"))
                       ).otherwise(score)
        positive = score > F.lit(self.threshold) if self.threshold is not None else margin > F.lit(0.0)
        negative_label, positive_label = (F.lit(label).cast(prediction_type) for label in self.labels)
        return score, F.when(positive, positive_label).otherwise(negative_label)


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
                        float(regression.intercept()), (0.0, 1.0), float(regression.getThreshold()))


NUMERIC_FEATURES = ("long", "int", "double", "float")


def sklearn_linear_scorer(model: Any, features: tuple[tuple[str, str], ...]) -> LinearScorer | None:
    """A scikit-learn model as a ``LinearScorer``, when it is exactly a binary
    ``LogisticRegression`` over numeric features, fitted on them in the manifest's order."""
    try:
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        return None
    names = tuple(name for name, _ in features)
    fitted_on = getattr(model, "feature_names_in_", None)
    if (type(model) is not LogisticRegression or len(model.classes_) != 2 or model.coef_.shape != (1, len(names))
            or any(kind not in NUMERIC_FEATURES for _, kind in features)
            or (fitted_on is not None and tuple(fitted_on) != names)):
        return None
    labels = tuple(label.item() if hasattr(label, "item") else label for label in model.classes_)
    return LinearScorer(names, tuple(float(w) for w in model.coef_[0]), float(model.intercept_[0]),
                        (labels[0], labels[1]), None)


def _linear_scored(df: DataFrame, node: ScoreNode, version: int, linear: LinearScorer) -> DataFrame:
    score, prediction = linear.columns(node.name, node.prediction)
    return df.select(*[F.col(f"`{name}`") for name in df.columns], score.alias(SCORE), prediction.alias(PREDICTION),
                     F.lit(version).cast("long").alias(MODEL_VERSION))


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
        return _linear_scored(df, node, version, linear)
    scored = DataFrame(_SPARK_MODELS[key].transform(df._jdf), df.sparkSession)
    if "probability" in scored.columns:
        probabilities = vector_to_array(F.col("probability"))
        score = F.when(F.size(probabilities) == 2, probabilities[1]).otherwise(F.array_max(probabilities))
    else:
        score = F.col("prediction").cast("double")
    return scored.select(*[F.col(f"`{name}`") for name in df.columns], score.alias(SCORE),
                         F.col("prediction").cast("double").alias(PREDICTION),
                         F.lit(version).cast("long").alias(MODEL_VERSION))
