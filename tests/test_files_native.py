"""Files read by Spark's own file source (the default reader): headrace's timestamps (ISO-8601 or
epoch ms), dead letters (named by file), and a bounded directory that ends, flushing the last
windows, checked against answers computed here in plain Python."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.errors import PlanError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink


def run_until_idle(pipeline: hr.Pipeline, state_dir: str) -> Any:
    run = PipelineRun(pipeline, state_dir=state_dir, progress="quiet").start()
    run.settle()
    run.request_stop("test done")
    return run.wait(until_exhausted=False)


def test_json_lines_with_both_timestamp_forms_and_dead_letters_by_file(spark: Any, tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text(json.dumps({"user": "ada", "n": 1, "ts": "2026-01-01T10:00:00Z"}) + "\n"
                                   + json.dumps({"user": "bob", "n": 2, "ts": 1767261600000}) + "\n")
    (inbox / "b.jsonl").write_text("not json\n" + json.dumps({"user": "cy", "n": "three", "ts": 0}) + "\n"
                                   + json.dumps({"user": "dee", "n": 4, "ts": "yesterday"}) + "\n"
                                   + json.dumps({"user": "eve", "n": 5, "ts": "2026-01-01 10:00:00"}) + "\n"
                                   + json.dumps({"user": "fay", "n": 6, "ts": "2026-01-01T10:00"}) + "\n"
                                   + json.dumps({"user": "gil", "n": 7, "ts": "2026-01-01"}) + "\n"
                                   + '{ "user":"hal",  "n": 8, "ts": "10:00 am" }\n')
    b_lines = (inbox / "b.jsonl").read_bytes().decode().splitlines()  # a dead letter carries its line as written
    for age, name in enumerate(("a.jsonl", "b.jsonl")):  # Spark takes the oldest file first
        os.utime(inbox / name, (1_700_000_000 + age, 1_700_000_000 + age))
    p = hr.Pipeline("native_files")
    out, dead = TestSink(), TestSink()
    p.source("events", hr.sources.Files(inbox, schema="user string, n long, ts timestamp", reader="spark",
                                        max_files_per_batch=1)).sink("out", out)
    p.dead_letters().sink("dead", dead)

    result = run_until_idle(p, str(tmp_path / "state"))

    at_ten = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert sorted((r["user"], r["n"], r["ts"].replace(tzinfo=UTC)) for r in out.rows()) == [
        ("ada", 1, at_ten), ("bob", 2, at_ten), ("eve", 5, at_ten), ("fay", 6, at_ten),
        ("gil", 7, at_ten.replace(hour=0))]
    errors = sorted((r["position"], r["raw"], r["error"].split(" of the ")[0].split(" that ")[0])
                    for r in dead.rows())
    assert errors == sorted([("b.jsonl", b_lines[0], "the line is not a JSON object"),
                             ("b.jsonl", b_lines[1], "the line is not a JSON object"),
                             ("b.jsonl", b_lines[2], "a timestamp or date"),
                             ("b.jsonl", b_lines[6], "a timestamp or date")])
    assert [f for f in (report["numInputRows"] for report in result.progress) if f] == [2, 7]  # a file a batch
    assert result.dead_letters == 4


def test_a_timestamp_no_step_reads_is_not_checked(spark: Any, tmp_path: Path) -> None:
    """A record whose timestamp would not convert is a dead letter only when a step reads the timestamp
    (the test above: its sink takes every field), as a number no step reads is never parsed."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"user": "ada", "ts": "yesterday"}\nnot json\n'
                                   '{"user": "bob", "ts": "2026-01-01T10:00:00Z"}\n{"user": "cy", "ts": "3 pm"}\n')
    p = hr.Pipeline("native_files_unread")
    out, dead = TestSink(), TestSink()
    users = p.source("events", hr.sources.Files(inbox, schema="user string, ts timestamp", reader="spark"))
    users.select("user").sink("out", out)
    p.sql("SELECT upper(user) AS name FROM events WHERE user <> 'cy'", name="upper_names").sink("names", TestSink())
    p.dead_letters().sink("dead", dead)

    result = run_until_idle(p, str(tmp_path / "state"))

    assert sorted(r["user"] for r in out.rows()) == ["ada", "bob", "cy"]
    assert [r["raw"] for r in dead.rows()] == ["not json"] and result.dead_letters == 1
    with_time = hr.Pipeline("native_files_read")  # the same records, the time read by a filter only
    with_time.source("events", hr.sources.Files(inbox, schema="user string, ts timestamp", reader="spark")).filter(
        hr.col("ts") > datetime(2000, 1, 1, tzinfo=UTC)).select("user").sink("out", kept := TestSink())
    assert run_until_idle(with_time, str(tmp_path / "state2")).dead_letters == 3
    assert [r["user"] for r in kept.rows()] == ["bob"]


