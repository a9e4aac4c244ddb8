"""A driver process for the connectors' SIGKILL tests: started in a process group of its own,
killed with SIGKILL (group and strays), or stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    children.setdefault(int(stat.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Driver:
    """A connector test's driver script (``tests/<system>_driver.py``, given its arguments as JSON)
    in a session (process group) of its own, so a kill takes Spark's JVM and workers with it."""

    def __init__(self, script: Path, args: dict[str, Any], log: Path) -> None:
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
        with open(log, "ab") as out:
            self.process = subprocess.Popen([sys.executable, str(script), json.dumps(args)], cwd=ROOT, env=env,
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.log = log

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while not check():
            if self.process.poll() is not None:
                pytest.fail(f"the driver exited ({self.process.returncode}) waiting for {what}: {self.tail()}")
            if time.time() > deadline:
                pytest.fail(f"no {what} after {timeout:.0f} s: {self.tail()}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL its process group, and the processes that left it (Spark's Python worker daemon)."""
        if self.process.poll() is None:
            strays = _descendants(self.process.pid)
            os.killpg(self.process.pid, signal.SIGKILL)
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.process.wait(30)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the driver did not stop within 120 s of SIGTERM: {self.tail()}")
        code = self.process.returncode
        assert code == 0, f"the driver exited with {code} after SIGTERM: {self.tail()}"

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


def driver_main(pipeline: Callable[[dict[str, Any]], Any]) -> None:
    """A driver script's main: the pipeline built from the script's JSON arguments, run until
    SIGTERM under ``args["state_dir"]``."""
    import headrace as hr

    args = json.loads(sys.argv[1])
    # The run handles SIGTERM while it runs; before that it is ignored, and so it is once a bounded input's
    # run has ended by itself and the process is exiting (else it would die of the signal, status -15).
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    hr.run(pipeline(args), state_dir=args["state_dir"], progress="quiet", until_exhausted=False)


class KilledRun:
    """A driver script run twice on one checkpoint and one output folder (``args["out"]``, JSON
    lines): killed with SIGKILL mid-stream, then restarted and stopped once its output is whole."""

    def __init__(self, script: Path, args: dict[str, Any], log: Path) -> None:
        self.script, self.args, self.log = script, args, log
        self.commits = Path(args["state_dir"]) / args["name"] / "checkpoint" / "commits"

    def committed(self) -> int:
        """Micro-batches in Spark's commit log."""
        return len(list(self.commits.glob("[0-9]*"))) if self.commits.is_dir() else 0

    def planned(self) -> int:
        """Micro-batches in Spark's offset log (planned, committed or not)."""
        offsets = self.commits.parent / "offsets"
        return len(list(offsets.glob("[0-9]*"))) if offsets.is_dir() else 0

    def written(self) -> list[dict[str, Any]]:
        """The rows the file sink committed."""
        from headrace.connectors.files_sink import read_rows

        out = self.args["out"]
        return read_rows(out, "jsonl") if os.path.isdir(out) else []

    def kill_after(self, batches: int) -> None:
        """Start the driver and kill its process group once ``batches`` micro-batches committed."""
        self.kill_when(f"{batches} committed micro-batches", lambda: self.committed() >= batches)

    def kill_when(self, what: str, check: Callable[[], bool]) -> None:
        """Start the driver and kill its process group once ``check()`` holds."""
        driver = Driver(self.script, self.args, self.log)
        try:
            driver.wait_for(what, check)
        finally:
            driver.kill()

    def restart_until(self, what: str, check: Callable[[], bool]) -> None:
        """Start the driver again; once ``check()`` holds, and a second more (a duplicate would
        show), stop it with SIGTERM."""
        driver = Driver(self.script, self.args, self.log)
        try:
            driver.wait_for(what, check)
            time.sleep(1)
            driver.stop()
        finally:
            driver.kill()
