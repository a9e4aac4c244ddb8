"""One driver per checkpoint (headrace/environment/lease.py): a second run on the state of a
running one is refused before Spark starts, naming the driver that holds it, and its --fresh
deletes nothing; a driver killed with SIGKILL leaves no lease behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import headrace as hr
from headrace.environment.lease import Lease, LeaseHeld
from headrace.runtime.runner import PipelineRun

pytestmark = pytest.mark.fast  # needs no JVM and no service

HOLD = """
import sys, time
from headrace.environment.lease import Lease

Lease(sys.argv[1], "clicks").acquire()
print("held", flush=True)
time.sleep(600)
"""


def holder(state_dir: Path) -> subprocess.Popen[str]:
    """Another process holding the lease of pipeline 'clicks' under ``state_dir``, until killed."""
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(state_dir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    return process


def test_a_lease_held_by_another_process_is_refused_naming_it_and_freed_by_its_death(tmp_path):
    other = holder(tmp_path)
    try:
        with pytest.raises(LeaseHeld) as refused:
            Lease(str(tmp_path), "clicks").acquire()
        assert str(refused.value) == (
            f"pipeline 'clicks' is running already, on the same state ({tmp_path}/clicks.lease is held by process "
            f"{other.pid} on {os.uname().nodename}, started "
            f"{json.loads((tmp_path / 'clicks.lease').read_text())['started']}: '-c {tmp_path}'): one driver runs a "
            "checkpoint at a time; stop that run (Ctrl-C or SIGTERM), or give this one another state dir")
        Lease(str(tmp_path), "views").acquire()  # another pipeline's lease is its own
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(10)
    lease = Lease(str(tmp_path), "clicks")
    lease.acquire()  # the kernel dropped the dead process's lock
    assert json.loads((tmp_path / "clicks.lease").read_text())["pid"] == os.getpid()
    lease.release()


def test_a_lease_is_one_runs_at_a_time_in_one_process_too(tmp_path):
    first, second = Lease(str(tmp_path), "clicks"), Lease(str(tmp_path), "clicks")
    first.acquire()
    with pytest.raises(LeaseHeld, match=rf"is held by process {os.getpid()} on "):
        second.acquire()
    first.release()
    second.acquire()
    second.release()


def clicks_pipeline() -> hr.Pipeline:
    p = hr.Pipeline("clicks")
    p.source("numbers", hr.sources.Generator(limit=10)).sink("out", hr.sinks.Null())
    return p


def test_a_run_on_a_held_checkpoint_is_refused_before_spark_starts_and_fresh_deletes_nothing(tmp_path):
    checkpoint = tmp_path / "clicks" / "checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "metadata").write_text('{"id": "kept"}')
    other = holder(tmp_path)
    try:
        for fresh in (False, True):
            with pytest.raises(LeaseHeld, match=rf"pipeline 'clicks' is running already, .* process {other.pid} "):
                PipelineRun(clicks_pipeline(), state_dir=str(tmp_path), progress="quiet", fresh=fresh).start()
        assert (checkpoint / "metadata").read_text() == '{"id": "kept"}'
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait(10)
