"""Rescaling a stopped pipeline's keyed state (Spark's offline state repartition): 2 to 4
partitions and back, with exactly the output of an uninterrupted run."""

from __future__ import annotations

import json

import pytest

import headrace as hr
from headrace.runtime.rescale import rescale, state_partitions
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, Watermark

SCHEMA = {"key": "string", "value": "long", "ts": "timestamp"}
BATCHES = [
    [{"key": k, "value": i, "ts": 1_000 * i} for i, k in enumerate("abcdefgh")],
    [{"key": k, "value": i, "ts": 9_000 + 500 * i} for i, k in enumerate("hgfedcba")],
    Watermark(12_000),
    [{"key": k, "value": 10 + i, "ts": 14_000 + i} for i, k in enumerate("aceg")],
    [{"key": k, "value": 20 + i, "ts": 16_000 + i} for i, k in enumerate("bdfh")],
    Watermark(25_000),
    [{"key": k, "value": 30 + i, "ts": 26_000 + i} for i, k in enumerate("abcdefgh")],
    [{"key": k, "value": 40 + i, "ts": 27_000 + i} for i, k in enumerate("abcd")],
]


def build(name: str) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    out = TestSink()
    (p.source("events", TestSource(BATCHES, schema=SCHEMA), event_time="ts").key_by("key")
     .window(hr.Tumbling("10s"), trigger=hr.AfterWatermark(early=hr.EveryN(2)))
     .aggregate(total=hr.sum("value"), n=hr.count()).sink("out", out))
    return p, out


def rows(sink: TestSink) -> list[str]:
    return sorted(json.dumps(r, default=str, sort_keys=True) for r in sink.rows())


def test_rescale_to_four_partitions_and_back_keeps_exact_results(spark, tmp_path):
    whole, whole_out = build("rescaled")
    hr.testing.run_to_completion(whole, state_dir=str(tmp_path / "whole"))
    assert whole_out.rows()

    state = str(tmp_path / "parts")
    collected: dict[int, list] = {}
    for stop_after, partitions in ((3, 4), (6, 2), (None, None)):
        part, out = build("rescaled")
        out.batches.update(collected)  # the same sink across the restarts
        run = PipelineRun(part, state_dir=state, progress="quiet").start()
        if stop_after is None:
            run.wait(until_exhausted=True)
        else:
            run.wait(until_exhausted=True,
                     on_settled=lambda r, n=stop_after: len(r.progress_log) >= n and r.request_stop("test"))
        collected = dict(out.batches)
        if partitions is not None:
            before = rescale(part, partitions, state_dir=state)
            assert state_partitions(run.checkpoint) == partitions != before
    assert rows(out) == rows(whole_out)


def test_rescale_refuses_what_it_cannot_do(spark, tmp_path):
    p, _ = build("never_ran")
    with pytest.raises(hr.HeadraceError, match=r"rescale 'never_ran': no checkpoint with processed batches at .*; "
                                               r"run the pipeline first"):
        rescale(p, 4, state_dir=str(tmp_path))
    with pytest.raises(hr.HeadraceError, match=r"the number of partitions must be a positive integer, got 0"):
        rescale(p, 0, state_dir=str(tmp_path))
