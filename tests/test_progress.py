"""Progress is read from Spark's progress events, one per micro-batch Spark ran: a long run with
idle periods reports every batch once and the exact number of input rows, where Spark's own
``recentProgress`` keeps only the last 100 reports and mixes in idle reports that run nothing."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from input_files import write_in_order

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSource, Watermark

STEPS, ROWS = 104, 10


def numbers() -> list[Any]:
    batches: list[Any] = [[{"n": step * ROWS + i} for i in range(ROWS)] for step in range(STEPS)]
    batches.insert(STEPS // 2, Watermark(1_000))  # a micro-batch of one control row: no input rows
    return batches


def pause_now_and_then(run: PipelineRun) -> None:
    """Leave the query idle now and then, long enough for Spark to send idle reports."""
    if len(run.progress_log) % 15 == 0:
        time.sleep(0.3)


def test_a_long_run_with_idle_periods_reports_each_batch_once_and_exact_rows(spark, tmp_path, capsys):
    p = hr.Pipeline("long_run")
    (p.source("numbers", TestSource(numbers(), schema={"n": "long"}))
     .filter(hr.col("n") >= 0, name="all").sink("out", hr.sinks.Null()))
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100")  # an idle report every 100 ms idle
    try:
        run = PipelineRun(p, state_dir=str(tmp_path), progress="json").start()
        result = run.wait(until_exhausted=True, on_settled=pause_now_and_then)
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")

    batches = STEPS + 2  # the data, the watermark move and the end-of-input flush: one micro-batch each
    recent = run.query.recentProgress
    assert len(recent) < 100 < batches  # Spark keeps the last reports of a query only
    assert any("addBatch" not in report["durationMs"] for report in recent), "Spark sent idle reports meanwhile"

    assert (result.batches, result.input_rows, result.restarts) == (batches, STEPS * ROWS, 0)
    assert [report["batchId"] for report in result.progress] == list(range(batches))  # complete, for benchmarks
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["batch"] for line in lines] == list(range(batches))
    assert sum(line["input_rows"] for line in lines) == STEPS * ROWS
    assert [line["input_rows"] for line in lines if line["input_rows"] != ROWS] == [0, 0]  # watermark, flush


def test_a_bounded_sources_flush_row_is_not_an_input_row(spark, tmp_path):
    """The generator's and the files source's flush row is counted from their offsets (no
    per-row metric): the run reports exactly the records read."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"n": n}) + "\n" for n in range(7)))
    p = hr.Pipeline("flush_rows")
    generated = p.source("events", hr.sources.Generator("ysb", limit=2_500, rows_per_batch=1_000))
    generated.select("ad_id", name="ad_ids").sink("ads", hr.sinks.Null())
    p.source("files", hr.sources.Files(str(folder), format="jsonl", schema={"n": "long"}, bounded=True)) \
        .sink("numbers", hr.sinks.Null())
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    assert result.input_rows == 2_500 + 7


