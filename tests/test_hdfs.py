"""A state dir on a real HDFS (scripts/hdfs.sh: a NameNode and a DataNode on 127.0.0.1, from Apache
Hadoop's own jars): the checkpoint, ``plan.json`` and the query id go through Hadoop's FileSystem API,
the run files stay on the local disk, and a pipeline stopped part way is rescaled and continued from its
HDFS checkpoint with exactly the output of an uninterrupted run; a changed plan is refused."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.cli import main
from headrace.environment import storage
from headrace.environment.checkpoints import read_plan
from headrace.runtime.rescale import rescale, state_partitions
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "hdfs.sh"
NAME = "on_hdfs"

SCHEMA = {"key": "string", "value": "long", "ts": "timestamp"}
BATCHES = [
    [{"key": "a", "value": 1, "ts": 1_000}, {"key": "b", "value": 2, "ts": 2_000}],
    [{"key": "a", "value": 3, "ts": 4_000}, {"key": "b", "value": 4, "ts": 11_000}],
    [{"key": "a", "value": 5, "ts": 12_000}, {"key": "a", "value": 6, "ts": 7_000}],
    # the first run stops here: window [0 s, 10 s) of key a is open, its state in the HDFS checkpoint
    [{"key": "a", "value": 7, "ts": 8_000}, {"key": "b", "value": 8, "ts": 13_000}],
    [{"key": "a", "value": 9, "ts": 21_000}],
]
FIRST_RUN_STEPS = 3
UNINTERRUPTED = [("a", 0, 4, 17), ("a", 10, 1, 5), ("a", 20, 1, 9), ("b", 0, 1, 2), ("b", 10, 2, 12)]

PIPELINE_FILE = f"""
import headrace as hr
from headrace.testing import TestSink, TestSource

p = hr.Pipeline({NAME!r})
(p.source("events", TestSource({BATCHES!r}, schema={SCHEMA!r}), event_time="ts", max_out_of_orderness="5s")
 .key_by("key").window(hr.Tumbling("20s"), name="per_10s").aggregate(n=hr.count(), total=hr.sum("value"))
 .sink("out", TestSink()))
"""


def windows(size: str = "10s") -> tuple[hr.Pipeline, TestSink]:
    """Counts and sums per key per ``size`` tumbling window."""
    p = hr.Pipeline(NAME)
    out = TestSink()
    (p.source("events", TestSource(BATCHES, schema=SCHEMA), event_time="ts", max_out_of_orderness="5s")
     .key_by("key").window(hr.Tumbling(size), name="per_10s").aggregate(n=hr.count(), total=hr.sum("value"))
     .sink("out", out))
    return p, out


def rows(batches: dict[int, list[dict[str, Any]]]) -> list[tuple[str, int, int, int]]:
    """(key, window start in s, n, total) of every row."""
    return sorted((r["key"], int(r["window_start"].timestamp()), r["n"], r["total"])
                  for batch in batches.values() for r in batch)


def hdfs_names(spark: Any, uri: str) -> set[str]:
    """The entries of a directory on HDFS, listed with Hadoop's FileSystem API directly."""
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    assert fs.getScheme() == "hdfs"
    return {str(status.getPath().getName()) for status in fs.listStatus(path)}


@pytest.fixture(scope="module")
def hdfs() -> Iterator[str]:
    """The URI of a running HDFS: one scripts/hdfs.sh runs already, or one this module starts and stops."""
    from conftest import service_or_skip

    status = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=60)
    started = None
    if status.returncode != 0:
        started = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600)
        service_or_skip("HDFS", started.returncode == 0, f"scripts/hdfs.sh start: {started.stderr.strip()[-800:]}")
    uri = (started or status).stdout.strip()
    try:
        yield uri
    finally:
        if started is not None:
            subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def state(hdfs: str, spark: Any) -> Iterator[str]:
    """A state dir of this module's own on HDFS, deleted at the end."""
    folder = f"{hdfs}/headrace-test/{uuid.uuid4().hex[:8]}"
    yield folder
    storage.delete_tree(folder)


