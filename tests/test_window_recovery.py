"""Recovery of the window processor: count windows, early firings and allowed lateness,
stopped mid-stream and restarted from the checkpoint, give exactly the uninterrupted output."""

from __future__ import annotations

import json

import pytest

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, Watermark

SCHEMA = {"key": "string", "value": "long", "ts": "timestamp"}
BATCHES = [
    [{"key": "a", "value": 1, "ts": 1_000}, {"key": "b", "value": 2, "ts": 1_500}],
    [{"key": "a", "value": 3, "ts": 2_000}, {"key": "a", "value": 4, "ts": 12_000}],
    Watermark(10_000),
    [{"key": "a", "value": 5, "ts": 3_000}, {"key": "b", "value": 6, "ts": 13_000}],  # late for [0, 10s)
    [{"key": "a", "value": 7, "ts": 14_000}, {"key": "b", "value": 8, "ts": 15_000}],
    Watermark(30_000),
    [{"key": "a", "value": 9, "ts": 4_000}],  # too late: the late side output
]


def build(name: str, kind: str) -> tuple[hr.Pipeline, TestSink, TestSink]:
    p = hr.Pipeline(name)
    events = p.source("events", TestSource(BATCHES, schema=SCHEMA), event_time="ts").key_by("key")
    if kind == "count":
        result = events.window(hr.Count(2)).aggregate(total=hr.sum("value"), n=hr.count())
    else:
        result = events.window(hr.Tumbling("10s"), trigger=hr.AfterWatermark(early=hr.EveryN(2)),
                               allowed_lateness="5s").aggregate(total=hr.sum("value"), n=hr.count())
    panes, late = TestSink(), TestSink()
    result.sink("panes", panes)
    result.late_records().sink("late", late)
    return p, panes, late


def rows(sink: TestSink) -> list[str]:
    return sorted(json.dumps(r, default=str, sort_keys=True) for r in sink.rows())


@pytest.mark.parametrize("kind", ["count", "early_and_late"])
def test_window_processor_restarts_exactly(spark, tmp_path, kind):
    whole, whole_panes, whole_late = build(f"whole_{kind}", kind)
    hr.testing.run_to_completion(whole, state_dir=str(tmp_path / "whole"))
    assert whole_panes.rows()

    state = str(tmp_path / "parts")
    first, panes, late = build(f"parts_{kind}", kind)
    run = PipelineRun(first, state_dir=state, progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=lambda r: len(r.progress_log) >= 4 and r.request_stop("test"))
    assert not run.exhausted()
    second, panes_after, late_after = build(f"parts_{kind}", kind)
    second.plan.nodes["panes"].connector.batches.update(panes.batches)  # the same sink, across the restart
    second.plan.nodes["late"].connector.batches.update(late.batches)
    PipelineRun(second, state_dir=state, progress="quiet").start().wait(until_exhausted=True)

    assert rows(panes_after) == rows(whole_panes)
    assert rows(late_after) == rows(whole_late)
