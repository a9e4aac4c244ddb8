"""History, then live, on one checkpoint (``--backfill``, docs/backfill.md): the files already in
the folder are read in bounded micro-batches, then the live query reads exactly the files that
come after; checked against the files written, also across a restart in the middle and from the
command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.connectors.files_sink import read_rows
from headrace.runtime.runner import PipelineRun

ROOT = Path(__file__).resolve().parent.parent


def write_part(folder: Path, number: int) -> list[int]:
    ids = list(range(number * 100, number * 100 + 100))
    write_in_order(folder / f"part-{number}.jsonl", "".join(json.dumps({"id": i}) + "\n" for i in ids), number)
    return ids


def pipeline(folder: Path, out: Path) -> hr.Pipeline:
    p = hr.Pipeline("orders_backfill")
    (p.source("orders", hr.sources.Files(str(folder), "jsonl", "id long", max_files_per_batch=1))
     .with_columns(doubled=hr.col("id") * 2)
     .sink("out", hr.sinks.Files(str(out), format="jsonl")))
    return p


def written(out: Path) -> list[dict]:
    return read_rows(str(out), "jsonl") if out.is_dir() else []


def wait_for(what: str, check, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while not check():
        assert time.time() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.1)


def test_the_history_in_bounded_batches_then_exactly_the_new_files_live(spark, tmp_path):
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    history = [i for n in range(4) for i in write_part(folder, n)]
    run = PipelineRun(pipeline(folder, out), state_dir=str(tmp_path / "state"), progress="quiet", backfill=True)
    run.start()
    result: dict = {}
    waiting = threading.Thread(target=lambda: result.update(run=run.wait()))
    waiting.start()
    try:
        wait_for("end of the backfill", lambda: run.backfilled_to is not None or not waiting.is_alive())
        assert run.backfilled_to == 3  # four files, a bounded micro-batch each
        assert sorted(r["id"] for r in written(out)) == history
        live = [i for n in (4, 5) for i in write_part(folder, n)]
        wait_for("the new files", lambda: len(written(out)) >= len(history) + len(live))
    finally:
        run.request_stop("test over")
        waiting.join(120)
    rows = written(out)
    assert sorted(r["id"] for r in rows) == history + live
    assert all(r["doubled"] == 2 * r["id"] for r in rows)
    inputs = [report["numInputRows"] for report in run.progress_log if report["numInputRows"]]
    assert inputs == [100] * 6  # the history's four batches, then each new file in a batch of its own


def test_a_backfill_stopped_half_way_goes_on_from_its_checkpoint_and_the_command_line_runs_it(spark, tmp_path):
    """A backfill of twelve files stopped after its first batch, then ``headrace run FILE --backfill`` (in a
    process of its own, stopped with --max-seconds): the rest of the history and nothing twice."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    history = [i for n in range(12) for i in write_part(folder, n)]  # enough that a stop lands half-way
    run = PipelineRun(pipeline(folder, out), state_dir=str(tmp_path / "state"), progress="quiet", backfill=True)
    run.start()
    waiting = threading.Thread(target=run.wait)
    waiting.start()
    wait_for("the first batch", lambda: len(written(out)) >= 100)
    run.request_stop("test: half way")
    waiting.join(120)
    assert run.backfilled_to is None and len(written(out)) < len(history)
    script = tmp_path / "orders_backfill.py"
    script.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
                      f"from pathlib import Path\nfrom test_backfill import pipeline\n"
                      f"p = pipeline(Path({str(folder)!r}), Path({str(out)!r}))\n")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    command = subprocess.Popen([str(Path(sys.executable).parent / "headrace"), "run", str(script), "--backfill",
                                "--state-dir", str(tmp_path / "state")], cwd=ROOT, env=env, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        lines = []
        for line in command.stderr:  # progress lines, then the backfill's end
            lines.append(line)
            if line.startswith("backfill done"):
                break
        assert lines and lines[-1] == "backfill done: the history read up to batch 11; now live\n", "".join(lines)
    finally:
        command.send_signal(signal.SIGTERM)
        command.wait(120)
    assert command.returncode == 0, "".join(lines) + command.stderr.read()[-2000:]
    assert sorted(r["id"] for r in written(out)) == history


@pytest.mark.parametrize("options, message", [
    ({"backfill": True, "drain": True}, "a backfill goes on live after the history, a drain ends the pipeline for "
                                        "good; ask for one of them"),
])
@pytest.mark.fast
def test_a_backfill_that_cannot_run_is_refused(tmp_path, options, message):
    with pytest.raises(hr.PlanError, match=message):
        PipelineRun(pipeline(tmp_path, tmp_path / "out"), state_dir=str(tmp_path / "state"), **options)
