"""Kafka with three brokers (scripts/kafka.sh start --brokers 3, on ports of this module's own):
a broker is killed with SIGKILL while a pipeline reads and writes replicated topics through
the transactional sink, and the output read ``read_committed`` still holds every record once.

Topics are replicated three times with ``min.insync.replicas=2``, as the sink's commits topic and
Kafka's transaction and offsets topics are on this cluster, so losing one broker loses no
acknowledged write; partition leaders and the transaction coordinator move to the survivors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip

import headrace as hr
from headrace.environment import jars
from headrace.runtime.runner import PipelineRun
from headrace.testing.kafka import read_topic

kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PORT = 19392  # brokers on 19392-19394, controllers on 19492-19494
VICTIM = 2  # the node killed


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Three brokers of their own (a folder of this module's), stopped at the end."""
    folder = tmp_path_factory.mktemp("kafka3")
    script = ["bash", str(ROOT / "scripts" / "kafka.sh")]
    started = subprocess.run([*script, "start", "--brokers", "3", "--port", str(PORT), "--dir", str(folder)],
                             capture_output=True, text=True, timeout=300)
    service_or_skip("a 3-broker Kafka", started.returncode == 0, started.stderr.strip()[-800:])
    if not jars.fetched().get(jars.KAFKA.name):
        service_or_skip("Spark's Kafka connector", False, "run bash scripts/fetch_jars.sh")
    try:
        yield started.stdout.strip(), folder
    finally:
        subprocess.run([*script, "stop", "--dir", str(folder)], capture_output=True, timeout=120)


def replicated_topic(servers: str) -> str:
    name = f"r_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": servers})
    topic = NewTopic(name, 2, 3, config={"min.insync.replicas": "2"})
    for future in admin.create_topics([topic]).values():
        future.result(60)
    return name


def produce(servers: str, topic: str, orders: list[dict[str, Any]]) -> None:
    producer = kafka.Producer({"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True})
    for order in orders:
        producer.produce(topic, key=order["user"], value=json.dumps(order))
    assert producer.flush(60) == 0


def committed_records(servers: str, topic: str) -> list[tuple[str, int, int]]:
    return sorted((r.key, r.json()["order_id"], r.json()["doubled"]) for r in read_topic(servers, topic))


def wait_for_commit(run: PipelineRun, batches: int, timeout_s: float = 120) -> None:
    commits = Path(run.checkpoint) / "commits"
    deadline = time.time() + timeout_s
    while len([n for n in os.listdir(commits) if n.isdigit()] if commits.exists() else []) < batches:
        assert time.time() < deadline, f"no {batches} committed batches after {timeout_s} s"
        assert run.query.isActive, run.query.exception()
        time.sleep(0.2)


def test_a_killed_broker_loses_and_duplicates_nothing(spark: Any, cluster: tuple[str, Path],
                                                      tmp_path: Path) -> None:
    servers, folder = cluster
    source, sink = replicated_topic(servers), replicated_topic(servers)
    orders = [{"order_id": i, "user": f"u{i % 7}", "amount": i % 5} for i in range(400)]
    produce(servers, source, orders[:200])
    p = hr.Pipeline("kafka_replicated")
    (p.source("orders", hr.sources.Kafka(source, schema="order_id long, user string, amount long",
                                         servers=servers, max_records_per_batch=50))
     .with_columns(doubled=hr.col("amount") * 2).select("order_id", "user", "doubled")
     .sink("out", hr.sinks.Kafka(sink, servers, key="user")))
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    try:
        wait_for_commit(run, 2)
        victim = int((folder / f"node-{VICTIM}" / "kafka.pid").read_text())
        os.kill(victim, signal.SIGKILL)
        produce(servers, source, orders[200:])
        run.settle()
    finally:
        run.request_stop("test done")
        run.wait(until_exhausted=False)
    assert committed_records(servers, sink) == sorted((o["user"], o["order_id"], o["amount"] * 2) for o in orders)
