"""The chaos check (``benchmarks/chaos.py``): a stateful pipeline whose driver is killed with
SIGKILL three times, some kills landing between the sink's commit and Spark's, and restarted
from its checkpoint each time, writes exactly the windows computed without headrace."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLOSING = re.compile(r"chaos kills=(\d+) recovered=(\d+) median_recovery_s=[\d.]+ max_recovery_s=[\d.]+ "
                     r"verify=(ok|FAILED)")


def _postgres_or_skip() -> None:
    from conftest import service_or_skip
    try:
        import psycopg
        psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=5).close()
        reachable, why = True, ""
    except Exception as exc:  # noqa: BLE001
        reachable, why = False, str(exc)
    service_or_skip("PostgreSQL", reachable, why)


@pytest.mark.parametrize("sink", ["postgres", "files"])
def test_three_kills_lose_and_duplicate_nothing(sink, tmp_path):
    if sink == "postgres":
        _postgres_or_skip()
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), "--sink", sink, "--kills", "3", "--seed", "3",
         "--events", "15000", "--work", str(tmp_path / "chaos")],
        capture_output=True, text=True, env=env, timeout=900)
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr[-2000:]
    match = CLOSING.fullmatch(lines[-1])
    assert match, result.stdout[-3000:] + result.stderr[-2000:]
    assert match.groups() == ("3", "3", "ok"), result.stdout[-3000:]
    assert result.returncode == 0
    assert any("Spark's commit log had" in line for line in lines), "no kill landed between the two commits"
