"""The Titanic lab: train a model on history with scikit-learn, publish it to a model registry,
score a stream of passengers with it in headrace, and check the streamed scores against the
model's own on the same rows. docs/ml.md shows it. Needs the ml extra (scikit-learn and the
Titanic data of bokeh_sampledata): pip install -e '.[ml]'

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

pipeline = hr.Pipeline("titanic_scoring")
(pipeline.source("passengers", hr.sources.Files(os.path.join(work, "in"), schema="passenger long, class string, "
                                                "sex string, age double", bounded=True))
 .score(registry)
 .sink("scores", TestSink()))

if __name__ == "__main__":
    scored = {row["passenger"]: row for row in run_to_completion(pipeline)["scores"]}
    streamed = np.array([scored[p]["score"] for p in held_out["passenger"]])
    predicted = np.array([scored[p]["prediction"] for p in held_out["passenger"]])
    print(f"held-out passengers: {len(held_out)}")
    print(f"scikit-learn on them: AUC {auc:.3f}, accuracy {accuracy:.3f}")
    print(f"scored in the stream: {len(scored)} passengers by model version "
          f"{', '.join(str(v) for v in sorted({row['model_version'] for row in scored.values()}))}")
    print(f"largest difference from predict_proba: {np.abs(streamed - expected).max():.1e}; "
          f"predictions that differ: {int((predicted != model.predict(held_out[FEATURES])).sum())}")