def test_dead_letters_are_counted_when_no_step_reads_them(spark: Any, tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"n": 1}\nnot json\n{"n": 2}\n{"n": "two"}\n')
    p = hr.Pipeline("native_files_counted")
    out = TestSink()
    p.source("numbers", hr.sources.Files(inbox, schema="n long", reader="spark")).sink("out", out)

    result = run_until_idle(p, str(tmp_path / "state"))

    assert sorted(r["n"] for r in out.rows()) == [1, 2]
    assert (result.input_rows, result.dead_letters) == (4, 2)


def test_a_source_read_once_reaches_spark_optimized_and_its_dead_letters_still_count(spark: Any,
                                                                                     tmp_path: Path) -> None:
    """A pipeline's one source whose dead letters only its good rows' marker counts: Spark is handed
    the good rows' plan already optimized, without the dead-letter columns it would otherwise
    simplify away in every micro-batch, and the rows, their timestamps and the dead letters are
    what plain Python makes of the same lines."""
    from headrace.spark.compiler import compile_plan

    inbox = tmp_path / "in"
    inbox.mkdir()
    lines = [{"user": "ada", "n": 1, "ts": "2026-01-01T10:00:00"}, {"user": "bob", "n": 2, "ts": 1767261600000},
             "not json", {"user": "dee", "n": 4, "ts": "yesterday"}, {"user": "eve", "n": 5, "ts": 1767261601000}]
    (inbox / "a.jsonl").write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                                           for line in lines))
    p = hr.Pipeline("optimized_once")
    out = TestSink()
    p.source("events", hr.sources.Files(inbox, schema="user string, n long, ts timestamp", bounded=True)) \
        .filter(hr.col("n") > 1).sink("out", out)

    frame = compile_plan(p.plan, spark, str(tmp_path / "compiled"), str(tmp_path / "probe")).sink_frames["out"]
    analyzed = frame._jdf.queryExecution().analyzed().toString()
    assert "_hr_dead_raw" not in analyzed and "to_json" not in analyzed
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()

    def moment(ts: Any) -> datetime:
        return datetime.fromtimestamp(ts / 1000, UTC) if isinstance(ts, int) else datetime.fromisoformat(ts + "+00:00")
    good = [line for line in lines if isinstance(line, dict) and line["ts"] != "yesterday"]
    assert sorted((r["user"], r["n"], r["ts"].replace(tzinfo=UTC)) for r in out.rows()) == sorted(
        (line["user"], line["n"], moment(line["ts"])) for line in good if line["n"] > 1)
    assert result.dead_letters == len(lines) - len(good)


