"""The suite's guard against a stalled test (tests/stall_watchdog.py), run as scripts/test.sh runs
the suite: in pytest-xdist workers, with no rerun."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

STALLING = '''
import time

import pytest

pytestmark = pytest.mark.fast  # needs no JVM and no service


@pytest.mark.timeout(3)
def test_stalls():
    time.sleep(60)


def test_passes():
    assert 1 == 1


def test_fails():
    assert 1 == 2
'''


def test_a_stalled_test_prints_its_stacks_and_fails_once_and_the_rest_runs(tmp_path):
    shutil.copy(TESTS / "stall_watchdog.py", tmp_path / "stall_watchdog.py")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["stall_watchdog"]\n')
    (tmp_path / "test_stalls.py").write_text(STALLING)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1", "--rootdir", str(tmp_path),
         str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "2 failed, 1 passed" in out, out
    assert "rerun" not in out
    assert "test_stalls.py::test_stalls still runs after 3 s" in out
    assert "in test_stalls" in out  # the stalled thread's stack
    assert "FAILED test_stalls.py::test_fails - assert 1 == 2" in out
