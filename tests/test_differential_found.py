"""Defects the differential test (tests/test_differential.py) found, each as a fixed example with
its expected output derived by hand from the docs. Marked ``xfail(strict=True)`` while open: the
fix turns them into passes (and strict xfail into a failure, a reminder to drop the mark). The
fixed ones that tests/test_found_defects.py does not hold stay here, unmarked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, run_to_completion

KEY_TS = {"key": "string", "ts": "long"}


def micro_batches(tmp_path: Path, batches: list[list[dict]], schema: dict[str, str] = KEY_TS) -> hr.sources.Files:
    """A bounded Files source that reads ``batches`` as one JSON-lines file each, a micro-batch a
    file, one after the other without a pause."""
    (tmp_path / "in").mkdir()
    for number, batch in enumerate(batches):
        write_in_order(tmp_path / "in" / f"{number}.jsonl", "".join(json.dumps(r) + "\n" for r in batch), number)
    return hr.sources.Files(str(tmp_path / "in"), "jsonl", schema, bounded=True, max_files_per_batch=1)


def test_two_sinks_of_a_window_beside_the_dead_letters_get_the_same_rows(spark, tmp_path: Path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"key": "c", "ts": 3535}\nnot json\n')
    p = hr.Pipeline("found_two_window_sinks")
    events = p.source("events", hr.sources.Files(str(tmp_path / "in"), "jsonl", {"key": "string", "ts": "long"},
                                                 bounded=True), event_time="ts")
    counts = events.window(hr.Tumbling(2000)).count()
    first, second, dead = TestSink(), TestSink(), TestSink()
    counts.sink("first", first)
    counts.sink("second", second)
    p.dead_letters().sink("dead", dead)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    # the one event at 3.535 s is in [2 s, 4 s); the end of the input fires it
    assert [(r["window_start"].timestamp(), r["count"]) for r in first.rows()] == [(2.0, 1)]
    assert [r["raw"] for r in dead.rows()] == ["not json"] and result.dead_letters == 1
    assert [(r["window_start"].timestamp(), r["count"]) for r in second.rows()] == [(2.0, 1)]


@pytest.mark.fast
def test_running_counts_into_a_file_sink_are_refused_when_built():
    """Files keep every row: a running count's updates would pile up (docs/connectors.md)."""
    p = hr.Pipeline("found_rolling_files")
    events = p.source("events", TestSource([[{"key": "a"}]], schema={"key": "string"}))
    with pytest.raises(hr.PlanError, match=r"sink 'out' \(test_differential_found.py:\d+\): a Files sink cannot "
                                           r"take the updates of step 'count'"):
        events.key_by("key").count().sink("out", hr.sinks.Files("/nonexistent", format="jsonl"))


def _counts_after(step: str, tmp_path: Path) -> tuple[list[tuple[float, int]], int]:
    """Per-second counts of key a after ``step`` drops the record at 9 s, which docs/semantics.md
    says the watermark still sees (the largest event time seen by the source): the record at
    0.2 s in the next micro-batch is then late for [0 s, 1 s)."""
    p = hr.Pipeline(f"found_watermark_{step}")
    batches = [[{"key": "c", "value": 0, "ts": 9_000}, {"key": "a", "value": 10, "ts": 100}],
               [{"key": "a", "value": 10, "ts": 200}]]
    files = micro_batches(tmp_path, batches, {"key": "string", "value": "long", "ts": "long"})
    events = p.source("events", files, event_time="ts")
    if step == "filter":
        kept = events.filter(hr.col("value") > 5)
    else:
        kept = events.join(p.table("known", [{"key": "a"}], schema={"key": "string"}), on="key", how="inner")
    sink = TestSink()
    kept.key_by("key").window(hr.Tumbling(1_000)).count().sink("out", sink)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    return sorted((r["window_start"].timestamp(), r["count"]) for r in sink.rows()), result.late_rows_dropped


def test_the_watermark_sees_records_a_native_filter_drops(spark, tmp_path: Path):
    assert _counts_after("filter", tmp_path) == ([(0.0, 1)], 1)


def test_the_watermark_sees_records_an_inner_join_drops(spark, tmp_path: Path):
    assert _counts_after("join", tmp_path) == ([(0.0, 1)], 1)


def test_a_sliding_window_into_a_file_sink_writes_its_fields_only(spark, tmp_path: Path):
    from headrace.connectors.files_sink import read_rows

    p = hr.Pipeline("found_sliding_files")
    events = p.source("events", TestSource([[{"key": "a", "ts": 500}]], schema={"key": "string", "ts": "long"}),
                      event_time="ts")
    (events.key_by("key").window(hr.Sliding(2_000, 1_000)).count()
     .sink("out", hr.sinks.Files(str(tmp_path / "out"), format="jsonl")))
    run_to_completion(p, state_dir=str(tmp_path / "state"))
    rows = read_rows(str(tmp_path / "out"), "jsonl")
    # 0.5 s is in [-1 s, 1 s) and [0 s, 2 s)
    assert sorted((r["window_start"], r["count"]) for r in rows) == [
        ("1969-12-31T23:59:59.000Z", 1), ("1970-01-01T00:00:00.000Z", 1)]
    assert {tuple(sorted(r)) for r in rows} == {("count", "key", "window_end", "window_start")}