@pytest.mark.parametrize("sinks", [1, 2])
def test_a_source_its_sinks_read_as_it_is_counts_its_dead_letters_without_an_observed_metric(
        spark: Any, tmp_path: Path, sinks: int) -> None:
    """Sinks that read the one source itself (no step between, no dead-letter sink): the query
    writes the source's good rows with no observed metric on every row (Spark's CollectMetrics,
    a node outside the generated code), its dead letters counted as its input rows less the good
    rows' marker; the rows and the count are what plain Python makes of the same lines."""
    from headrace.spark.compiler import compile_plan

    inbox = tmp_path / "in"
    inbox.mkdir()
    lines = ['{"n": 1, "who": "ada"}', "not json", '{"n": 2, "who": "bob"}', '{"n": "two", "who": "cy"}',
             '{"n": 3}']
    (inbox / "a.jsonl").write_text("\n".join(lines) + "\n")
    p = hr.Pipeline(f"straight_to_{sinks}_sinks")
    numbers = p.source("numbers", hr.sources.Files(inbox, schema="n long, who string", bounded=True))
    outs = [TestSink() for _ in range(sinks)]
    for index, out in enumerate(outs):
        numbers.sink(f"out{index}", out)

    frame = compile_plan(p.plan, spark, str(tmp_path / "compiled"), str(tmp_path / "probe")).sink_frames["out0"]
    analyzed = frame._jdf.queryExecution().analyzed().toString()
    assert "CollectMetrics" not in analyzed and "_hr_dead_raw" not in analyzed
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()

    good = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record.get("n"), int):
            good.append((record["n"], record.get("who")))
    for out in outs:
        assert sorted((r["n"], r["who"]) for r in out.rows()) == sorted(good)
    assert (result.input_rows, result.dead_letters) == (len(lines), len(lines) - len(good))


def _read_jsonl_folder(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for path in sorted(folder.rglob("*.json*")) if not path.name.startswith((".", "_"))
            for line in path.read_text().splitlines() if line]


@pytest.mark.parametrize("bad", [None, "not json", '{"n": "two", "ts": "2026-01-01T10:00:00Z"}',
                                 '{"n": 9, "ts": "noon"}'])
def test_a_source_read_strictly_reads_a_batch_with_a_bad_record_again_keeping_its_dead_letters(
        spark: Any, tmp_path: Path, bad: str | None) -> None:
    """Nothing reads the source's dead letters but their count: it is read strictly (no corrupt-record
    column, no dead-letter test a row), and stays so while every line is good, until a bad line (not
    JSON, a wrong type, a timestamp that converts to nothing) stops its batch; the run goes on from the
    checkpoint reading the source keeping its dead letters, the batch runs again, and both sinks (one
    of them Files, exactly once) hold what plain Python makes of the lines, once each."""
    from headrace.spark.compiler import compile_plan

    inbox, written = tmp_path / "in", tmp_path / "written"
    inbox.mkdir()
    files = [['{"n": 1, "ts": "2026-01-01T10:00:00Z"}', '{"n": 2, "ts": 1767261600000}'],
             ['{"n": 3, "ts": "2026-01-01T10:00:01Z"}', *([bad] if bad else []),
              '{"n": 4, "ts": "2026-01-01T10:00:02Z"}'],
             ['{"n": 5, "ts": "2026-01-01T10:00:03Z"}']]
    for age, lines in enumerate(files):
        (inbox / f"{age}.jsonl").write_text("\n".join(lines) + "\n")
        os.utime(inbox / f"{age}.jsonl", (1_700_000_000 + age, 1_700_000_000 + age))
    p = hr.Pipeline("strict_read")
    out = TestSink()
    numbers = p.source("numbers", hr.sources.Files(inbox, schema="n long, ts timestamp", max_files_per_batch=1))
    numbers.sink("out", out)
    numbers.sink("written", hr.sinks.Files(str(written), format="jsonl"))

    strict = compile_plan(p.plan, spark, str(tmp_path / "compiled"), str(tmp_path / "probe"))
    assert strict.lowering.strict_sources == {"numbers"}
    assert "_hr_corrupt" not in strict.sink_frames["out"]._jdf.queryExecution().analyzed().toString()
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    run.settle()
    run.request_stop("test done")
    result = run.wait(until_exhausted=False)

    good = []
    for line in (line for lines in files for line in lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record["n"], int) and (isinstance(record["ts"], int) or record["ts"].endswith("Z")):
            good.append(record["n"])
    assert sorted(r["n"] for r in out.rows()) == sorted(good)
    assert sorted(r["n"] for r in _read_jsonl_folder(written)) == sorted(good)
    assert run.lenient_sources == ({"numbers"} if bad else set()) and run.restarts == 0
    assert (result.input_rows, result.dead_letters) == ((6, 1) if bad else (5, 0))


