"""Defects the differential test found, each as a fixed example with its expected output derived
by hand from the docs (docs/semantics.md, docs/windows.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, run_to_completion


def _same(record: dict) -> dict:
    return record


@pytest.mark.fast
def test_a_map_that_changes_the_event_time_fields_type_is_refused_when_built():
    p = hr.Pipeline("found_event_time_type")
    events = p.source("events", hr.sources.Files("/nonexistent", "jsonl", {"key": "string", "ts": "long"},
                                                 bounded=True), event_time="ts", max_out_of_orderness=500)
    with pytest.raises(hr.PlanError, match="'same'") as refused:
        events.map(_same, schema={"key": "string", "ts": "long"}, name="same").sink("out", TestSink())
        p.validate()
    message = str(refused.value)
    assert "test_found_defects.py:" in message and "'ts'" in message
    assert "timestamp" in message and "long" in message and "datetime.datetime" in message
    # keeping the type, or the field's name for another value, is accepted
    events.map(_same, schema={"key": "string", "ts": "timestamp"}, name="kept")
    events.map(lambda r: {"key": r["key"], "millis": 0}, schema={"key": "string", "millis": "long"}, name="other")


def test_a_session_window_over_the_whole_stream(spark, tmp_path: Path):
    p = hr.Pipeline("found_unkeyed_session")
    batches = [[{"ts": 1_000}, {"ts": 2_000}], [{"ts": 9_000}]]
    events = p.source("events", TestSource(batches, schema={"ts": "long"}), event_time="ts")
    sessions, seconds, sliding = TestSink(), TestSink(), TestSink()
    events.window(hr.Session(2_500)).count().sink("sessions", sessions)
    events.window(hr.Tumbling(2_000)).count().sink("tumbling", seconds)
    events.window(hr.Sliding(2_000, 1_000)).count().sink("sliding", sliding)
    rows = run_to_completion(p, state_dir=str(tmp_path))

    def bounds(name: str) -> list[tuple[float, float, int]]:
        assert set(rows[name][0]) == {"window_start", "window_end", "count"}  # no hidden key
        return sorted((r["window_start"].timestamp(), r["window_end"].timestamp(), r["count"]) for r in rows[name])
    # sessions [1 s, 3.5 s) and [2 s, 4.5 s) overlap: one session [1 s, 4.5 s) of two; then [9 s, 11.5 s)
    assert bounds("sessions") == [(1.0, 4.5, 2), (9.0, 11.5, 1)]
    # tumbling 2 s: 1 s in [0, 2), 2 s in [2, 4), 9 s in [8, 10)
    assert bounds("tumbling") == [(0.0, 2.0, 1), (2.0, 4.0, 1), (8.0, 10.0, 1)]
    # sliding 2 s every 1 s: 1 s in [0, 2) and [1, 3); 2 s in [1, 3) and [2, 4); 9 s in [8, 10) and [9, 11)
    assert bounds("sliding") == [(0.0, 2.0, 1), (1.0, 3.0, 2), (2.0, 4.0, 1), (8.0, 10.0, 1), (9.0, 11.0, 1)]


def test_the_first_of_two_windows_drops_a_late_record(spark, tmp_path: Path):
    batches = [[{"key": "a", "ts": 100}, {"key": "a", "ts": 1_500}], [{"key": "a", "ts": 7_000}],
               [{"key": "a", "ts": 4_999}]]
    (tmp_path / "in").mkdir()
    for number, batch in enumerate(batches):  # a file a micro-batch, read one after the other without a pause
        write_in_order(tmp_path / "in" / f"{number}.jsonl", "".join(json.dumps(r) + "\n" for r in batch), number)
    p = hr.Pipeline("found_chain_lateness")
    events = p.source("events", hr.sources.Files(str(tmp_path / "in"), "jsonl", {"key": "string", "ts": "long"},
                                                 bounded=True, max_files_per_batch=1), event_time="ts")
    seconds = events.key_by("key").window(hr.Tumbling(1_000), name="per_second").count()
    fives = seconds.key_by("key").window(hr.Tumbling(5_000), name="per_five").aggregate(total=hr.sum("count"))
    sink = TestSink()
    fives.sink("out", sink)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    # W = 1.5 s after the first file, 7 s after the second: the record at 4.999 s in the third is
    # late for [4 s, 5 s) (docs/semantics.md) and dropped; [0, 5 s) holds the seconds 0 and 1
    assert sorted((r["window_start"].timestamp(), r["total"]) for r in sink.rows()) == [(0.0, 2), (5.0, 1)]
    assert result.late_rows_dropped == 1


@pytest.mark.fast
def test_a_filter_on_running_counts_is_refused_when_built_unless_it_reads_only_the_keys():
    """A filter below a running count would leave a key whose count stops matching in the sink
    with its old count (update mode cannot take a row back), as HAVING would in SQL."""
    p = hr.Pipeline("found_filter_of_updates")
    counts = p.source("events", TestSource([[{"key": "a"}]], schema={"key": "string"})).key_by("key").count()
    with pytest.raises(hr.PlanError, match=r"step 'big' \(test_found_defects.py:\d+\): a filter on the updates of "
                                           r"step 'count' \(test_found_defects.py:\d+\) is not supported.*"
                                           r"a column expression on key only is exact"):
        counts.filter(hr.col("count") > 2, name="big")
    with pytest.raises(hr.PlanError, match=r"step 'odd' \(test_found_defects.py:\d+\): a filter on the updates"):
        counts.filter(lambda r: r["count"] % 2 == 1, name="odd")
    counts.filter(hr.col("key") != "b", name="not_b").sink("out", TestSink())  # on the key: exact
    p.validate()


def _slow_copy(record: dict) -> dict:
    import time

    time.sleep(0.002)
    return {"line": record["line"]}


def test_max_seconds_stops_a_bounded_input_before_its_end(spark, tmp_path: Path):
    """``--max-seconds`` (``wait(max_seconds=)``) stopped nothing while a bounded generator lasted:
    the run waited for the input's end before looking at the clock."""
    p = hr.Pipeline("found_max_seconds")
    sink = TestSink()
    # half a second a batch, 80 s in all; 12 s leave a loaded machine (CI's) time for a first batch
    (p.source("lines", hr.sources.Generator("words", limit=40_000, rows_per_batch=250))
     .map(_slow_copy, schema={"line": "string"}).sink("out", sink))
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait(max_seconds=12)
    assert result.stopped_by == "ran for 12 s"
    assert 0 < result.input_rows < 40_000
    assert len(sink.rows()) == result.input_rows  # whole batches, each once
