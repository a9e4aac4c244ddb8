"""Rescaling a stopped pipeline's keyed state (Spark's offline state repartition): 2 to 4
partitions and back, with exactly the output of an uninterrupted run; a rescale that fails
leaves the checkpoint as it was, and one in a new process (the CLI) works."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import headrace as hr
from headrace.runtime import rescale as rescale_module
from headrace.runtime.rescale import backup_dir, rescale, state_partitions, unfinished_rescale
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


def files(folder: Path) -> dict[str, bytes]:
    return {str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


def rescale_in_a_new_process(tmp_path: Path, state: str, partitions: int) -> subprocess.CompletedProcess[str]:
    """``headrace rescale FILE N`` as a user runs it: a process (and a Spark session) of its own,
    in which no streaming query has run."""
    app = tmp_path / "app.py"
    app.write_text("from test_rescale import build\n\np, _ = build('rescaled')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "headrace.cli", "rescale", str(app), str(partitions),
                           "--state-dir", state], capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted(spark, tmp_path_factory) -> list[str]:
    """The rows of a run without stops or rescales."""
    whole, whole_out = build("rescaled")
    hr.testing.run_to_completion(whole, state_dir=str(tmp_path_factory.mktemp("whole")))
    assert whole_out.rows()
    return rows(whole_out)


def stop_after(pipeline: hr.Pipeline, state: str, batches: int | None) -> PipelineRun:
    run = PipelineRun(pipeline, state_dir=state, progress="quiet").start()
    if batches is None:
        run.wait(until_exhausted=True)
    else:
        run.wait(until_exhausted=True, on_settled=lambda r: len(r.progress_log) >= batches and r.request_stop("test"))
    return run


def in_the_way(checkpoint: Path) -> Path:
    """A file where Spark writes the state of partition 3, which a 2-partition state lacks."""
    obstacle = next(checkpoint.glob("state/*/1")).parent / "3"
    obstacle.write_text("in the way")
    return obstacle


def test_rescale_to_four_partitions_and_back_keeps_exact_results(spark, tmp_path, uninterrupted):
    """2 -> 4 partitions in this process, after a rescale that failed for real (a file stands where
    Spark writes partition 3's state) and was undone; 4 -> 2 with the CLI in a new process."""
    state = str(tmp_path / "parts")
    collected: dict[int, list] = {}
    for batches, partitions in ((3, 4), (6, 2), (None, None)):
        part, out = build("rescaled")
        out.batches.update(collected)  # the same sink across the restarts
        run = stop_after(part, state, batches)
        collected = dict(out.batches)
        checkpoint = Path(run.checkpoint)
        if partitions == 4:
            as_it_was = files(checkpoint)
            obstacle = in_the_way(checkpoint)
            with pytest.raises(hr.HeadraceError) as failed:
                rescale(part, 4, state_dir=state)
            assert re.fullmatch(r"rescale 'rescaled' from 2 to 4 partitions failed: .+; the checkpoint is as it "
                                r"was \(2 partitions\) and the pipeline runs from it as before; fix the cause and "
                                r"run headrace rescale again", str(failed.value)), failed.value
            obstacle.unlink()
            assert files(checkpoint) == as_it_was
            assert not Path(backup_dir(run.checkpoint)).exists()
            assert rescale(part, 4, state_dir=state) == 2
        elif partitions == 2:
            done = rescale_in_a_new_process(tmp_path, state, 2)
            assert done.returncode == 0, done.stderr[-3000:]
            assert "rescaled: state rescaled from 4 to 2 partitions" in done.stdout
        if partitions is not None:
            assert state_partitions(run.checkpoint) == partitions
            assert unfinished_rescale(run.checkpoint) is None
    assert rows(out) == uninterrupted


def test_an_unfinished_rescale_is_refused_by_run_and_finished_by_the_next_rescale(spark, tmp_path, uninterrupted,
                                                                                  monkeypatch):
    """A rescale that fails where no copy can be kept (as on HDFS or S3) leaves an unfinished
    rescale: the run refuses it saying what to do, and the next rescale, to another number,
    finishes it first; the run then gives the exact output."""
    state = str(tmp_path / "state")
    first, out = build("rescaled")
    run = stop_after(first, state, 3)
    obstacle = in_the_way(Path(run.checkpoint))
    monkeypatch.setattr(rescale_module, "_keep_a_copy", lambda _checkpoint: None)
    with pytest.raises(hr.HeadraceError, match=r"^rescale 'rescaled' from 2 to 4 partitions failed: .+; the checkpoint "
                                               r".+ now ends with an unfinished rescale, which the pipeline cannot "
                                               r"start from: fix the cause and run headrace rescale again \(any "
                                               r"number of partitions: it finishes this one first\)$"):
        rescale(first, 4, state_dir=state)
    monkeypatch.undo()
    assert unfinished_rescale(run.checkpoint) == (2, 4)
    obstacle.unlink()

    refused, _ = build("rescaled")
    with pytest.raises(hr.HeadraceError, match=r"^pipeline 'rescaled': its checkpoint ends with a state rescale that "
                                               r"did not finish; run headrace rescale again \(any number of "
                                               r"partitions: it finishes the earlier rescale first\), then start "
                                               r"the pipeline$"):
        stop_after(refused, state, None)

    assert rescale(first, 3, state_dir=state) == 4
    assert unfinished_rescale(run.checkpoint) is None and state_partitions(run.checkpoint) == 3
    last, last_out = build("rescaled")
    last_out.batches.update(out.batches)
    stop_after(last, state, None)
    assert rows(last_out) == uninterrupted


def test_rescale_refuses_what_it_cannot_do(spark, tmp_path):
    p, _ = build("never_ran")
    with pytest.raises(hr.HeadraceError, match=r"rescale 'never_ran': no checkpoint with processed batches at .*; "
                                               r"run the pipeline first"):
        rescale(p, 4, state_dir=str(tmp_path))
    with pytest.raises(hr.HeadraceError, match=r"the number of partitions must be a positive integer, got 0"):
        rescale(p, 0, state_dir=str(tmp_path))


def test_a_rescaled_pipeline_killed_after_running_on_restarts_to_exact_output(spark, tmp_path):
    """A keyed running total into two Files sinks (a directory per batch): stopped, rescaled (the
    rescale's batch reaches no sink), run on, its driver's process group SIGKILLed, started
    again: each sink holds plain Python's running totals, each once."""
    from driver_process import Driver, KilledRun
    from input_files import write_in_order
    from rescale_driver import pipeline

    from headrace.connectors.files_sink import read_rows

    inbox = tmp_path / "in"
    inbox.mkdir()
    files = [[{"key": key, "v": 10 * number + index} for index, key in enumerate("abcdef")] for number in range(9)]
    args = {"name": "rescaled_files", "state_dir": str(tmp_path / "state"), "input": str(inbox),
            "out": str(tmp_path / "out"), "copy": str(tmp_path / "copy")}
    run, log = KilledRun(Path(__file__).parent / "rescale_driver.py", args, tmp_path / "driver.log"), tmp_path / "log"

    def offer(numbers: range) -> None:
        for number in numbers:
            write_in_order(inbox / f"{number}.jsonl", "".join(json.dumps(r) + "\n" for r in files[number]), number)

    def written(sink: str) -> list[dict]:
        return read_rows(args[sink], "jsonl") if os.path.isdir(args[sink]) else []

    def rows_of(numbers: range) -> int:
        return sum(len(files[number]) for number in numbers)

    offer(range(3))
    first = Driver(run.script, args, log)
    first.wait_for("the first 3 files in both sinks", lambda: len(written("copy")) == rows_of(range(3)))
    first.stop()
    checkpoint = str(tmp_path / "state" / args["name"] / "checkpoint")
    before = state_partitions(checkpoint)
    assert before is not None
    assert rescale(pipeline(args), before + 1, state_dir=args["state_dir"]) == before
    rescaled_at = run.committed() - 1  # the rescale's batch, committed and never given to a sink

    offer(range(3, 9))
    run.kill_when("two batches after the rescale's in both sinks",
                  lambda: len(written("copy")) >= rows_of(range(5)))
    assert state_partitions(checkpoint) == before + 1
    last = Driver(run.script, args, log)
    last.wait_for("every file in both sinks", lambda: len(written("copy")) == rows_of(range(9)))
    last.stop()

    totals: dict[str, int] = {}
    expected = []
    for record in (record for rows in files for record in rows):
        totals[record["key"]] = totals.get(record["key"], 0) + record["v"]
        expected.append((record["key"], totals[record["key"]]))
    for sink in ("out", "copy"):
        assert sorted((r["key"], r["total"]) for r in written(sink)) == sorted(expected), sink
        assert not (Path(args[sink]) / f"batch-{rescaled_at:012d}").exists()
