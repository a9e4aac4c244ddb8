"""Rolling features per key over a span of event time (``keyed.rolling``, docs/ml.md), on a
bounded and an unbounded input, against Spark's range window over the whole input in one batch
query (not headrace's lowering)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

S = 1_000
SPAN = 30 * S
# three cards, 60 charges over 100 s in six files (a micro-batch each), out of order by up to 4 s
CHARGES = [{"card": "abc"[i % 3], "amount": (i * 37) % 50 + 1, "ts": i * 1_700 + ((i * 5) % 9 - 4) * 500}
           for i in range(60)]


def write(folder: Path, rows: list[dict[str, Any]], files: int = 6, first: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    size = len(rows) // files
    for number in range(files):
        part = rows[number * size:(number + 1) * size]
        write_in_order(folder / f"part-{first + number:02d}.jsonl", "".join(json.dumps(r) + "\n" for r in part),
                       first + number)


def pipeline(name: str, folder: Path, bounded: bool) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    out = TestSink()
    (p.source("charges", hr.sources.Files(str(folder), "jsonl", "card string, amount long, ts long", bounded=bounded,
                                          max_files_per_batch=1), event_time="ts", max_out_of_orderness="5s")
     .key_by("card")
     .rolling("30s", spend=hr.sum("amount"), charges=hr.count(), average=hr.mean("amount"), largest=hr.max("amount"))
     .sink("out", out))
    return p, out


def rows(sink: TestSink) -> list[tuple[Any, ...]]:
    return sorted((r["card"], int(r["ts"].timestamp() * 1000), r["amount"], r["spend"], r["charges"],
                   round(r["average"], 9), r["largest"]) for r in sink.rows())


def range_window(spark: Any, folder: Path) -> list[tuple[Any, ...]]:
    """Spark's range window over the whole input, in one batch query."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    charges = spark.read.schema("card string, amount long, ts long").json(str(folder))
    span = Window.partitionBy("card").orderBy("ts").rangeBetween(-(SPAN - 1), 0)  # (t - 30 s, t], in ms
    result = charges.select("card", "ts", "amount", F.sum("amount").over(span), F.count("*").over(span),
                            F.avg("amount").over(span), F.max("amount").over(span)).collect()
    return sorted((r[0], r[1], r[2], r[3], r[4], round(r[5], 9), r[6]) for r in result)


def test_rolling_features_are_a_range_window_on_bounded_and_unbounded_input(spark, tmp_path):
    write(tmp_path / "in", CHARGES)
    expected = range_window(spark, tmp_path / "in")
    assert len(expected) == 60 and max(r[4] for r in expected) > 3  # windows that hold several charges

    bounded, out = pipeline("rolling_bounded", tmp_path / "in", bounded=True)
    PipelineRun(bounded, state_dir=str(tmp_path / "state_b"), progress="quiet").start().wait(until_exhausted=True)
    assert rows(out) == expected

    # unbounded: the last charges wait for the watermark to pass them; a later charge of another card moves it
    unbounded, out = pipeline("rolling_unbounded", tmp_path / "in", bounded=False)
    run = PipelineRun(unbounded, state_dir=str(tmp_path / "state_u"), progress="quiet").start()
    run.settle()
    assert len(out.rows()) < 60
    write(tmp_path / "in", [{"card": "z", "amount": 1, "ts": 1_000 * S}], files=1, first=6)
    run.settle()
    run.settle()
    run.request_stop("test done")
    run.wait(until_exhausted=False)
    assert [r for r in rows(out) if r[0] != "z"] == expected


@pytest.mark.parametrize("build, message", [
    (lambda k: k.rolling("0s", n=hr.count()), r"over must be a positive duration, got '0s'"),
    (lambda k: k.rolling("1m"), r"give each feature as name=aggregate, e.g. spend=hr.sum\('amount'\)"),
    (lambda k: k.rolling("1m", amount=hr.count()), r"the feature 'amount' has the name of a field of the stream"),
    (lambda k: k.rolling("1m", spend=hr.sum("price")), r"unknown field 'price'"),
])
@pytest.mark.fast
def test_a_rolling_step_that_cannot_run_is_refused_when_the_pipeline_is_built(build, message):
    p = hr.Pipeline("rolling_refused")
    keyed = p.source("charges", TestSource([CHARGES[:3]], schema={"card": "string", "amount": "long", "ts": "long"}),
                     event_time="ts").key_by("card")
    with pytest.raises(hr.PlanError) as refused:
        build(keyed)
    assert re.search(message, str(refused.value)), str(refused.value)
    untimed = p.source("plain", TestSource([CHARGES[:3]], schema={"card": "string", "amount": "long", "ts": "long"}))
    with pytest.raises(hr.PlanError, match=r"step 'rolling\S*' \(test_ml_rolling.py:\d+\): rolling features span "
                                           r"event time"):
        untimed.key_by("card").rolling("1m", n=hr.count())