@pytest.fixture(scope="module")
def run_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("run-files")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADRACE_RUN_FILES_DIR", str(folder))
        yield folder


def test_a_pipeline_stopped_part_way_is_rescaled_and_continues_from_its_hdfs_checkpoint(spark, state, run_files):
    first, first_out = windows()
    steps: list[int] = []

    def stop_after_three(run: PipelineRun) -> None:
        steps.append(1)
        if len(steps) == FIRST_RUN_STEPS:
            run.request_stop("test")

    run = PipelineRun(first, state_dir=state, progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=stop_after_three)
    assert not run.exhausted()

    root = f"{state}/{NAME}"
    checkpoint = f"{root}/checkpoint"
    assert run.checkpoint == checkpoint
    assert {"plan.json", "checkpoint"} <= hdfs_names(spark, root)
    assert "run" not in hdfs_names(spark, root)  # the run files are local
    assert {"metadata", "offsets", "commits", "state"} <= hdfs_names(spark, checkpoint)
    assert {str(n) for n in range(FIRST_RUN_STEPS)} <= hdfs_names(spark, f"{checkpoint}/commits")
    stored = read_plan(root)
    assert stored is not None and stored["pipeline"] == NAME
    query = run._query_id
    assert query and query in storage.read_text(f"{checkpoint}/metadata")
    assert run.run_dir == str(run_files / NAME / query)
    assert (Path(run.run_dir) / "test_source" / "steps.released").read_text() == str(FIRST_RUN_STEPS)

    before = rescale(first, 3, state_dir=state)
    assert state_partitions(checkpoint) == 3 != before

    second, second_out = windows()
    again = PipelineRun(second, state_dir=state, progress="quiet").start()
    assert again.run_dir == run.run_dir  # the same checkpoint, the same query id, the same run files
    result = again.wait(until_exhausted=True)
    assert result.stopped_by == "input exhausted"
    assert min(second_out.batches) > max(first_out.batches)  # continued, not started over
    assert rows({**first_out.batches, **second_out.batches}) == UNINTERRUPTED


