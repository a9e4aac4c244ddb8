"""Each driver's Spark scratch folder (headrace/environment/local_dirs.py): a driver killed with
SIGKILL leaves its folder behind, and the next driver that starts removes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from headrace.environment.local_dirs import remove_dead, started_at

PIPELINE = """
import os

import headrace as hr

p = hr.Pipeline(os.environ["HR_TEST_NAME"])
(p.source("numbers", hr.sources.Files(os.environ["HR_TEST_IN"], format="jsonl", schema={"n": "long"},
                                      bounded=os.environ["HR_TEST_BOUNDED"] == "1"))
  .sink("out", hr.sinks.Files(os.environ["HR_TEST_OUT"], format="jsonl")))
"""


@pytest.mark.fast
def test_the_folders_of_processes_that_no_longer_run_are_removed(tmp_path):
    """Kept: this process's folder and a name that is not a driver's. Removed: the folder of a process
    that ended, and of a process id now held by another process (another start time)."""
    ended = subprocess.Popen(["sleep", "30"])
    ended_start = started_at(ended.pid)
    ended.kill()
    ended.wait()
    me, my_start = os.getpid(), started_at(os.getpid())
    names = {"alive": f"{me}-{my_start}", "ended": f"{ended.pid}-{ended_start}", "reused": f"{me}-{my_start + 1}",
             "other": "notes"}
    for name in names.values():
        (tmp_path / name / "spark-1").mkdir(parents=True)
    assert sorted(remove_dead(str(tmp_path))) == sorted([names["ended"], names["reused"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names["alive"], names["other"]])


def run(folder: Path, name: str, bounded: bool) -> subprocess.Popen:
    script = folder / f"{name}.py"
    script.write_text(textwrap.dedent(PIPELINE))
    (folder / name / "in").mkdir(parents=True)
    (folder / name / "in" / "0.jsonl").write_text("".join(json.dumps({"n": n}) + "\n" for n in range(5)))
    env = {**os.environ, "TMPDIR": str(folder / "tmp"), "HR_TEST_NAME": name, "HR_TEST_IN": str(folder / name / "in"),
           "HR_TEST_OUT": str(folder / name / "out"), "HR_TEST_BOUNDED": "1" if bounded else "0"}
    return subprocess.Popen([sys.executable, "-m", "headrace.cli", "run", str(script), "--state-dir",
                             str(folder / "state"), "--quiet"], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_a_driver_killed_with_sigkill_leaves_its_scratch_files_which_the_next_driver_removes(tmp_path):
    (tmp_path / "tmp").mkdir()
    root = tmp_path / "tmp" / f"headrace-spark-{os.getuid()}"
    killed = run(tmp_path, "killed", bounded=False)
    try:
        deadline = time.time() + 180
        while not list((tmp_path / "killed" / "out").glob("part-*")):  # its first batch is written
            assert killed.poll() is None and time.time() < deadline, "the driver wrote no batch"
            time.sleep(0.2)
        own = root / f"{killed.pid}-{started_at(killed.pid)}"
        assert any(p.name.startswith("spark-") for p in own.iterdir())  # Spark's scratch files are here
    finally:
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait()
    assert any(own.rglob("*")), "the killed driver's files stay until a driver starts"
    second = run(tmp_path, "second", bounded=True)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-3000:]
    assert not own.exists()
    assert err == ""
