"""Pipelines on a real Spark standalone cluster: a master and two workers on 127.0.0.1 started from
the installed pyspark (scripts/spark_cluster.sh, ports of this module's own), reading the Kafka broker
of scripts/kafka.sh.

Each test runs its pipeline in a driver process of its own (tests/cluster_driver.py: this process
has its local Spark session already), with ``master="spark://..."``. Once a batch has committed, and
while worker 1's executor runs a task (its log says so), worker 1 is killed with SIGKILL, its
executor and Python workers with it, as when a machine is lost. Spark runs the lost task again on
the other worker, whose executor loads the lost one's share of the state from the checkpoint; the
driver's report (Spark's status store) shows the task lost and run again there. The rest of the
records go in after the kill, and the output must then hold exactly what plain Python computes from
the records produced: a lost batch shows as missing rows, a batch written twice as extra ones.
The last test checks, without a cluster, which settings win when spark-submit runs a pipeline."""

from __future__ import annotations

import datetime
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_DSN, service_or_skip

from headrace.environment import jars
from headrace.testing.kafka import read_topic

kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "spark_cluster.sh"
DRIVER = Path(__file__).resolve().parent / "cluster_driver.py"
SERVERS = "127.0.0.1:9092"
WORKERS = 2
VICTIM = 1  # the worker each test kills
DELAY_S = 0.01  # the pipelines' Python filter takes this long per record: a task lasts long enough to be seen


# -- the cluster ---------------------------------------------------------------------------------

@dataclass
class Cluster:
    url: str
    folder: Path
    port: int

    def script(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "HEADRACE_PYTHON": sys.executable, "PYSPARK_PYTHON": sys.executable}
        return subprocess.run(["bash", str(SCRIPT), *args, "--dir", str(self.folder)], capture_output=True,
                              text=True, timeout=timeout, env=env)

    def start(self) -> subprocess.CompletedProcess[str]:
        return self.script("start", "--workers", str(WORKERS), "--port", str(self.port))

    def kill_worker(self, number: int) -> int:
        done = self.script("kill-worker", str(number))
        assert done.returncode == 0, done.stderr
        return int(done.stdout.strip())

    def executors_on(self, worker: int, app_id: str) -> set[str]:
        """The ids of the executors ``worker`` ran for the application (its work folder has one each)."""
        return {entry.name for entry in (self.folder / f"worker-{worker}" / "work" / app_id).glob("*")}


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports() -> int:
    """A master port P with P, P+1000 (the master's web UI) and P+1001.. (the workers') free: a cluster
    of this test run's own, beside any other on this machine."""
    for _ in range(50):
        port = random.randrange(21000, 29000)
        if all(_free(p) for p in (port, port + 1000, *(port + 1000 + i for i in range(1, WORKERS + 1)))):
            return port
    raise RuntimeError("no free ports for a Spark master")


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def broker() -> str:
    if not _reachable(9092):
        started = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"], capture_output=True,
                                 text=True, timeout=300)
        service_or_skip("Kafka", started.returncode == 0 and _reachable(9092), started.stderr.strip()[-500:])
    if not jars.fetched().get(jars.KAFKA.name):
        service_or_skip("Spark's Kafka connector", False, "run bash scripts/fetch_jars.sh")
    return SERVERS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A master and two workers of this module's own, stopped at the module's end."""
    if shutil.which("curl") is None:
        service_or_skip("a Spark standalone cluster", False, "scripts/spark_cluster.sh needs curl")
    cluster = Cluster("", tmp_path_factory.mktemp("spark-cluster"), free_ports())
    try:
        started = cluster.start()
        service_or_skip("a Spark standalone cluster", started.returncode == 0,
                        f"scripts/spark_cluster.sh start: {started.stderr.strip()[-800:]}")
        cluster.url = started.stdout.strip()
        yield cluster
    finally:
        cluster.script("stop")


@pytest.fixture
def full_cluster(cluster: Cluster) -> Cluster:
    """The cluster with every worker running: the one an earlier test killed is started again."""
    started = cluster.start()
    assert started.returncode == 0, started.stderr
    print(started.stderr.strip(), flush=True)
    return cluster


# -- Kafka ---------------------------------------------------------------------------------------

def new_topic(partitions: int = 2) -> str:
    name = f"cluster_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": SERVERS})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    return name


def produce(topic: str, records: list[dict[str, Any]]) -> None:
    """Each record as JSON, record i of the list into partition i % 2."""
    producer = kafka.Producer({"bootstrap.servers": SERVERS})
    for i, record in enumerate(records):
        producer.produce(topic, value=json.dumps(record), partition=i % 2)
    assert producer.flush(30) == 0


def committed_records(topic: str) -> list[dict[str, Any]]:
    """Every record of ``topic`` a read_committed consumer gets (JSON values)."""
    return [record.json() for record in read_topic(SERVERS, topic)]


# -- the driver ----------------------------------------------------------------------------------

@dataclass
class Driver:
    process: subprocess.Popen[bytes]
    checkpoint: Path
    out: Path
    err: Path
    started: float

    def note(self, what: str) -> None:
        """A line with the time since the driver started (shown when a test fails, or with -s)."""
        print(f"{time.time() - self.started:6.1f} s  {what}", flush=True)

    def tail(self) -> str:
        return self.err.read_text(errors="replace")[-3000:] if self.err.exists() else ""

    def batches(self, folder: str) -> list[int]:
        path = self.checkpoint / folder
        return sorted(int(f.name) for f in path.glob("[0-9]*")) if path.is_dir() else []

    def wait_for(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.time() + timeout
        while not check():
            if self.process.poll() is not None:
                pytest.fail(f"the driver exited ({self.process.returncode}) while waiting for {what}:\n{self.tail()}")
            if time.time() > deadline:
                pytest.fail(f"no {what} after {timeout:.0f} s; the driver's stderr ends:\n{self.tail()}")
            time.sleep(0.02)
        self.note(what)

    def stop(self) -> dict[str, Any]:
        """SIGTERM (a stop at the next batch boundary), then its report."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the driver did not stop within 120 s of SIGTERM:\n{self.tail()}")
        assert self.process.returncode == 0, self.tail()
        self.note("driver stopped")
        return dict(json.loads(self.out.read_text().strip().splitlines()[-1]))

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: its JVM and Python workers too
            self.process.wait(30)


