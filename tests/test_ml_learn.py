"""Online learning per key (``keyed.learn``, docs/ml.md) against River run alone in plain Python
on the same records: predictions, the prequential metric, the drift flag and the records seen,
in event-time order per key and micro-batch, also across a SIGKILL of the driver."""

from __future__ import annotations

import datetime
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

river = pytest.importorskip("river", reason="the ml extra: pip install -e '.[ml]'")
from river import drift as river_drift  # noqa: E402
from river import linear_model, metrics  # noqa: E402

SCHEMA = {"user": "string", "x1": "double", "x2": "double", "clicked": "boolean", "ts": "long"}
FLIP_AT = 200  # from this record on, the concept flips: the label is the opposite of what it was


def records(count: int = 200) -> list[dict[str, Any]]:
    """Two users; the label is x1 > x2 until FLIP_AT, its opposite after. Times come out of order
    within each group of ten."""
    rows = []
    for i in range(count):
        x1, x2 = (i * 37 % 101) / 101, (i * 53 % 97) / 97
        rows.append({"user": "ab"[i % 2], "x1": x1, "x2": x2, "clicked": (x1 > x2) != (i >= FLIP_AT),
                     "ts": 1_000 * (i // 10 * 10 + (i * 7) % 10)})
    return rows


def batches(rows: list[dict[str, Any]], size: int = 40) -> list[list[dict[str, Any]]]:
    return [rows[i:i + size] for i in range(0, len(rows), size)]


def model_rows(groups: list[list[dict[str, Any]]], drift: bool = False) -> list[tuple[Any, ...]]:
    """River alone: per user, each micro-batch's records by time (stable), predict, score, learn."""
    models: dict[str, Any] = {}
    accuracy: dict[str, Any] = {}
    detectors: dict[str, Any] = {}
    seen: dict[str, int] = defaultdict(int)
    out = []
    for group in groups:
        for user in sorted({r["user"] for r in group}):
            for r in sorted((r for r in group if r["user"] == user), key=lambda r: r["ts"]):
                model = models.setdefault(user, linear_model.LogisticRegression())
                metric = accuracy.setdefault(user, metrics.Accuracy())
                x = {"x1": r["x1"], "x2": r["x2"]}
                predicted = model.predict_one(x)
                if predicted is not None:
                    metric.update(r["clicked"], predicted)
                flag = False
                if drift:
                    adwin = detectors.setdefault(user, river_drift.ADWIN())
                    before = adwin.estimation
                    adwin.update(float(predicted != r["clicked"]))
                    flag = adwin.drift_detected and adwin.estimation > before
                model.learn_one(x, r["clicked"])
                seen[user] += 1
                out.append((user, r["ts"], r["clicked"], predicted, metric.get(), flag, seen[user]))
    return sorted(out)


def got_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    def millis(value: Any) -> int:  # a datetime, or the ISO text a Files sink writes
        moment = datetime.datetime.fromisoformat(value) if isinstance(value, str) else value
        return int(moment.timestamp() * 1000)

    return sorted((r["user"], millis(r["ts"]), r["clicked"], r["prediction"], r["metric"], r["drift"], r["seen"])
                  for r in rows)


def test_each_key_learns_online_in_event_time_order_and_flags_the_flip_as_river_alone_does(spark, tmp_path):
    """Two learn steps on one stream in one pipeline: without and with the drift flag."""
    groups = batches(records(400), size=40)
    p = hr.Pipeline("learn_online")
    events = p.source("events", TestSource(groups, schema=SCHEMA), event_time="ts")
    plain, drifting = TestSink(), TestSink()
    for drift, sink in ((False, plain), (True, drifting)):
        (events.key_by("user")
         .learn(lambda: linear_model.LogisticRegression(), label="clicked", features=["x1", "x2"], drift=drift)
         .sink(f"out_{drift}", sink))
    run_to_completion(p, state_dir=str(tmp_path))
    assert got_rows(plain.rows()) == model_rows(groups)
    assert max(r["seen"] for r in plain.rows()) == 200  # records seen = records sent, per user
    rows = got_rows(drifting.rows())
    assert rows == model_rows(groups, drift=True)
    flip_time = min(r["ts"] for r in records(400)[FLIP_AT:])
    flagged = [ts for _, ts, _, _, _, flag, _ in rows if flag]
    assert flagged and min(flagged) >= flip_time, flagged


def test_a_sigkill_of_the_driver_then_a_restart_learns_each_record_once(tmp_path):
    from driver_process import KilledRun

    groups = batches(records())
    folder = tmp_path / "input"
    folder.mkdir()
    for number, group in enumerate(groups):
        write_in_order(folder / f"part-{number:02d}.jsonl", "".join(json.dumps(r) + "\n" for r in group), number)
    args = {"name": "learn_killed", "input": str(folder), "state_dir": str(tmp_path / "state"),
            "out": str(tmp_path / "out")}
    run = KilledRun(Path(__file__).resolve().parent / "learn_driver.py", args, tmp_path / "driver.log")
    run.kill_after(2)
    assert run.committed() < len(groups), "the driver should have been killed mid-stream"
    run.restart_until("every record learnt", lambda: len(run.written()) >= len(records()))
    assert got_rows(run.written()) == model_rows(groups)


@pytest.mark.parametrize("build, message", [
    (lambda k: k.learn(lambda: linear_model.LogisticRegression(), label="bought"),
     r"step 'learn' \(test_ml_learn.py:\d+\): unknown label field 'bought'; the stream from 'key_by' has user, x1, "
     r"x2, clicked, ts"),
    (lambda k: k.learn(lambda: linear_model.LogisticRegression(), label="clicked", features=["x3"]),
     r"unknown feature 'x3'"),
    (lambda k: k.learn(linear_model.LogisticRegression(), label="clicked"),
     r"learn needs a function that makes a River model, e.g. lambda: linear_model.LogisticRegression\(\), got"),
])
@pytest.mark.fast
def test_a_learn_step_that_cannot_run_is_refused_when_the_pipeline_is_built(build, message):
    p = hr.Pipeline("learn_refused")
    keyed = p.source("events", TestSource([records(4)], schema=SCHEMA), event_time="ts").key_by("user")
    with pytest.raises(hr.PlanError) as refused:
        build(keyed)
    assert re.search(message, str(refused.value)), str(refused.value)


def test_one_model_for_the_whole_stream_learns_phishing_as_river_alone_does(spark, tmp_path):
    """River's bundled Phishing set (1,250 records, shipped in the river package), a scaler and a
    logistic regression, one model, one pass: the prequential accuracy River's own
    progressive_val_score gives, 89.28 %."""
    from river import datasets, evaluate, preprocessing

    features = list(next(iter(datasets.Phishing()))[0])
    rows = [{**{k: float(v) for k, v in x.items()}, "phishing": bool(y), "ts": i * 1_000}
            for i, (x, y) in enumerate(datasets.Phishing())]
    p = hr.Pipeline("learn_phishing")
    out = TestSink()
    schema = {**{f: "double" for f in features}, "phishing": "boolean", "ts": "long"}
    (p.source("sites", TestSource(batches(rows, size=250), schema=schema), event_time="ts")
     .learn(lambda: preprocessing.StandardScaler() | linear_model.LogisticRegression(), label="phishing")
     .sink("out", out))
    run_to_completion(p, state_dir=str(tmp_path))
    learnt = sorted(out.rows(), key=lambda r: r["ts"])
    assert [r["seen"] for r in learnt] == list(range(1, len(rows) + 1))
    alone = evaluate.progressive_val_score(datasets.Phishing(), preprocessing.StandardScaler()
                                           | linear_model.LogisticRegression(), metrics.Accuracy())
    assert learnt[-1]["metric"] == pytest.approx(alone.get(), abs=1e-12)
    assert abs(learnt[-1]["metric"] - 0.893) <= 0.005
    assert set(learnt[0]) == {"ts", "phishing", "prediction", "metric", "drift", "seen"}


def test_the_drift_flag_rises_within_50_records_of_a_flip_at_record_10000_and_not_before(spark, tmp_path,
                                                                                       monkeypatch):
    """River's SEA stream (seed 42), 20,000 records, the concept flipped at record 10,000 (the label
    the opposite of what it was), one model for the whole stream: the flag first rises within 50
    records of the flip, never before it; predictions and flags as River alone makes them, and
    the flags counted in the server's metrics (from the progress log)."""
    from river import datasets, preprocessing

    from headrace.server.metrics import Metrics
    from headrace.server.registry import RUNNING, Entry

    monkeypatch.setenv("HEADRACE_PROGRESS_LOG", str(tmp_path / "progress.jsonl"))

    flip = 10_000
    rows = [{"a": x[0], "b": x[1], "c": x[2], "alarm": y != (i >= flip), "ts": i * 1_000}
            for i, (x, y) in enumerate(datasets.synth.SEA(variant=0, seed=42).take(2 * flip))]

    def model():
        return preprocessing.StandardScaler() | linear_model.LogisticRegression()

    p = hr.Pipeline("learn_sea_flip")
    out = TestSink()
    schema = {"a": "double", "b": "double", "c": "double", "alarm": "boolean", "ts": "long"}
    (p.source("readings", TestSource(batches(rows, size=5_000), schema=schema), event_time="ts")
     .learn(model, label="alarm", features=["a", "b", "c"], drift=True)
     .sink("out", out))
    run_to_completion(p, state_dir=str(tmp_path))
    learnt = sorted(out.rows(), key=lambda r: r["ts"])
    flagged = [i for i, r in enumerate(learnt) if r["drift"]]
    assert flagged and flip <= flagged[0] < flip + 50, flagged[:5]
    alone, adwin, predictions, flags = model(), river_drift.ADWIN(), [], 0
    for r in rows:
        x = {k: r[k] for k in ("a", "b", "c")}
        predictions.append(alone.predict_one(x))
        before = adwin.estimation
        adwin.update(float(predictions[-1] != r["alarm"]))
        flags += adwin.drift_detected and adwin.estimation > before
        alone.learn_one(x, r["alarm"])
    assert [r["prediction"] for r in learnt] == predictions
    assert len(flagged) == flags
    metrics = Metrics("progress.jsonl")
    entry = Entry("learn_sea_flip", "/x.py", str(tmp_path), RUNNING, True)
    assert metrics.figures(entry)["steps"]["learn"]["drift_flags_total"] == flags
    assert f'headrace_drift_flags_total{{pipeline="learn_sea_flip",step="learn"}} {flags}' in metrics.exposition(
        [entry], {}).splitlines()