def test_a_strictly_read_source_killed_after_one_sink_took_its_re_read_batch_is_exact_after_a_restart(
        tmp_path: Path) -> None:
    """SIGKILL of the driver's process group once the first of two Files sinks has committed the
    batch read again for its bad line, before the second sink and Spark's commit log: the restarted
    run reads strictly again, meets the bad line again in that batch, reads it keeping its dead
    letters, and each sink holds each good line once, as plain Python reads the files."""
    from driver_process import KilledRun
    from input_files import write_in_order

    from headrace.connectors.files_sink import read_rows

    inbox = tmp_path / "in"
    inbox.mkdir()
    files = [[json.dumps({"n": n, "ts": f"2026-01-01T10:00:0{n}Z"}) for n in numbers]
             for numbers in ((1, 2), (3, 4), (5,))]
    files[1].insert(1, "not json")
    for number, lines in enumerate(files):
        write_in_order(inbox / f"{number}.jsonl", "\n".join(lines) + "\n", number)
    pause_file, state = tmp_path / "paused", tmp_path / "state"
    args = {"name": "strict_killed", "state_dir": str(state), "input": str(inbox), "first": str(tmp_path / "first"),
            "second": str(tmp_path / "second"), "pause_file": str(pause_file), "pause_at": 1,
            "out": str(tmp_path / "second")}
    run = KilledRun(Path(__file__).parent / "strict_read_driver.py", args, tmp_path / "driver.log")

    run.kill_when("the first sink paused after committing batch 1", pause_file.exists)
    assert run.committed() == 1 and not read_rows(args["second"], "jsonl")[2:]  # the second has batch 0 only
    spark_log = state / "spark.log"
    before_restart = spark_log.stat().st_size
    exhausted = state / args["name"] / "run" / "exhausted" / "numbers"
    run.restart_until("every file read and its batch committed",
                      lambda: exhausted.exists() and run.committed() >= run.planned())

    good = []
    for line in (line for lines in files for line in lines):
        try:
            good.append(json.loads(line)["n"])
        except ValueError:
            continue
    for sink in ("first", "second"):
        assert sorted((r["n"], r["tens"]) for r in read_rows(args[sink], "jsonl")) == [(n, n * 10) for n in good]
    with spark_log.open(errors="replace") as log:  # the restarted run read strictly, and met the bad line
        log.seek(before_restart)
        assert "MALFORMED_RECORD_IN_PARSING" in log.read()


def test_a_frame_that_reads_the_clock_is_not_optimized_ahead(spark: Any) -> None:
    """Spark's optimizer fixes current_timestamp() to the moment it runs: such a frame is left as it is."""
    from pyspark.sql import functions as F

    from headrace.spark.stateless import optimized_once

    ticking = spark.range(3).select(F.current_timestamp().alias("now"))
    assert optimized_once(ticking) is ticking
    plain = spark.range(3).filter(F.lit(True)).select((F.col("id") + 1).alias("n"))
    once = optimized_once(plain)
    assert once is not plain and "Filter" not in once._jdf.queryExecution().analyzed().toString()
    assert [r.n for r in once.collect()] == [1, 2, 3]


