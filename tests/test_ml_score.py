"""The score step (docs/ml.md): records scored as scikit-learn scores them in one batch, a model
published while the pipeline runs taken from the next micro-batch, a replayed micro-batch scored
with the version recorded for it, and what is refused when the pipeline is built."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import headrace as hr
from headrace.testing import TestSink, TestSource

sklearn = pytest.importorskip("sklearn", reason="the ml extra: pip install -e '.[ml]'")
from sklearn.linear_model import LinearRegression, LogisticRegression  # noqa: E402

SCHEMA = {"id": "long", "x": "double", "y": "double"}
ROWS = [{"id": i, "x": (i * 37 % 101) / 10 - 5, "y": (i * 53 % 97) / 10 - 4.5} for i in range(60)]
BATCHES = [ROWS[:20], ROWS[20:40], ROWS[40:]]


def trained(flip: bool = False) -> LogisticRegression:
    """A classifier of the sign of x + y (of its opposite, flipped)."""
    frame = pd.DataFrame(ROWS)[["x", "y"]]
    labels = ((frame["x"] + frame["y"] > 0) != flip).astype(int)
    return LogisticRegression().fit(frame, labels)


def expected(model: LogisticRegression, rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    frame = pd.DataFrame(rows)[["x", "y"]]
    return model.predict_proba(frame)[:, 1], model.predict(frame)


def scored(registry: Path, name: str) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    out = TestSink()
    p.source("points", TestSource(BATCHES, schema=SCHEMA)).score(str(registry)).sink("out", out)
    return p, out


def test_a_stream_is_scored_as_the_model_scores_the_rows_in_one_batch(spark, tmp_path, monkeypatch):
    from headrace.server.metrics import Metrics
    from headrace.server.registry import RUNNING, Entry

    monkeypatch.setenv("HEADRACE_PROGRESS_LOG", str(tmp_path / "progress.jsonl"))
    model = trained()
    assert hr.ml.publish(tmp_path / "models", model, pd.DataFrame(ROWS)[["x", "y"]], metrics={"auc": 1.0}) == 1
    manifest = hr.ml.manifest(str(tmp_path / "models"), 1)
    assert manifest.features == (("x", "double"), ("y", "double")) and manifest.prediction == "long"
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from headrace.spark.score_lowering import sklearn_linear_scorer

    # a bare binary logistic regression is scored as a native expression; a pipeline, in Python workers
    assert sklearn_linear_scorer(model, manifest.features) is not None
    assert sklearn_linear_scorer(make_pipeline(StandardScaler(), trained()), manifest.features) is None
    p, out = scored(tmp_path / "models", "scored")
    assert "score   score with the newest model in" in p.explain()
    hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")
    rows = sorted(out.rows(), key=lambda r: r["id"])
    score, prediction = expected(model, ROWS)
    assert [r["id"] for r in rows] == [r["id"] for r in ROWS]
    assert max(abs(r["score"] - s) for r, s in zip(rows, score)) <= 1e-12
    assert [r["prediction"] for r in rows] == prediction.tolist()
    assert {r["model_version"] for r in rows} == {1}
    metrics = Metrics("progress.jsonl")  # the version each batch was scored with, in the server's metrics
    entry = Entry("scored", "/x.py", str(tmp_path), RUNNING, True)
    assert metrics.figures(entry)["steps"]["score"]["model_version"] == 1
    assert 'headrace_model_version{pipeline="scored",step="score"} 1' in metrics.exposition([entry], {}).splitlines()


def test_a_spark_mllib_pipeline_model_scores_in_spark_as_it_transforms_the_rows_in_one_batch(spark, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression as SparkLogisticRegression
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.functions import vector_to_array

    frame = spark.createDataFrame([(r["id"], r["x"], r["y"], float(r["x"] + r["y"] > 0)) for r in ROWS],
                                  "id long, x double, y double, label double")
    model = Pipeline(stages=[VectorAssembler(inputCols=["x", "y"], outputCol="features"),
                             SparkLogisticRegression(maxIter=20)]).fit(frame)
    assert hr.ml.publish(tmp_path / "models", model, frame.select("x", "y")) == 1
    manifest = hr.ml.manifest(str(tmp_path / "models"), 1)
    assert (manifest.flavor, manifest.features, manifest.prediction) == ("spark", (("x", "double"), ("y", "double")),
                                                                        "double")
    p, out = scored(tmp_path / "models", "scored_by_spark")
    hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")
    rows = {r["id"]: r for r in out.rows()}
    batch = model.transform(frame).select("id", vector_to_array("probability")[1].alias("p"), "prediction").collect()
    assert sorted(rows) == sorted(r["id"] for r in ROWS)
    assert max(abs(rows[r["id"]]["score"] - r["p"]) for r in batch) <= 1e-12
    assert all(rows[r["id"]]["prediction"] == r["prediction"] for r in batch)
    assert {r["model_version"] for r in rows.values()} == {1}


def test_an_mllib_model_other_than_assembler_and_logistic_regression_is_scored_by_its_transform_and_a_null_fails(
        spark, tmp_path):
    """An assembler and a binary logistic regression are scored as a native expression
    (``linear_scorer``); with a scaler between them, by the model's own transform: both equal the
    model's transform within 1e-12. A null feature fails the batch, as MLlib's assembler does."""
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression as SparkLogisticRegression
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from pyspark.ml.functions import vector_to_array

    from headrace.spark.score_lowering import linear_scorer

    frame = spark.createDataFrame([(r["id"], r["x"], r["y"], float(r["x"] - r["y"] > 0)) for r in ROWS],
                                  "id long, x double, y double, label double")
    assembler = VectorAssembler(inputCols=["x", "y"], outputCol="raw")
    scaled = Pipeline(stages=[assembler, StandardScaler(inputCol="raw", outputCol="features"),
                              SparkLogisticRegression(maxIter=20)]).fit(frame)
    linear = Pipeline(stages=[assembler, SparkLogisticRegression(maxIter=20, featuresCol="raw")]).fit(frame)
    assert linear_scorer(scaled._to_java()) is None and linear_scorer(linear._to_java()) is not None
    hr.ml.publish(tmp_path / "models", scaled, frame.select("x", "y"))
    p, out = scored(tmp_path / "models", "scored_with_a_scaler")
    hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")
    rows = {r["id"]: r for r in out.rows()}
    batch = scaled.transform(frame).select("id", vector_to_array("probability")[1].alias("p"), "prediction").collect()
    assert max(abs(rows[r["id"]]["score"] - r["p"]) for r in batch) <= 1e-12
    assert all(rows[r["id"]]["prediction"] == r["prediction"] for r in batch)

    hr.ml.publish(tmp_path / "linear", linear, frame.select("x", "y"))
    p = hr.Pipeline("null_feature")
    with_null = [[{"id": 1, "x": 1.0, "y": 2.0}, {"id": 2, "x": None, "y": 2.0}]]
    p.source("points", TestSource(with_null, schema=SCHEMA)).score(str(tmp_path / "linear")).sink("out", TestSink())
    with pytest.raises(hr.HeadraceError, match=r"score step 'score': a record has a null or NaN feature "
                                               r"\(x, y\), which the model takes none of"):
        hr.run(p, state_dir=str(tmp_path / "state_null"), progress="quiet")


def slow(rows: pd.DataFrame) -> pd.DataFrame:
    """The identity, two seconds late: a micro-batch scored with it is long enough to be killed in."""
    import time

    time.sleep(2)
    return rows


def test_a_sigkill_while_a_batch_is_scored_rescores_it_with_its_version_and_the_next_with_the_newest(tmp_path,
                                                                                                    monkeypatch):
    """Four files, a micro-batch each. v1 scores files 0-1; v2, published after them, file 2, whose
    batch is killed (SIGKILL of the driver's process group) once its version is recorded and before
    its sink commits; v3 is published before the restart. The restart scores file 2 again with v2,
    file 3 with v3; every record is written once, with its version's score."""
    import json
    import os
    import time

    import cloudpickle  # the one hr.ml.publish pickles models with
    from driver_process import Driver, KilledRun
    from input_files import write_in_order
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    from headrace.connectors.files_sink import read_rows

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ``slow`` travels inside the model
    registry, folder = str(tmp_path / "models"), tmp_path / "input"
    folder.mkdir()
    frame = pd.DataFrame(ROWS)[["x", "y"]]
    models = {1: trained(), 2: trained(flip=True),
              3: LogisticRegression(C=0.01).fit(frame, [r["id"] % 2 for r in ROWS])}
    files = [ROWS[i:i + 15] for i in range(0, 60, 15)]

    def write_file(number: int) -> None:
        write_in_order(folder / f"part-{number}.jsonl", "".join(json.dumps(r) + "\n" for r in files[number]), number)

    args = {"name": "score_killed", "input": str(folder), "registry": registry, "state_dir": str(tmp_path / "state"),
            "out": str(tmp_path / "out")}
    monkeypatch.setenv("HEADRACE_PROGRESS_LOG", str(tmp_path / "progress.jsonl"))  # the drivers' figures
    script = Path(__file__).resolve().parent / "score_driver.py"
    written = lambda: read_rows(args["out"], "jsonl") if os.path.isdir(args["out"]) else []  # noqa: E731
    hr.ml.publish(registry, models[1], {"x": "double", "y": "double"})
    write_file(0)
    write_file(1)
    driver = Driver(script, args, tmp_path / "driver.log")
    try:
        driver.wait_for("files 0 and 1 scored", lambda: len(written()) == 30)
        hr.ml.publish(registry, make_pipeline(FunctionTransformer(slow), models[2]), {"x": "double", "y": "double"})
        write_file(2)
        recorded = tmp_path / "state" / "score_killed" / "checkpoint" / "models" / "score"
        driver.wait_for("file 2's version recorded", lambda: any(f.read_text() == "2" for f in recorded.glob("*")))
        time.sleep(0.5)
    finally:
        driver.kill()
    assert len(written()) == 30, "the batch of file 2 committed before the kill"
    hr.ml.publish(registry, models[3], {"x": "double", "y": "double"})
    write_file(3)
    KilledRun(script, args, tmp_path / "driver.log").restart_until("every file scored", lambda: len(written()) >= 60)
    rows = written()
    assert sorted(r["id"] for r in rows) == [r["id"] for r in ROWS]
    version_of = {r["id"]: version for f, version in zip(files, (1, 1, 2, 3)) for r in f}
    assert {r["id"]: r["model_version"] for r in rows} == version_of
    for r in rows:
        score, prediction = expected(models[r["model_version"]], [r])
        assert abs(r["score"] - score[0]) <= 1e-12 and r["prediction"] == prediction[0]
    figures = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    by_batch = {f["batch"]: f["model_versions"]["score"] for f in figures if f.get("model_versions")}
    assert [by_batch[b] for b in sorted(by_batch)][-2:] == [2, 3]  # file 2's batch (replayed) with v2, file 3's v3


@pytest.mark.parametrize("build, message", [
    (lambda s, registry: s.score(registry + "/none"),
     r"step 'score' \(test_ml_score.py:\d+\): the registry \S+/none holds no model: publish one with "
     r"hr.ml.publish\(registry, model, features\) before building the pipeline"),
    (lambda s, registry: s.score(registry, features=["y", "x"]),
     r"the model \(version 1 in \S+\) reads x, y, in that order; features= names y, x"),
    (lambda s, registry: s.select("id", "x").score(registry),
     r"unknown feature 'y'; the stream from 'select' has id, x"),
    (lambda s, registry: s.select("id", "x", "y", score=hr.col("x")).score(registry),
     r"the stream already has a field 'score', which the score step adds \(score, prediction, model_version\)"),
])
@pytest.mark.fast
def test_a_score_step_the_registry_cannot_serve_is_refused_when_the_pipeline_is_built(tmp_path, build, message):
    hr.ml.publish(tmp_path / "models", LinearRegression().fit(pd.DataFrame(ROWS)[["x", "y"]], [r["id"] for r in ROWS]),
                  {"x": "double", "y": "double"})
    p = hr.Pipeline("refused_score")
    with pytest.raises(hr.PlanError) as refused:
        build(p.source("points", TestSource(BATCHES, schema=SCHEMA)), str(tmp_path / "models"))
    assert re.search(message, str(refused.value)), str(refused.value)


@pytest.mark.fast
def test_a_stateful_step_after_a_score_step_is_refused_with_the_reason(tmp_path):
    hr.ml.publish(tmp_path / "models", trained(), {"x": "double", "y": "double"})
    p = hr.Pipeline("score_then_window")
    timed = {**SCHEMA, "ts": "timestamp"}
    points = p.source("points", TestSource(BATCHES, schema=timed), event_time="ts")
    scored_points = points.score(str(tmp_path / "models"))
    scored_points.key_by("prediction").window(hr.Tumbling("10s"), name="per_class").count().sink("out", TestSink())
    with pytest.raises(hr.PlanError) as refused:
        p.validate()
    assert re.fullmatch(r"step 'per_class' \(test_ml_score.py:\d+\): this step reads the output of score step 'score' "
                        r"\(test_ml_score.py:\d+\); score steps run in each micro-batch after Spark's streaming query, "
                        r"and a window aggregate step runs inside that query; put it before the score step, or sink "
                        r"the score step's output and continue in another pipeline", str(refused.value)), \
        str(refused.value)


def test_publish_refuses_what_it_cannot_serve(tmp_path):
    with pytest.raises(hr.PlanError, match="the model must have a predict method"):
        hr.ml.publish(tmp_path, object(), {"x": "double"})
    from pyspark.ml.feature import VectorAssembler

    with pytest.raises(hr.PlanError, match="a Spark MLlib model is published as a fitted pyspark.ml PipelineModel"):
        hr.ml.publish(tmp_path, VectorAssembler(inputCols=["x"], outputCol="v"), {"x": "double"})
    with pytest.raises(hr.PlanError, match=r"features must be a DataFrame of training rows \(pandas or Spark\) or a "
                                           r"mapping"):
        hr.ml.publish(tmp_path, trained(), ["x", "y"])
    assert hr.ml.versions(str(tmp_path)) == []