@pytest.fixture
def run_driver(tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    started: list[Driver] = []

    def start(cluster: Cluster, **args: Any) -> Driver:
        state = tmp_path / "state"
        args = {**args, "master": cluster.url, "state_dir": str(state), "servers": SERVERS}
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
               "HEADRACE_SPARK_LOG": str(tmp_path / "driver-spark.log")}
        out, err = tmp_path / "driver.out", tmp_path / "driver.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(args)], cwd=ROOT, env=env,
                                       stdout=stdout, stderr=stderr, start_new_session=True)
        driver = Driver(process, state / args["name"] / "checkpoint", out, err, time.time())
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.kill()


def running_tasks(log: Path) -> set[str]:
    """The tasks an executor's log says it started and has not finished (by task id)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    started, finished = (set(re.findall(rf"{word} task .* \(TID (\d+)\)", text)) for word in ("Running", "Finished"))
    return started - finished


def kill_while_running(cluster: Cluster, driver: Driver) -> int:
    """SIGKILL worker VICTIM while its executor runs a task of the application started last."""
    work = cluster.folder / f"worker-{VICTIM}" / "work"

    def victim_busy() -> bool:
        apps = sorted(work.glob("app-*"))
        return bool(apps) and any(running_tasks(log) for log in apps[-1].glob("*/stderr"))

    driver.wait_for(f"a task running on worker {VICTIM}", victim_busy, 120)
    killed = cluster.kill_worker(VICTIM)
    driver.note(f"worker {VICTIM} (pid {killed}) killed")
    return killed


def assert_worker_lost(cluster: Cluster, report: dict[str, Any], killed_pid: int) -> None:
    """The killed worker is gone and Spark lost its executor, with the task it was running; that task
    ran again, and succeeded, on the other worker's executor, which lived on (after the kill it ran
    every task: it was the only executor left)."""
    with pytest.raises(ProcessLookupError):
        os.kill(killed_pid, 0)
    assert report["master"] == cluster.url
    assert report["result"]["restarts"] == 0, "Spark did not get past the loss by itself: headrace restarted the query"
    executors = {e["id"]: e for e in report["executors"]}
    lost = cluster.executors_on(VICTIM, report["app_id"])
    kept = cluster.executors_on(WORKERS + 1 - VICTIM, report["app_id"])
    assert len(lost) == 1 and len(kept) == 1, (lost, kept, report["executors"])
    assert all(not executors[e]["active"] and "worker lost" in executors[e]["remove_reason"] for e in lost)
    assert all(executors[e]["active"] and executors[e]["completed_tasks"] > 0 for e in kept)
    failed = [t for t in report["tasks"] if t["executor"] in lost and t["status"] == "FAILED"]
    assert failed and all("ExecutorLostFailure" in t["error"] for t in failed), report["tasks"]
    for task in failed:
        assert any(t["stage"] == task["stage"] and t["index"] == task["index"] and t["status"] == "SUCCESS"
                   and t["executor"] in kept for t in report["tasks"]), (task, report["tasks"])


# -- the tests -----------------------------------------------------------------------------------

BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def stamp(at: datetime.datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def events(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` events 70 ms apart in event time, each of a random one of four users."""
    rng = random.Random(seed)
    return [{"user": f"u{rng.randrange(4)}", "n": i,
             "event_time": stamp(BASE + datetime.timedelta(milliseconds=70 * i))} for i in range(count)]


def per_second(records: list[dict[str, Any]]) -> list[tuple[str, int, int, int]]:
    """(user, window start, window end, count) of each 1 s tumbling window, in epoch seconds."""
    counts = Counter((r["user"], int(datetime.datetime.fromisoformat(r["event_time"]).timestamp()))
                     for r in records)
    return sorted((user, start, start + 1, n) for (user, start), n in counts.items())


