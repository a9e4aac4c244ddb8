"""Semantics of the stateful processors: nulls and integers in Python state, empty panes,
typed aggregates, the plan's schema is the runtime schema, every late drop counted."""

from __future__ import annotations

import datetime
from typing import Any

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, Watermark

SCHEMA = {"key": "string", "v": "long", "ts": "timestamp"}
UTC = datetime.UTC


def at(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=UTC)


def run(p: hr.Pipeline, tmp_path: Any) -> Any:
    hr.testing._ship_test_modules(p)  # the process function is defined in this test module
    run = PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start()
    return run.wait(until_exhausted=True)


def test_panes_keep_types_give_identities_and_match_the_planned_schema(spark, tmp_path):
    batches = [
        [{"key": "a", "v": 1, "ts": 1_000}, {"key": "a", "v": None, "ts": 2_000}],  # an early pane of two
        Watermark(15_000),  # on time: nothing new, but on_time_empty="fire" gives an empty pane
        [{"key": "a", "v": 7, "ts": 3_000}],  # too late, no late output attached: dropped and counted
    ]
    p = hr.Pipeline("pane_semantics")
    out = TestSink()
    result = (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
              .window(hr.Tumbling("10s"), trigger=hr.AfterWatermark(early=hr.EveryN(2), on_time_empty="fire"),
                      accumulation="discarding")
              .aggregate(total=hr.sum("v"), n=hr.count(), low=hr.min("ts"), high=hr.max("ts"), avg=hr.mean("v")))
    result.sink("out", out)
    planned = dict(p.plan.nodes[result.node.name].schema)
    assert planned == {"key": "string", "window_start": "timestamp", "window_end": "timestamp",
                       "pane_kind": "string", "pane_index": "long", "total": "long", "n": "long",
                       "low": "timestamp", "high": "timestamp", "avg": "double"}
    outcome = run(p, tmp_path)
    rows = sorted(out.rows(), key=lambda r: r["pane_index"])
    assert [list(r) for r in rows] == [list(planned)] * 2  # the runtime columns are the plan's, in its order
    early, on_time = rows
    assert (early["pane_kind"], early["total"], early["n"], early["avg"]) == ("early", 1, 2, 1.0)
    assert isinstance(early["total"], int)
    assert (early["low"], early["high"]) == (at(1_000), at(2_000))
    assert (on_time["pane_kind"], on_time["total"], on_time["n"]) == ("on_time", 0, 0)
    assert on_time["low"] is on_time["high"] is on_time["avg"] is None
    assert outcome.late_rows_dropped == 1


def test_a_late_record_missing_several_sliding_windows_counts_once(spark, tmp_path):
    batches = [[{"key": "a", "v": 1, "ts": 30_000}], [{"key": "a", "v": 2, "ts": 1_000}]]
    p = hr.Pipeline("sliding_late_count")
    (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
     .window(hr.Sliding("10s", "2s"), trigger=hr.AfterWatermark(early=hr.EveryN(5)))
     .count().sink("out", TestSink()))
    assert run(p, tmp_path).late_rows_dropped == 1


class Types(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.emit({"key": ctx.key, "kind": type(record["v"]).__name__, "v": record["v"]})


def test_process_functions_get_none_and_int_not_nan_and_float(spark, tmp_path):
    batches = [[{"key": "a", "v": 5, "ts": 1_000}, {"key": "a", "v": None, "ts": 2_000},
                {"key": "a", "v": 2**53 + 1, "ts": 3_000}]]
    p = hr.Pipeline("process_types")
    out = TestSink()
    (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
     .process(Types(), schema={"key": "string", "kind": "string", "v": "long"}).sink("out", out))
    run(p, tmp_path)
    assert sorted((r["kind"], r["v"]) for r in out.rows()) == sorted(
        [("int", 5), ("NoneType", None), ("int", 2**53 + 1)])
