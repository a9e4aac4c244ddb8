"""The Titanic lab: train a model on history with scikit-learn, and another with Spark MLlib,
publish each to a model registry, score a stream of passengers with each in headrace, and check
the streamed scores against each model's own on the same rows. docs/ml.md shows it. Needs the
ml extra (scikit-learn and the Titanic data of bokeh_sampledata): pip install -e '.[ml]'

    python examples/titanic_scoring.py
"""

import json
import os
import tempfile

import numpy as np
from bokeh_sampledata.titanic import data as titanic
from sklearn.compose import make_column_transformer
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import accuracy_score, roc_auc_score
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder

import headrace as hr
from headrace.environment.session import get_session
from headrace.testing import TestSink, run_to_completion

FEATURES = ["class", "sex", "age"]
work = tempfile.mkdtemp(prefix="titanic-")
registry = os.path.join(work, "models")

# 1. train on 80 % of the passengers (stratified by survival), hold out the other 20 %
passengers = titanic.reset_index(names="passenger")
train, held_out = train_test_split(passengers, test_size=0.2, stratify=passengers["survived"], random_state=0)
model = make_pipeline(
    make_column_transformer((OneHotEncoder(), ["class", "sex"]),
                            (SimpleImputer(strategy="median", add_indicator=True), ["age"])),
    LogisticRegression(max_iter=1000))
model.fit(train[FEATURES], train["survived"])
expected = model.predict_proba(held_out[FEATURES])[:, 1]
auc = roc_auc_score(held_out["survived"], expected)
accuracy = accuracy_score(held_out["survived"], model.predict(held_out[FEATURES]))

# 2. publish it: the registry's version 1, with its features' names and types
version = hr.ml.publish(registry, model, train[FEATURES], metrics={"auc": auc, "accuracy": accuracy})

# 3. the held-out passengers arrive as JSON lines, in two files; headrace scores them
os.makedirs(os.path.join(work, "in"))
half = len(held_out) // 2
for part, rows in enumerate([held_out.iloc[:half], held_out.iloc[half:]]):
    with open(os.path.join(work, "in", f"part-{part}.jsonl"), "w") as out:
        for row in rows.to_dict("records"):
            age = None if np.isnan(row["age"]) else row["age"]
            out.write(json.dumps({"passenger": row["passenger"], "class": row["class"], "sex": row["sex"],
                                  "age": age}) + "\n")



def scoring(name: str) -> hr.Pipeline:
    """The held-out passengers' files, scored with the registry's newest model."""
    pipeline = hr.Pipeline(name)
    (pipeline.source("passengers", hr.sources.Files(os.path.join(work, "in"), schema="passenger long, "
                                                    "class string, sex string, age double", bounded=True))
     .score(registry)
     .sink("scores", TestSink()))
    return pipeline


pipeline = scoring("titanic_sklearn")  # headrace explain examples/titanic_scoring.py shows it


def report(scored: dict, expected: np.ndarray, predictions: np.ndarray, of: str) -> None:
    streamed = np.array([scored[p]["score"] for p in held_out["passenger"]])
    predicted = np.array([scored[p]["prediction"] for p in held_out["passenger"]])
    print(f"scored in the stream: {len(scored)} passengers by model version "
          f"{', '.join(str(v) for v in sorted({row['model_version'] for row in scored.values()}))}")
    print(f"largest difference from {of}: {np.abs(streamed - expected).max():.1e}; "
          f"predictions that differ: {int((predicted != predictions).sum())}")


if __name__ == "__main__":
    print(f"held-out passengers: {len(held_out)}")
    print(f"scikit-learn on them: AUC {auc:.3f}, accuracy {accuracy:.3f}")
    scored = {row["passenger"]: row for row in run_to_completion(pipeline)["scores"]}
    report(scored, expected, model.predict(held_out[FEATURES]), "predict_proba")

    # 4. the same with Spark MLlib: a PipelineModel, published as version 2, scored by Spark itself
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression as SparkLogisticRegression
    from pyspark.ml.feature import Imputer, StringIndexer, VectorAssembler
    from pyspark.ml.feature import OneHotEncoder as SparkOneHotEncoder
    from pyspark.ml.functions import vector_to_array

    spark = get_session()
    columns = ["passenger", "class", "sex", "age", "survived"]
    train_frame = spark.createDataFrame(train[columns].astype(object).where(train[columns].notna(), None))
    held_out_frame = spark.createDataFrame(held_out[columns].astype(object).where(held_out[columns].notna(), None))
    mllib = Pipeline(stages=[
        StringIndexer(inputCols=["class", "sex"], outputCols=["class_index", "sex_index"]),
        SparkOneHotEncoder(inputCols=["class_index", "sex_index"], outputCols=["class_vector", "sex_vector"]),
        Imputer(inputCols=["age"], outputCols=["age_filled"], strategy="median"),
        VectorAssembler(inputCols=["class_vector", "sex_vector", "age_filled"], outputCol="features"),
        SparkLogisticRegression(labelCol="survived", maxIter=100)]).fit(train_frame)
    own = {r["passenger"]: r for r in mllib.transform(held_out_frame).select(
        "passenger", vector_to_array("probability")[1].alias("score"), "prediction").collect()}
    own_scores = np.array([own[p]["score"] for p in held_out["passenger"]])
    own_predictions = np.array([own[p]["prediction"] for p in held_out["passenger"]])
    spark_auc = roc_auc_score(held_out["survived"], own_scores)
    spark_accuracy = accuracy_score(held_out["survived"], own_predictions)
    hr.ml.publish(registry, mllib, train_frame.select(*FEATURES), metrics={"auc": spark_auc})
    print(f"Spark MLlib on them: AUC {spark_auc:.3f}, accuracy {spark_accuracy:.3f}")
    scored = {row["passenger"]: row for row in run_to_completion(scoring("titanic_mllib"))["scores"]}
    report(scored, own_scores, own_predictions, "the model's own probability")
