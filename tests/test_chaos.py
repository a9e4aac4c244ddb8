"""The chaos check (``benchmarks/chaos.py``): a stateful pipeline whose driver is killed with
SIGKILL once, right after the sink committed a batch that Spark's commit log does not have yet,
and restarted from its checkpoint, writes exactly the windows computed without headrace: from two
generators through a join of the two streams into files, and from a Kafka topic (transactions)
into another Kafka topic. The
20-kill runs are in docs/guarantees.md."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from headrace.environment import jars

ROOT = Path(__file__).resolve().parents[1]
CLOSING = re.compile(r"chaos kills=(\d+) recovered=(\d+) median_recovery_s=[\d.]+ max_recovery_s=[\d.]+ "
                     r"verify=(ok|FAILED)")


def _kafka_reachable() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 9092), timeout=1).close()
        return True
    except OSError:
        return False


def _kafka_or_skip() -> None:
    """A broker on 127.0.0.1:9092 (started with scripts/kafka.sh when none runs), confluent-kafka
    and Spark's Kafka connector, or a skip (a failure in CI) saying which is missing."""
    from conftest import service_or_skip

    pytest.importorskip("confluent_kafka")
    if not _kafka_reachable():
        started = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"], capture_output=True,
                                 text=True, timeout=300)
        service_or_skip("Kafka", started.returncode == 0 and _kafka_reachable(), started.stderr.strip()[-500:])
    if not jars.fetched().get(jars.KAFKA.name):
        service_or_skip("Spark's Kafka connector", False, "run bash scripts/fetch_jars.sh")


def _one_kill(tmp_path: Path, *options: str) -> None:
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), *options, "--kills", "1", "--seed", "3",
         "--events", "5000", "--work", str(tmp_path / "chaos")],
        capture_output=True, text=True, env=env, timeout=900)
    lines = result.stdout.strip().splitlines()
    assert lines, result.stderr[-2000:]
    match = CLOSING.fullmatch(lines[-1])
    assert match, result.stdout[-3000:] + result.stderr[-2000:]
    assert match.groups() == ("1", "1", "ok"), result.stdout[-3000:]
    assert result.returncode == 0
    assert any("Spark's commit log had" in line for line in lines), "no kill landed between the two commits"


def test_a_kill_of_a_join_chained_into_a_window_between_the_commits_loses_and_duplicates_nothing(tmp_path):
    """Two generators -> a join of the two streams -> a native window -> files (the Kafka case
    below runs the window processor alone)."""
    _one_kill(tmp_path, "--sink", "files", "--pipeline", "join")


def test_a_supervised_sql_join_of_windowed_aggregates_killed_between_the_commits_loses_and_duplicates_nothing(
        tmp_path):
    """A generator -> NEXMark q5's SQL (counts per user and window, joined to each window's largest
    count: the stream read twice, an aggregate of an aggregate, a join) -> files, submitted to
    ``headrace server``, whose supervisor restarts the killed driver."""
    _one_kill(tmp_path, "--sink", "files", "--pipeline", "sql", "--supervised")


def test_a_kill_of_a_kafka_pipeline_between_the_commits_loses_and_duplicates_nothing(tmp_path):
    """Kafka into Kafka: the source is a new topic the check fills first; the sink writes each
    batch in a transaction, and the check reads its topic read_committed. The other sinks under a
    kill between the commits: tests/test_sink_matrix.py; ``benchmarks/chaos.py --source kafka
    --sink postgres`` (or ``delta``) runs them from Kafka."""
    _kafka_or_skip()
    _one_kill(tmp_path, "--source", "kafka", "--sink", "kafka")