def test_each_steps_records_are_counted_exactly_as_python_counts_them(spark, tmp_path):
    """Per-step counts (``headrace/spark/step_counts.py``), over three files of ten records and a
    bad line each, as plain Python counts them: the source's records (the pipeline's input rows,
    the bad lines among them), a window's results, and a filter of them only the sink reads; the
    flush (a control row) is no record. The steps Spark fuses between the source and the window
    are counted too: the filter by its marker (the flush row that passes it taken off), the
    Python map and the keys after it as handing on its records one for one."""
    folder = tmp_path / "in"
    folder.mkdir()
    records = [{"k": f"k{n % 3}", "v": n, "t": 1_000 * n} for n in range(30)]
    for part in range(3):
        lines = [json.dumps(r) for r in records[part * 10:(part + 1) * 10]] + ["not a record"]
        write_in_order(folder / f"{part}.jsonl", "\n".join(lines) + "\n", part)
    p = hr.Pipeline("step_counts")
    source = p.source("src", hr.sources.Files(str(folder), schema={"k": "string", "v": "long", "t": "timestamp"},
                                               bounded=True, max_files_per_batch=1), event_time="t")
    evens = source.filter(hr.col("v") % 2 == 0, name="evens")
    tenfold = evens.map(lambda r: {**r, "v": r["v"] * 10}, schema={"k": "string", "v": "long", "t": "timestamp"},
                        name="tenfold")
    windows = tenfold.key_by("k").window(hr.Tumbling("10s"), name="per_10s").aggregate(n=hr.count())
    windows.filter(hr.col("n") > 1, name="busy").sink("out", hr.sinks.Null())
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    result = run.wait()

    counted: Counter[str] = Counter()
    for figures in run.batches.figures:
        counted.update(figures["step_records"])
    even = [r for r in records if r["v"] % 2 == 0]
    per_window = Counter((r["k"], r["t"] // 10_000) for r in even)
    busy = sum(1 for n in per_window.values() if n > 1)
    # the source's event-time declaration hands on its records one for one: the source's less its bad lines
    assert dict(counted) == {"src": 33, "src_event_time": 30, "evens": len(even), "tenfold": len(even),
                             "key_by": len(even), "per_10s": len(per_window), "busy": busy}
    assert result.dead_letters == 3 and result.late_rows_dropped == 0


def test_each_source_of_a_pipeline_with_several_counts_its_records(spark, tmp_path):
    """With several sources, each one counts its records beside what it counts anyway: Spark's file
    source beside its dead letters, headrace's Python reader of files the same, the test kit's source
    beside its control rows (a watermark step is none of its records). A bad line is a record the
    source read (it goes to the dead letters), as the input rows of a single source count it. A step
    that hands on its input's records one for one (a key_by, a select) has its input's count, a
    source's less its dead letters."""
    bids_in, auctions_in = tmp_path / "bids", tmp_path / "auctions"
    bids_in.mkdir()
    auctions_in.mkdir()
    for part in range(2):
        lines = [json.dumps({"id": part * 10 + i, "t": 1_000 * i}) for i in range(10)] + ["not a bid"]
        write_in_order(bids_in / f"{part}.jsonl", "\n".join(lines) + "\n", part)
    write_in_order(auctions_in / "0.jsonl", "\n".join([json.dumps({"id": i}) for i in range(4)] + ["{"]) + "\n", 0)
    p = hr.Pipeline("source_counts")
    bids = p.source("bids", hr.sources.Files(str(bids_in), schema={"id": "long", "t": "timestamp"}, bounded=True,
                                             max_files_per_batch=1), event_time="t")
    by_id = bids.key_by("id", name="by_id")  # hands on the bids' records one for one: counted as theirs
    by_id.window(hr.Tumbling("10s"), name="per_10s").aggregate(n=hr.count()).sink("w", hr.sinks.Null())
    auctions = p.source("auctions", hr.sources.Files(str(auctions_in), schema={"id": "long"}, bounded=True,
                                                     reader="python"))
    auctions.select("id", name="ids").sink("a", hr.sinks.Null())
    ticks = p.source("ticks", TestSource([[{"n": 0}, {"n": 1}, {"n": 2}], Watermark(5_000), [{"n": 3}]],
                                         schema={"n": "long"}))
    ticks.sink("t", hr.sinks.Null())
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    result = run.wait()

    counted: Counter[str] = Counter()
    for figures in run.batches.figures:
        counted.update(figures["step_records"])
    assert (counted["bids"], counted["auctions"], counted["ticks"]) == (22, 5, 4)
    assert (counted["by_id"], counted["ids"]) == (20, 4)  # the sources' records less their bad lines
    assert result.input_rows == 22 + 5 + 4 and result.dead_letters == 3


def test_a_bounded_run_logs_each_batch_as_it_ends_not_at_its_end(spark, tmp_path, monkeypatch):
    """The progress log (``HEADRACE_PROGRESS_LOG``, what ``headrace server`` serves live) gets each
    micro-batch of a bounded run while the run goes on: the first batch's line is written before
    the last batch starts (before, every line came once the input was exhausted)."""
    log = tmp_path / "progress.jsonl"
    monkeypatch.setenv("HEADRACE_PROGRESS_LOG", str(log))
    p = hr.Pipeline("bounded_live")
    p.source("events", hr.sources.Generator("ysb", limit=20_000, rows_per_batch=1_000)).select(
        "ad_id", name="ad_ids").sink("ads", hr.sinks.Null())
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    batches = [line for line in lines if "batch" in line]
    assert [line["batch"] for line in batches] == list(range(result.batches))
    first, last = batches[0], batches[-1]
    assert first["at"] < last["at"] - last["batch_ms"] / 1000, (first, last)