def test_csv_and_parquet(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("user,n\nada,1\nbob,x\n")
    spark.createDataFrame([("cy", 3)], "user string, n long").write.parquet(str(tmp_path / "parquet"))
    p = hr.Pipeline("native_csv_parquet")
    out, dead = TestSink(), TestSink()
    csv = p.source("csv", hr.sources.Files(tmp_path / "csv", format="csv", schema="user string, n long",
                                           reader="spark"))
    parquet = p.source("parquet", hr.sources.Files(tmp_path / "parquet", format="parquet",
                                                   schema="user string, n long", reader="spark"))
    csv.union(parquet).sink("out", out)
    p.dead_letters().sink("dead", dead)
    assert "Spark's own file source" in p.explain()

    run_until_idle(p, str(tmp_path / "state"))

    assert sorted((r["user"], r["n"]) for r in out.rows()) == [("ada", 1), ("cy", 3)]
    assert [(r["position"], r["raw"]) for r in dead.rows()] == [("a.csv", "bob,x")]


def write_clicks(folder: Path, files: int, per_file: int) -> list[dict[str, Any]]:
    """Clicks a second apart, ``per_file`` to a file, each file modified after the one before."""
    folder.mkdir(parents=True, exist_ok=True)
    clicks = [{"user": f"u{k % 3}", "ts": 1_767_261_600_000 + k * 1000} for k in range(files * per_file)]
    for f in range(files):
        path = folder / f"part-{f:03d}.jsonl"
        path.write_text("".join(json.dumps(c) + "\n" for c in clicks[f * per_file:(f + 1) * per_file]))
        os.utime(path, (1_700_000_000 + f, 1_700_000_000 + f))
    return clicks


def counts_per_10s(clicks: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """The expected tumbling 10 s counts per user: (user, window start in epoch ms, count)."""
    counts: dict[tuple[str, int], int] = {}
    for c in clicks:
        key = (c["user"], c["ts"] - c["ts"] % 10_000)
        counts[key] = counts.get(key, 0) + 1
    return sorted((user, start, n) for (user, start), n in counts.items())


def window_rows(sink: TestSink) -> list[tuple[str, int, int]]:
    return sorted((r["user"], int(r["window_start"].replace(tzinfo=UTC).timestamp() * 1000), r["count"])
                  for r in sink.rows())


def clicks_pipeline(inbox: Path, name: str, out: TestSink | None = None, **files: Any) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    out = out or TestSink()
    clicks = p.source("clicks", hr.sources.Files(inbox, schema="user string, ts timestamp", bounded=True, **files),
                      event_time="ts", max_out_of_orderness="2s")
    clicks.key_by("user").window(hr.Tumbling("10s")).count().sink("out", out)
    return p, out


def test_a_bounded_directory_ends_and_its_last_windows_fire(spark: Any, tmp_path: Path) -> None:
    inbox = tmp_path / "clicks, day 1"  # a comma: Spark reads the directory and the end file's folder as {a,b}
    clicks = write_clicks(inbox, files=3, per_file=25)
    p, out = clicks_pipeline(inbox, "bounded_native", max_files_per_batch=1)
    assert "Spark's own file source" in p.explain()
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    (inbox / "part-999.jsonl").write_text(json.dumps({"user": "late", "ts": 0}) + "\n")  # after the start
    result = run.wait()

    assert result.stopped_by == "input exhausted"
    assert window_rows(out) == counts_per_10s(clicks)  # every window, the last ones too; not the file added later
    assert result.input_rows == 75  # the flush row is not a record
    assert [n for n in (report["numInputRows"] for report in result.progress) if n][:3] == [25, 25, 25]


class SlowSink(TestSink):
    """Takes 0.8 s a batch: the runner, looking at the sources every 0.25 s, sees the last file's batch run."""

    def write_batch(self, df: Any, batch_id: int) -> None:
        time.sleep(0.8)
        super().write_batch(df, batch_id)


def test_the_end_of_input_comes_in_the_batch_right_after_the_last_files(spark: Any, tmp_path: Path) -> None:
    """The end-of-input row is written while the batch that takes the last file runs, so the next
    batch reads it: no batch without data, and no wait, between the two."""
    inbox = tmp_path / "in"
    clicks = write_clicks(inbox, files=3, per_file=25)
    p, out = clicks_pipeline(inbox, "bounded_native_end_at_once", SlowSink(), max_files_per_batch=1)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()

    assert window_rows(out) == counts_per_10s(clicks)
    reports = sorted(result.progress, key=lambda report: report["batchId"])
    sources = [report["sources"][0] for report in reports]
    assert [report["numInputRows"] for report in reports[:3]] == [25, 25, 25]
    assert sources[3]["startOffset"] != sources[3]["endOffset"]  # batch 3 read a file: the end file


def test_a_stopped_bounded_run_goes_on_from_its_checkpoint(spark: Any, tmp_path: Path) -> None:
    clicks = write_clicks(tmp_path / "in", files=4, per_file=20)
    state = str(tmp_path / "state")
    p, first = clicks_pipeline(tmp_path / "in", "bounded_native_restart", max_files_per_batch=1)
    run = PipelineRun(p, state_dir=state, progress="quiet").start()
    run.request_stop("test: stop early")
    run.wait()
    p, second = clicks_pipeline(tmp_path / "in", "bounded_native_restart", max_files_per_batch=1)
    result = PipelineRun(p, state_dir=state, progress="quiet").start().wait()

    assert result.stopped_by == "input exhausted"
    assert sorted(window_rows(first) + window_rows(second)) == counts_per_10s(clicks)  # none lost, none twice


@pytest.mark.parametrize("windowed", [True, False])
def test_a_bounded_input_that_has_ended_stays_ended(spark: Any, tmp_path: Path, windowed: bool) -> None:
    """A run from the checkpoint of a bounded run that ended reads nothing, not even a file added
    since: after the end its windows have closed, so its records could only be late."""
    clicks = write_clicks(tmp_path / "in", files=2, per_file=10)

    def pipeline() -> tuple[hr.Pipeline, TestSink]:
        if windowed:
            return clicks_pipeline(tmp_path / "in", "bounded_native_ended")
        p, out = hr.Pipeline("bounded_native_ended"), TestSink()
        p.source("clicks", hr.sources.Files(tmp_path / "in", schema="user string, ts timestamp", bounded=True)
                 ).sink("out", out)
        return p, out

    p, first = pipeline()
    PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    assert len(first.rows()) == (len(counts_per_10s(clicks)) if windowed else 20)
    write_clicks(tmp_path / "more", files=1, per_file=5)
    (tmp_path / "more" / "part-000.jsonl").rename(tmp_path / "in" / "part-100.jsonl")
    p, second = pipeline()
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()

    assert result.stopped_by == "input exhausted"
    assert (second.rows(), result.input_rows, result.late_rows_dropped) == ([], 0, 0)


def test_a_stateless_bounded_run_ends_without_a_flush_row(spark: Any, tmp_path: Path) -> None:
    """No step reads event time: the run ends once Spark has taken every file."""
    inbox = tmp_path / "in"
    clicks = write_clicks(inbox, files=2, per_file=10)
    p = hr.Pipeline("bounded_native_stateless")
    out = TestSink()
    p.source("clicks", hr.sources.Files(inbox, schema="user string, ts timestamp", bounded=True)).sink("out", out)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()

    assert result.stopped_by == "input exhausted"
    assert sorted(int(r["ts"].replace(tzinfo=UTC).timestamp() * 1000) for r in out.rows()) == [c["ts"] for c in clicks]
    assert sum(report["numInputRows"] for report in result.progress) == 20  # no flush row was read


@pytest.mark.fast
def test_a_bounded_spark_reader_needs_a_local_checkpoint(tmp_path: Path) -> None:
    from headrace.connectors.files_native import read_stream
    from headrace.contract import SourceContext

    context = SourceContext(str(tmp_path / "run"), "clicks", "hdfs://cluster/state/p/checkpoint")
    with pytest.raises(hr.SourceError, match=r"source 'clicks': a bounded Files source read by Spark's file source "
                                             r"learns that its input has ended from the checkpoint, which must be on "
                                             r"this machine \(the state dir is hdfs://cluster/state/p/checkpoint\); "
                                             r"use reader='python'"):
        read_stream(None, context, str(tmp_path), "jsonl", (("a", "long"),), csv_header=True, max_files=None,
                    bounded=True, fail_fast=False)


@pytest.mark.fast
def test_an_unknown_reader_or_a_path_spark_reads_as_a_pattern_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"unknown reader 'java'; use one of spark, python"):
        hr.sources.Files(tmp_path, schema="a long", reader="java")
    with pytest.raises(PlanError, match=r"FileSource\('.*/in\{x\}'\): Spark's file source reads a path that holds "
                                        r"any of \{ \} \[ \] \* \? \\ as a pattern; rename the directory, or read "
                                        r"it with reader='python'"):
        hr.sources.Files(str(tmp_path / "in{x}"), schema="a long")
    assert hr.sources.Files(tmp_path / "in{x}", schema="a long", reader="python").reader == "python"


def test_files_logged_for_a_batch_never_planned_go_into_batches_of_their_own(spark: Any, tmp_path: Path) -> None:
    """A driver killed after Spark logged a batch's files but before it planned the batch leaves
    them in the source's log; the next batch would take them with the files listed then, past
    ``max_files_per_batch``. The log written here is the one Spark writes at that moment."""
    clicks = write_clicks(tmp_path / "in", files=2, per_file=10)
    state = tmp_path / "state"

    def pipeline() -> tuple[hr.Pipeline, TestSink]:
        p, out = hr.Pipeline("native_unplanned"), TestSink()
        p.source("clicks", hr.sources.Files(tmp_path / "in", schema="user string, ts timestamp",
                                            max_files_per_batch=1)).sink("out", out)
        return p, out

    p, first = pipeline()
    run_until_idle(p, str(state))
    more = write_clicks(tmp_path / "more", files=4, per_file=11)[22:]  # files 2 and 3, newer than those in "in"
    for f in (2, 3):
        (tmp_path / "more" / f"part-{f:03d}.jsonl").rename(tmp_path / "in" / f"part-{f:03d}.jsonl")
    log = state / "native_unplanned" / "checkpoint" / "sources" / "0"
    entry = {"path": (tmp_path / "in" / "part-002.jsonl").as_uri(), "timestamp": 1_700_000_002_000, "batchId": 2}
    (log / "2").write_text("v1\n" + json.dumps(entry))
    p, second = pipeline()
    result = run_until_idle(p, str(state))

    assert [n for n in (report["numInputRows"] for report in result.progress) if n] == [11, 11]
    assert len(first.rows()) + len(second.rows()) == len(clicks) + len(more)


@pytest.mark.fast
def test_forgetting_unplanned_files_keeps_what_a_planned_batch_reads(tmp_path: Path) -> None:
    """A compacted log (every tenth batch's) keeps its earlier batches' files; another kind of
    source's log and Hadoop's checksum of a kept log are left alone."""
    from headrace.connectors.files_native import files_taken, forget_unplanned

    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "8").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":8}\n{"topic":{"0":5}}')
    files, kafka = checkpoint / "sources" / "0", checkpoint / "sources" / "1"
    files.mkdir(parents=True)
    kafka.mkdir(parents=True)
    entries = [json.dumps({"path": f"file:///in/{b}.jsonl", "timestamp": b, "batchId": b}) for b in range(10)]
    (files / "8").write_text("v1\n" + entries[8])
    (files / ".8.crc").write_bytes(b"kept")
    (files / "9.compact").write_text("v1\n" + "\n".join(entries))
    (files / ".9.compact.crc").write_bytes(b"stale")
    (kafka / "0").write_text('v1\n{"topic":{"0":0}}')
    (kafka / "9").write_text('v1\n{"topic":{"0":9}}')

    forget_unplanned(str(checkpoint))

    assert files_taken(str(checkpoint)) == {f"/in/{b}.jsonl" for b in range(9)}
    assert (files / "9.compact").read_text() == "v1\n" + "\n".join(entries[:9])
    assert sorted(os.listdir(files)) == [".8.crc", "8", "9.compact"]
    assert sorted(os.listdir(kafka)) == ["0", "9"]
