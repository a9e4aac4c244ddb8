"""A model registry: a directory of published model versions, each complete or absent.

    <registry>/model-v0001/model.pkl       a scikit-learn model (cloudpickle), or
    <registry>/model-v0001/spark_model/    a Spark MLlib PipelineModel (its own format)
    <registry>/model-v0001/manifest.json   version, flavor, features and their types, the
                                           prediction's type, metrics, creation time, the
                                           model's class

``publish`` writes a version into a hidden temporary directory and renames it into place, so a
reader (a running pipeline's next micro-batch) sees a version whole or not at all. Versions are
numbered 1, 2, ... in the order they are published; the newest is the highest.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

import cloudpickle

from headrace.errors import PlanError

MODEL_FILE, SPARK_MODEL_DIR, MANIFEST_FILE = "model.pkl", "spark_model", "manifest.json"
SKLEARN, SPARK = "sklearn", "spark"  # a version's flavor: scored in Python workers, or by Spark itself
_VERSION_DIR = re.compile(r"^model-v(\d{4,})$")
# the Spark types a feature or a prediction may have, by numpy's kind of dtype
_KINDS = {"i": "long", "u": "long", "f": "double", "b": "boolean", "O": "string", "U": "string", "S": "string"}


@dataclass(frozen=True)
class Manifest:
    """What a published version says of itself."""

    version: int
    features: tuple[tuple[str, str], ...]  # (name, Spark type), in the order the model reads them
    prediction: str  # the Spark type of its predictions
    metrics: dict[str, float]
    created: str
    model_class: str
    flavor: str = SKLEARN

    @property
    def feature_names(self) -> list[str]:
        return [name for name, _ in self.features]


def version_dir(registry: str, version: int) -> str:
    return os.path.join(registry, f"model-v{version:04d}")


def versions(registry: str) -> list[int]:
    """The versions published in ``registry``, oldest first ([] when none, or no such directory)."""
    try:
        names = os.listdir(registry)
    except FileNotFoundError:
        return []
    found = [int(m.group(1)) for m in map(_VERSION_DIR.match, names) if m]
    return sorted(v for v in found if os.path.exists(os.path.join(version_dir(registry, v), MANIFEST_FILE)))


def latest_version(registry: str) -> int | None:
    return max(versions(registry), default=None)


@functools.lru_cache(maxsize=256)
def manifest(registry: str, version: int) -> Manifest:
    """A published version's manifest. A version never changes once published, so each is read
    once per process (a score step asks for it in every micro-batch)."""
    with open(os.path.join(version_dir(registry, version), MANIFEST_FILE)) as handle:
        data = json.load(handle)
    return Manifest(data["version"], tuple((f["name"], f["type"]) for f in data["features"]), data["prediction"],
                    dict(data.get("metrics") or {}), data["created"], data["model_class"],
                    data.get("flavor", SKLEARN))


def spark_model_path(registry: str, version: int) -> str:
    """Where a Spark MLlib version's PipelineModel is saved (MLlib's own format)."""
    return os.path.join(version_dir(registry, version), SPARK_MODEL_DIR)


def load_model(registry: str, version: int) -> Any:
    """The model of a version: a scikit-learn model, or a Spark ``PipelineModel`` (which needs a
    Spark session)."""
    if os.path.isdir(spark_model_path(registry, version)):
        from pyspark.ml import PipelineModel

        return PipelineModel.load(spark_model_path(registry, version))
    with open(os.path.join(version_dir(registry, version), MODEL_FILE), "rb") as handle:
        return cloudpickle.load(handle)


def is_spark_model(model: Any) -> bool:
    return type(model).__module__.startswith("pyspark.ml")


def publish(registry: str, model: Any, features: Any, *, metrics: dict[str, float] | None = None) -> int:
    """Publish ``model`` as the registry's next version, atomically, and return its number:
    a fitted scikit-learn estimator or pipeline (``predict``, and ``predict_proba`` for a
    classifier's score), or a Spark MLlib ``PipelineModel`` (scored by Spark itself).
    ``features``: the columns the model reads, in order, as a DataFrame of training rows
    (pandas or Spark: their names and types are taken from it) or a mapping of name to Spark
    type (``{"age": "double", "sex": "string"}``)."""
    registry = os.path.abspath(os.fspath(registry))
    typed = _features(features)
    spark = is_spark_model(model)
    if spark and type(model).__name__ != "PipelineModel":
        raise PlanError(f"publish: a Spark MLlib model is published as a fitted pyspark.ml PipelineModel (fit a "
                        f"Pipeline of its stages), got {type(model).__name__}")
    if not spark and not hasattr(model, "predict"):
        raise PlanError(f"publish: the model must have a predict method (a fitted scikit-learn estimator or "
                        f"pipeline), or be a Spark MLlib PipelineModel, got {type(model).__name__}")
    os.makedirs(registry, exist_ok=True)
    staging = os.path.join(registry, f".publishing-{uuid.uuid4().hex}")
    os.makedirs(staging)
    try:
        if spark:
            model.write().save(os.path.join(staging, SPARK_MODEL_DIR))  # (spark_model_path once renamed)
        else:
            with open(os.path.join(staging, MODEL_FILE), "wb") as handle:
                cloudpickle.dump(model, handle)
        while True:
            version = (latest_version(registry) or 0) + 1
            record = {"version": version, "flavor": SPARK if spark else SKLEARN,
                      "features": [{"name": n, "type": t} for n, t in typed],
                      "prediction": "double" if spark else _prediction_type(model), "metrics": metrics or {},
                      "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                      "model_class": f"{type(model).__module__}.{type(model).__qualname__}"}
            with open(os.path.join(staging, MANIFEST_FILE), "w") as handle:
                json.dump(record, handle, indent=1)
            try:
                os.rename(staging, version_dir(registry, version))  # fails when another publish took it
                return version
            except OSError:
                if not os.path.exists(version_dir(registry, version)):
                    raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# Spark's names of the types a Spark DataFrame's ``dtypes`` gives, in headrace's schema names
_SPARK_NAMES = {"bigint": "long", "int": "long", "smallint": "long", "tinyint": "long", "float": "double"}


def _features(features: Any) -> tuple[tuple[str, str], ...]:
    if hasattr(features, "dtypes") and isinstance(features.dtypes, list):  # a Spark DataFrame
        return tuple((str(name), _SPARK_NAMES.get(str(kind), str(kind))) for name, kind in features.dtypes)
    if hasattr(features, "dtypes") and hasattr(features, "columns"):  # a pandas DataFrame
        return tuple((str(name), _KINDS.get(dtype.kind, "string")) for name, dtype in features.dtypes.items())
    if isinstance(features, dict) and features:
        return tuple((str(name), str(kind)) for name, kind in features.items())
    raise PlanError("publish: features must be a DataFrame of training rows (pandas or Spark) or a mapping of each "
                    f"feature's name to its type, got {type(features).__name__}")


def _prediction_type(model: Any) -> str:
    classes = getattr(model, "classes_", None)
    if classes is None:
        return "double"  # a regressor
    dtype = getattr(classes, "dtype", None)
    return _KINDS.get(dtype.kind if dtype is not None else "O", "string")
