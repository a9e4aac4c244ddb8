"""The suite's guard against a stalled test (tests/stall_watchdog.py), run as scripts/test.sh runs
the suite: in pytest-xdist workers, with ``--reruns 1 --only-rerun "crashed while running"``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

STALLING = '''
import time
from pathlib import Path

import pytest

MARK = Path(__file__).with_name("stalled_once")


@pytest.mark.timeout(3)
def test_stalls_the_first_time():
    if not MARK.exists():
        MARK.write_text("")
        time.sleep(60)


@pytest.mark.timeout(3)
def test_stalls_every_time():
    time.sleep(60)


def test_fails():
    assert 1 == 2
'''


def test_a_stalled_test_prints_its_stacks_and_runs_once_more_and_a_failure_runs_once(tmp_path):
    shutil.copy(TESTS / "stall_watchdog.py", tmp_path / "stall_watchdog.py")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["stall_watchdog"]\n')
    (tmp_path / "test_stalls.py").write_text(STALLING)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--reruns", "1",
         "--only-rerun", "crashed while running", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed, 1 passed, 2 rerun" in out, out
    assert "test_stalls.py::test_stalls_the_first_time still runs after 3 s" in out
    assert 'in test_stalls_every_time' in out  # the stalled thread's stack
    assert "FAILED test_stalls.py::test_fails - assert 1 == 2" in out