def test_a_changed_plan_is_refused_from_an_hdfs_checkpoint(spark, state, tmp_path, capsys):
    changed, _ = windows("20s")
    with pytest.raises(hr.IncompatibleCheckpoint) as refused:
        PipelineRun(changed, state_dir=state, progress="quiet").start()
    assert str(refused.value).startswith(
        f"pipeline '{NAME}' cannot restart from its checkpoint in {state}/{NAME}/checkpoint: stateful step "
        "'per_10s' (window, ")
    assert "changed window tumbling 10s → tumbling 20s" in str(refused.value)

    path = tmp_path / "changed.py"
    path.write_text(PIPELINE_FILE)
    assert main(["explain", str(path), "--against-checkpoint", "--state-dir", state]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"restart of pipeline '{NAME}' from {state}/{NAME}/checkpoint:"
    assert "stateful step 'per_10s' (window)  refused, changed: window tumbling 10s → tumbling 20s" in out


def test_a_fresh_run_forgets_the_hdfs_checkpoint_and_its_run_files(spark, state, run_files):
    old = storage.read_text(f"{state}/{NAME}/checkpoint/metadata")
    old_run_files = next(run_files.glob(f"{NAME}/*"))
    assert old_run_files.name in old

    changed, out = windows("20s")
    run = PipelineRun(changed, state_dir=state, progress="quiet", fresh=True).start()
    assert run.wait(until_exhausted=True).stopped_by == "input exhausted"
    assert rows(out.batches) == [("a", 0, 5, 22), ("a", 20, 1, 9), ("b", 0, 3, 14)]
    assert run._query_id not in old and not old_run_files.exists()
    assert [p.name for p in run_files.glob(f"{NAME}/*")] == [run._query_id]


# -- one driver per checkpoint on HDFS (headrace/environment/hdfs_lease.py) -----------------------------

def test_a_second_run_on_a_held_hdfs_checkpoint_is_refused_naming_the_first(spark, state, run_files):
    import os
    import re

    from headrace.environment.lease import LeaseHeld

    first, _ = windows()
    run = PipelineRun(first, state_dir=f"{state}/held", progress="quiet").start()
    try:
        second, _ = windows()
        with pytest.raises(LeaseHeld) as refused:
            PipelineRun(second, state_dir=f"{state}/held", progress="quiet").start()
        assert re.fullmatch(
            rf"pipeline 'on_hdfs' is running already, on the same state \({state}/held/on_hdfs.lease is held by "
            rf"process {os.getpid()} on \S+, started \S+: '.*', alive \d+\.\d s ago\): one driver runs a checkpoint "
            r"at a time; stop that run \(Ctrl-C or SIGTERM\), or give this one another state dir", str(refused.value))
    finally:
        run.wait(until_exhausted=True)
    assert "on_hdfs.lease" not in hdfs_names(spark, f"{state}/held")  # given back when the run ended
    PipelineRun(windows()[0], state_dir=f"{state}/held", progress="quiet").start().wait(until_exhausted=True)


def test_a_frozen_driver_is_taken_over_and_fenced_when_it_comes_back(state, run_files, tmp_path):
    """Driver A runs; a second driver started meanwhile is refused, naming A. Then A freezes
    (SIGSTOP of its process group: the JVM, Python, its workers); a driver started once A's
    heartbeat is older than hdfs_lease.STALE_S takes the lease over and goes on from the
    checkpoint. A, resumed, finds its lease gone: it stops with an error and commits nothing more.
    Every record is written once."""
    import json
    import os
    import signal
    import time

    from driver_process import Driver
    from input_files import write_in_order

    from headrace.connectors.files_sink import read_rows
    from headrace.environment.hdfs_lease import STALE_S

    folder = tmp_path / "input"
    folder.mkdir()

    def write_file(number: int) -> None:
        write_in_order(folder / f"part-{number:02d}.jsonl", "".join(json.dumps({"n": 10 * number + i}) + "\n"
                                                                      for i in range(3)), number)

    for number in range(2):
        write_file(number)
    args = {"name": "leased", "input": str(folder), "state_dir": f"{state}/zombie", "out": str(tmp_path / "out")}
    script = Path(__file__).resolve().parent / "hdfs_lease_driver.py"

    def written() -> list[int]:
        return sorted(r["n"] for r in read_rows(args["out"], "jsonl")) if os.path.isdir(args["out"]) else []

    a = Driver(script, args, tmp_path / "a.log")
    b = refused = None
    try:
        a.wait_for("two files written", lambda: len(written()) == 6)
        refused = Driver(script, args, tmp_path / "refused.log")  # while A runs (and writes its heartbeat)
        assert refused.process.wait(180) != 0
        assert f"held by process {a.process.pid} on " in refused.tail(), refused.tail()
        os.killpg(a.process.pid, signal.SIGSTOP)
        time.sleep(STALE_S + 0.5)
        b = Driver(script, args, tmp_path / "b.log")
        for number in range(2, 4):
            write_file(number)
        b.wait_for("four files written", lambda: len(written()) >= 12)
        os.killpg(a.process.pid, signal.SIGCONT)
        assert a.process.wait(120) != 0
        assert "lost its lease" in a.tail() and "fenced" in a.tail(), a.tail()
        write_file(4)
        b.wait_for("five files written", lambda: len(written()) >= 15)
        time.sleep(1)
        b.stop()
    finally:
        for driver in (a, b, refused):
            if driver is not None:
                os.killpg(driver.process.pid, signal.SIGCONT) if driver.process.poll() is None else None
                driver.kill()
    assert written() == sorted(10 * number + i for number in range(5) for i in range(3))