def test_a_sum_of_nulls_is_null_however_the_window_runs(spark, tmp_path: Path):
    p = hr.Pipeline("found_sum_of_nulls")
    events = p.source("events", TestSource([[{"key": "a", "v": None, "ts": 500}]],
                                           schema={"key": "string", "v": "long", "ts": "long"}), event_time="ts")
    keyed = events.key_by("key")
    tumbling, sliding = TestSink(), TestSink()
    keyed.window(hr.Tumbling(1_000)).aggregate(total=hr.sum("v")).sink("tumbling", tumbling)
    keyed.window(hr.Sliding(2_000, 1_000)).aggregate(total=hr.sum("v")).sink("sliding", sliding)
    run_to_completion(p, state_dir=str(tmp_path))
    assert [r["total"] for r in tumbling.rows()] == [None]
    assert [r["total"] for r in sliding.rows()] == [None, None]


def test_an_sql_window_drops_a_late_record(spark, tmp_path: Path):
    batches = [[{"key": "a", "ts": 500}, {"key": "b", "ts": 2_500}], [{"key": "a", "ts": 600}]]
    p = hr.Pipeline("found_sql_lateness")
    p.source("events", micro_batches(tmp_path, batches), event_time="ts")
    sink = TestSink()
    p.sql("SELECT window, key, count(*) AS n FROM events GROUP BY window(ts, '1 second'), key").sink("out", sink)
    PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    # W = 2.5 s after the first file: the record at 0.6 s is late for [0 s, 1 s) and dropped
    assert sorted((r["key"], r["window_start"].timestamp(), r["n"]) for r in sink.rows()) == [
        ("a", 0.0, 1), ("b", 2.0, 1)]


def test_two_windows_side_by_side_each_drop_the_record_late_for_the_batchs_watermark(spark, tmp_path: Path):
    """Two windows on the same events in one query (a tumbling and a session window): each judges the
    record at 0.2 s against the watermark its micro-batch starts with (9 s), drops it, and counts it."""
    batches = [[{"key": "c", "ts": 9_000}, {"key": "a", "ts": 100}], [{"key": "a", "ts": 200}]]
    p = hr.Pipeline("found_side_by_side")
    events = p.source("events", micro_batches(tmp_path, batches), event_time="ts")
    tumbling, sessions = TestSink(), TestSink()
    events.key_by("key").window(hr.Tumbling(1_000)).count().sink("tumbling", tumbling)
    events.key_by("key").window(hr.Session(500)).count().sink("sessions", sessions)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    assert sorted((r["key"], r["window_start"].timestamp(), r["count"]) for r in tumbling.rows()) == [
        ("a", 0.0, 1), ("c", 9.0, 1)]
    assert sorted((r["key"], r["window_start"].timestamp(), r["count"]) for r in sessions.rows()) == [
        ("a", 0.1, 1), ("c", 9.0, 1)]
    assert result.late_rows_dropped == 2


class _TimerAtEachRecord(hr.KeyedProcessFunction):
    seen = hr.ValueState(default=0)

    def process(self, record, ctx):
        self.seen.set(self.seen.get() + 1)
        ctx.register_event_time_timer(ctx.timestamp)

    def on_timer(self, timer, ctx):
        ctx.emit({"key": ctx.key, "at": timer.time, "seen": self.seen.get()})


def test_event_time_timers_fire_after_a_timer_at_time_zero(spark, tmp_path: Path):
    """A timer at 0 ms (the epoch) expires in Spark's first micro-batch, whose watermark is 0, before
    headrace has a watermark; the key's later timers must still fire. Timers fire once the watermark
    (largest event time - 2 s) reaches them: 0 ms in the second micro-batch (watermark 6.612 s) after
    two records, 7.815 s and 8.612 s at the end of the input after three."""
    batches = [[{"key": "b", "ts": 0}, {"key": "b", "ts": 8_612}], [{"key": "b", "ts": 7_815}]]
    p = hr.Pipeline("found_timer_at_zero")
    events = p.source("events", micro_batches(tmp_path, batches), event_time="ts",
                      max_out_of_orderness="2s")
    events.key_by("key").process(_TimerAtEachRecord(), schema={"key": "string", "at": "long", "seen": "long"}
                                 ).sink("out", TestSink())
    rows = run_to_completion(p, state_dir=str(tmp_path / "state"))["out"]
    assert sorted((r["at"], r["seen"]) for r in rows) == [(0, 2), (7_815, 3), (8_612, 3)]


def test_a_late_record_that_would_bridge_into_an_open_session_is_dropped_in_a_chain(spark, tmp_path: Path):
    """Session windows (gap 2.5 s) then per-10 s sums of their counts. The record at 0.063 s comes
    after the watermark reached 2.783 s: its own session [0.063 s, 2.563 s) has ended, so it is late
    (docs/semantics.md: checked before merging), though it would touch a's open session from 2.122 s.
    The session runs on the processor here (the first window of a chain) and judges as Spark does."""
    batches = [[{"key": "a", "ts": 2_122}, {"key": "c", "ts": 3_283}], [{"key": "a", "ts": 63}]]
    p = hr.Pipeline("found_session_bridge")
    events = p.source("events", micro_batches(tmp_path, batches), event_time="ts",
                      max_out_of_orderness=500)
    sessions = events.key_by("key").window(hr.Session(2_500)).aggregate(n=hr.count())
    sink = TestSink()
    sessions.key_by("key").window(hr.Tumbling(10_000)).aggregate(total=hr.sum("n")).sink("out", sink)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    assert sorted((r["key"], r["total"]) for r in sink.rows()) == [("a", 1), ("c", 1)]
    assert result.late_rows_dropped == 1