def table_rows(pg: Any, table: str) -> list[tuple[str, int, int, int]]:
    try:
        found = pg.execute(f'SELECT "user", extract(epoch FROM window_start)::bigint, '
                           f'extract(epoch FROM window_end)::bigint, "count" FROM "{table}"').fetchall()
    except Exception as exc:  # noqa: BLE001 - not created yet (no batch with rows so far)
        if "does not exist" in str(exc):
            return []
        raise
    return sorted(tuple(row) for row in found)


def test_windowed_counts_to_postgres_survive_a_lost_worker(broker: str, full_cluster: Cluster, pg: Any,
                                                           run_driver: Callable[..., Driver]) -> None:
    topic, table = new_topic(), f"cluster_counts_{uuid.uuid4().hex[:10]}"
    records = events(300, seed=7)
    closing = {"user": "u0", "n": -1, "event_time": stamp(BASE + datetime.timedelta(hours=1))}  # fires the rest
    expected = per_second(records)
    produce(topic, records[:120])
    driver = run_driver(full_cluster, pipeline="windows", name="cluster_windows", topic=topic, table=table,
                        dsn=PG_DSN, delay_s=DELAY_S)
    try:
        driver.wait_for("first committed batch", lambda: bool(driver.batches("commits")), 240)
        produce(topic, records[120:200])
        killed = kill_while_running(full_cluster, driver)
        produce(topic, records[200:] + [closing])
        driver.wait_for(f"{len(expected)} windows in {table}", lambda: len(table_rows(pg, table)) >= len(expected),
                        180)
        report = driver.stop()
    finally:
        driver.kill()

    rows = table_rows(pg, table)
    assert len(rows) == len(set(rows)), "a window was written twice"
    assert rows == expected
    assert sum(row[3] for row in rows) == len(records)
    assert report["result"]["input_rows"] >= len(records) + 1
    assert_worker_lost(full_cluster, report, killed)
    pg.execute(f'DROP TABLE IF EXISTS "{table}"')


def test_filtered_records_to_kafka_survive_a_lost_worker(broker: str, full_cluster: Cluster,
                                                         run_driver: Callable[..., Driver]) -> None:
    source, sink = new_topic(), new_topic()
    rng = random.Random(11)
    orders = [{"order_id": i, "user": f"u{rng.randrange(5)}", "amount": rng.randrange(5)} for i in range(300)]
    expected = sorted((o["order_id"], o["user"], o["amount"]) for o in orders if o["amount"] > 1)
    produce(source, orders[:120])
    driver = run_driver(full_cluster, pipeline="orders", name="cluster_orders", topic=source, out_topic=sink,
                        delay_s=DELAY_S)

    def read_everything() -> bool:  # the last committed batch read up to the end of both partitions
        commits = driver.batches("commits")
        if not commits:
            return False
        offsets = (driver.checkpoint / "offsets" / str(commits[-1])).read_text().splitlines()
        return json.loads(offsets[-1]).get(source) == {"0": 150, "1": 150}

    try:
        driver.wait_for("first committed batch", lambda: bool(driver.batches("commits")), 240)
        produce(source, orders[120:200])
        killed = kill_while_running(full_cluster, driver)
        produce(source, orders[200:])
        driver.wait_for("a committed batch up to the end of the input", read_everything, 180)
        report = driver.stop()
    finally:
        driver.kill()

    written = sorted((r["order_id"], r["user"], r["amount"]) for r in committed_records(sink))
    assert len(written) == len(set(written)), "a record was written twice"
    assert written == expected
    assert_worker_lost(full_cluster, report, killed)


@pytest.mark.fast
def test_spark_submit_settings_come_before_headrace_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under spark-submit (its settings faked here) its master and --conf values are kept; the jars and
    the executors' Java options are joined with headrace's; master= and HEADRACE_MASTER come first."""
    from headrace.environment import session

    monkeypatch.delenv("HEADRACE_MASTER", raising=False)
    monkeypatch.setattr(session.jars, "session_settings", lambda packages: {"spark.jars": "/h/kafka.jar"})
    monkeypatch.setattr(session, "submitted_settings", lambda: {
        "spark.master": "yarn", "spark.sql.shuffle.partitions": "3", "spark.jars": "/u/mine.jar",
        "spark.executor.extraJavaOptions": "-Dmine=1"})
    settings = session.session_settings(None, [])
    assert settings["spark.master"] == "yarn"
    assert settings["spark.sql.shuffle.partitions"] == "3"
    assert settings["spark.jars"] == "/u/mine.jar,/h/kafka.jar"
    assert settings["spark.executor.extraJavaOptions"] == "-Dmine=1 -Duser.timezone=UTC"
    assert settings["spark.sql.streaming.stateStore.providerClass"].endswith("RocksDBStateStoreProvider")
    assert session.session_settings("spark://h:7077", [])["spark.master"] == "spark://h:7077"
    monkeypatch.setenv("HEADRACE_MASTER", "local[2]")
    assert session.session_settings(None, [])["spark.master"] == "local[2]"
    monkeypatch.delenv("HEADRACE_MASTER")
    monkeypatch.setattr(session, "submitted_settings", dict)  # not under spark-submit
    assert session.session_settings(None, [])["spark.master"] == "local[*,4]"
