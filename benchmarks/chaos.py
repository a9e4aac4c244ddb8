"""The chaos check: SIGKILL a stateful pipeline at random moments, restart it from its
checkpoint each time, and verify that the sink holds exactly the right windows.

    .venv/bin/python benchmarks/chaos.py --sink postgres --kills 3
    .venv/bin/python benchmarks/chaos.py --sink files --kills 20 --seed 7
    .venv/bin/python benchmarks/chaos.py --sink files --pipeline join --kills 20
    .venv/bin/python benchmarks/chaos.py --source kafka --sink postgres --kills 3
    .venv/bin/python benchmarks/chaos.py --source kafka --sink kafka --kills 20
    .venv/bin/python benchmarks/chaos.py --source kafka --sink delta --kills 20
    .venv/bin/python benchmarks/chaos.py --source redis --sink redis --kills 20
    .venv/bin/python benchmarks/chaos.py --source postgres-cdc --sink postgres --kills 20

(Kafka runs need a broker, ``bash scripts/kafka.sh start``, Spark's Kafka connector,
``bash scripts/fetch_jars.sh``, and ``confluent-kafka``; ``--servers`` names another broker.
Delta runs need Delta's jars, from the same script.)

The pipeline (a driver process of its own, started in a new session, so a kill takes the
whole process group: Python, Spark's JVM and every Python worker)::

    Generator("clicks", bounded, a fixed number of rows per micro-batch)
      or Kafka(a new topic of 2 partitions, JSON, max_records_per_batch = rows per batch)
      -> key_by(user_id) -> 10 ms tumbling event-time windows with allowed lateness
         (Spark's transformWithStateInPandas, RocksDB state) -> count
      -> PostgreSQL (foreachBatch, a transaction per batch), Files (Spark's file sink),
         Kafka (a new topic, a Kafka transaction per batch, exactly-once)
         or Delta (a new table, appended: a commit with the batch id's marker per batch)

With ``--pipeline sql`` the windows are NEXMark q5's SQL instead: clicks per user and window, joined
to each window's largest count (the stream read twice, an aggregate of an aggregate, a join of
the two), so only each window's busiest users are written.

With ``--pipeline join`` (generator source only), each click is first joined with the views of
a second generator (another seed) of the same user up to 1 ms before or after it (Spark's
stream-stream join), and the native window counts those pairs: a join chained into a window.

With ``--source redis`` or ``--source postgres-cdc`` the events and the final record go
into a new Redis stream or PostgreSQL table first (``benchmarks/chaos_systems.py``), and the
run ends the same way, once a committed batch's watermark passed the final record.

With ``--source kafka`` this command first produces the generator's events (the same
``user_id`` and ``event_time``, alternately to the two partitions) into a topic named after
the run, then one final record 60 s of event time later, whose watermark closes every
window (its own window never closes, so it is not among the expected windows). A Kafka
source never ends by itself: after the last kill the command waits until Spark has
committed a batch planned with that watermark (``<checkpoint>/offsets/`` and ``commits/``)
and then stops the driver with SIGTERM, which headrace turns into a stop between batches.

Each kill lands at a random moment after the restarted driver committed its first new
batch; about a third of them wait for the moment the sink has committed a batch that
Spark's commit log has not recorded yet (the batch is then replayed, and the sink must skip
it): PostgreSQL's ``headrace_sink_commits``, the file sink's ``_spark_metadata``, or the
Kafka sink's consumer-group offset on ``headrace_sink_commits`` (batch id + 1, committed
in the batch's transaction; read with a plain consumer, never the sink's own transactional
producer, which would fence the running driver's), or the Delta table's transaction markers
(read from its ``_delta_log`` JSON commits with plain Python, as are its rows: the
Parquet files added and not removed). After the last kill the driver runs to
the end of its input. The sink's rows (a Kafka topic read ``read_committed``) are then
compared, as a multiset, with the windows computed here from the generator's events,
without headrace.

With ``--supervised`` the pipeline is submitted to ``headrace server`` and the server's supervisor
restarts each killed driver (``benchmarks/chaos_supervised.py``); recovery is then timed from the
kill itself.

Recovery is the time from starting a driver again to the first batch it commits (a new file
in ``<checkpoint>/commits/``). Besides one line per kill and a breakdown of where a restart's
time goes, the command ends with exactly one line::

    chaos kills=N recovered=N median_recovery_s=X max_recovery_s=Y verify=ok|FAILED

and exits non-zero unless every restart recovered and the output verified.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import chaos_systems as systems  # noqa: E402

DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
WINDOW_MS = 10
LATENESS_MS = 5
OUT_OF_ORDER_MS = 2
JOIN_WITHIN_MS = 1  # --pipeline join: a view matches a click of its user up to 1 ms before or after
SINK_STEP = "out"
KAFKA_SERVERS = "127.0.0.1:9092"
FINAL_RECORD_AHEAD_MS = 60_000  # the final Kafka record's event time, after the last event
FINAL_USER = "~final"  # its user: its window never closes, so it is never written
STOP_TIMEOUT_S = 300.0  # how long a driver may take to stop after SIGTERM
RECOVERY_TIMEOUT_S = 600.0
POLL_S = 0.02


@dataclass(frozen=True)
class Setup:
    sink: str
    work: str
    name: str
    events: int
    rows_per_batch: int
    seed: int
    source: str = "generator"
    servers: str = KAFKA_SERVERS
    pipeline: str = "window"  # or "join": each click joined with a second generator's views first

    @property
    def state_dir(self) -> str:
        return os.path.join(self.work, "state")

    @property
    def checkpoint(self) -> Path:
        return Path(self.state_dir) / self.name / "checkpoint"

    @property
    def files(self) -> str:
        return os.path.join(self.work, "files")

    @property
    def table(self) -> str:
        return self.name

    @property
    def delta_table(self) -> str:
        return os.path.join(self.work, "delta")

    @property
    def source_topic(self) -> str:
        """The topic, stream or table every driver of this run reads: named after the run."""
        return f"{self.name}_in"

    @property
    def sink_topic(self) -> str:
        return f"{self.name}_out"

    def driver_args(self) -> list[str]:
        return ["--source", self.source, "--sink", self.sink, "--servers", self.servers, "--work", self.work,
                "--name", self.name, "--events", str(self.events), "--rows-per-batch", str(self.rows_per_batch),
                "--seed", str(self.seed), "--pipeline", self.pipeline]


# -- the pipeline, run by the driver process ---------------------------------------------------

def build_pipeline(setup: Setup) -> Any:
    import headrace as hr

    p = hr.Pipeline(setup.name)
    schema = "user_id string, event_time timestamp"
    if setup.source == "kafka":
        source: Any = hr.sources.Kafka(setup.source_topic, schema=schema, servers=setup.servers,
                                       max_records_per_batch=setup.rows_per_batch)
    elif setup.source == "redis":
        source = hr.sources.Redis(setup.source_topic, schema=schema, max_records_per_batch=setup.rows_per_batch)
    elif setup.source == "postgres-cdc":
        source = hr.sources.PostgresChanges(setup.source_topic, slot=setup.name, schema=schema,
                                            max_records_per_batch=setup.rows_per_batch)
    else:
        source = hr.sources.Generator("clicks", limit=setup.events, rows_per_batch=setup.rows_per_batch,
                                      seed=setup.seed)
    clicks = p.source("clicks", source, event_time="event_time", max_out_of_orderness=f"{OUT_OF_ORDER_MS}ms")
    if setup.pipeline == "join":  # a join of two streams chained into a native window
        views = (p.source("views", hr.sources.Generator("clicks", limit=setup.events,
                                                        rows_per_batch=setup.rows_per_batch, seed=setup.seed + 1))
                 .select("user_id", viewed_at=hr.col("event_time"))
                 .with_event_time("viewed_at", f"{OUT_OF_ORDER_MS}ms"))
        counts = (clicks.join(views, on="user_id", within=(f"-{JOIN_WITHIN_MS}ms", f"{JOIN_WITHIN_MS}ms"))
                  .key_by("user_id").window(hr.Tumbling(f"{WINDOW_MS}ms")).count()
                  .select("user_id", "window_start", "count"))
    elif setup.pipeline == "sql":  # NEXMark q5's SQL: windowed counts joined to their maximum, per window
        per_user = (f"SELECT user_id, count(*) AS n, window(event_time, '{WINDOW_MS} milliseconds') AS w FROM clicks "
                    f"GROUP BY user_id, window(event_time, '{WINDOW_MS} milliseconds')")
        counts = p.sql(f"""SELECT c.user_id, c.w.start AS window_start, c.n AS count
                             FROM ({per_user}) c
                             JOIN (SELECT max(m.n) AS most, m.w FROM ({per_user}) m GROUP BY m.w) top
                               ON c.w = top.w AND c.n >= top.most""", name="busiest")
    else:
        counts = (clicks.key_by("user_id")
                  .window(hr.Tumbling(f"{WINDOW_MS}ms"), allowed_lateness=f"{LATENESS_MS}ms").count()
                  .select("user_id", "window_start", "count"))
    if setup.sink == "postgres":
        counts.sink(SINK_STEP, hr.sinks.Postgres(setup.table, dsn=DSN))  # no key: a batch written twice shows
    elif setup.sink == "kafka":  # exactly-once: a transaction per batch
        counts.sink(SINK_STEP, hr.sinks.Kafka(setup.sink_topic, setup.servers, key="user_id"))
    elif setup.sink == "delta":  # no key: a batch appended twice shows
        counts.sink(SINK_STEP, hr.sinks.Delta(setup.delta_table))
    elif setup.sink == "redis":  # stream entries: a batch appended twice shows
        counts.sink(SINK_STEP, hr.sinks.Redis(stream=setup.sink_topic))
    else:
        counts.sink(SINK_STEP, hr.sinks.Files(setup.files, format="jsonl"))
    return p


def drive(setup: Setup, phases_file: str) -> int:
    """Run the pipeline to the end of its input (or, a Kafka source, until SIGTERM or SIGINT
    stops it between batches), noting when each start-up phase ends."""
    def note(phase: str, **extra: Any) -> None:
        with open(phases_file, "a") as out:
            out.write(json.dumps({"phase": phase, "t": time.time(), **extra}) + "\n")

    note("python")
    from headrace.environment.session import get_session
    from headrace.runtime.runner import PipelineRun
    from headrace.runtime.signals import stop_on_signals

    with stop_on_signals() as signals:
        pipeline = build_pipeline(setup)
        note("imports")
        get_session(packages=pipeline.plan.spark_packages())
        note("session")
        run = PipelineRun(pipeline, state_dir=setup.state_dir, progress="quiet")
        signals.attach(run)
        run.start()
        note("query")
        _note_first_batch(run, note)
        run.wait()
    return 0


def _note_first_batch(run: Any, note: Callable[..., None]) -> None:
    """Note, from a thread of its own, when Spark reports the run's first batch."""
    def first_batch() -> None:
        while run.query.isActive:
            progress = run.query.recentProgress
            if progress:
                note("first_batch", batch=progress[0]["batchId"], durations=progress[0]["durationMs"])
                return
            time.sleep(POLL_S)
    if run.query is not None:
        threading.Thread(target=first_batch, daemon=True).start()


# -- watching the checkpoint and the sink ------------------------------------------------------

def last_commit(setup: Setup) -> int:
    """The last batch id in Spark's commit log (-1 when none)."""
    try:
        names = os.listdir(setup.checkpoint / "commits")
    except FileNotFoundError:
        return -1
    return max((int(n) for n in names if n.isdigit()), default=-1)


def checkpoint_id(setup: Setup) -> str | None:
    """Spark's query id in ``<checkpoint>/metadata`` (headrace writes it before the first batch;
    read here, never created), or None."""
    try:
        with open(setup.checkpoint / "metadata") as handle:
            return str(json.loads(handle.readline())["id"])
    except (OSError, ValueError, KeyError):
        return None


def sink_identity(setup: Setup) -> str | None:
    """The identity the sink commits batch ids under (``headrace/spark/writer.py``'s ``_bound``)."""
    found = checkpoint_id(setup)
    return None if found is None else f"{SINK_STEP}/{setup.name}@{found}"


class DeltaLog:
    """The actions of a Delta table's JSON commit files, read with plain Python (the chaos check
    reads the table without headrace or Spark): ``new_actions`` yields those of the commits
    not read before, in commit order."""

    def __init__(self, table: str) -> None:
        self.folder = os.path.join(table, "_delta_log")
        self.read: set[str] = set()

    def new_actions(self) -> list[dict[str, Any]]:
        try:
            names = sorted(n for n in os.listdir(self.folder) if n.endswith(".json") and n[:1].isdigit())
        except FileNotFoundError:
            return []
        actions = []
        for name in names:
            if name in self.read:
                continue
            with open(os.path.join(self.folder, name)) as commit:  # written whole, by rename
                actions += [json.loads(line) for line in commit if line.strip()]
            self.read.add(name)
        return actions

    def live_files(self) -> list[str]:
        """The data files of the table's latest version: added and not removed since."""
        live: dict[str, None] = {}
        for action in DeltaLog(os.path.dirname(self.folder)).new_actions():
            if "add" in action:
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
        return [os.path.join(os.path.dirname(self.folder), path) for path in live]


class SinkCommits:
    """The last batch id the sink committed."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.conn: Any = None
        self.consumer: Any = None
        self.seen = -1
        self.delta_log = DeltaLog(setup.delta_table)

    def last(self) -> int:
        if self.setup.sink == "kafka":
            return self._kafka_last()
        if self.setup.sink == "delta":
            return self._delta_last()
        if self.setup.sink == "redis":
            identity = sink_identity(self.setup)
            return -1 if identity is None else systems.redis_commit(identity)
        if self.setup.sink == "files":  # Spark's file sink: one manifest file per committed batch
            try:
                names = os.listdir(os.path.join(self.setup.files, "_spark_metadata"))
            except FileNotFoundError:
                return -1
            batches = [n.removesuffix(".compact") for n in names]
            return max((int(b) for b in batches if b.isdigit()), default=-1)
        import psycopg

        if self.conn is None:
            self.conn = psycopg.connect(DSN, autocommit=True)
        try:
            row = self.conn.execute("SELECT max(batch_id) FROM headrace_sink_commits WHERE sink LIKE %s",
                                    (f"{SINK_STEP}/{self.setup.name}@%",)).fetchone()
        except psycopg.errors.UndefinedTable:
            return -1
        return -1 if row is None or row[0] is None else int(row[0])

    def _kafka_last(self) -> int:
        """The Kafka sink's consumer-group offset on the commits topic, minus one, read by a
        consumer of the sink's group that never joins it. Kafka returns only offsets whose
        transaction committed; ``read_uncommitted`` keeps librdkafka from asking for stable
        offsets, which makes the call wait (0.5 s and more) while a batch's transaction holds
        pending ones: just the moment a kill between the two commits has to see. Not
        ``Kafka.last_committed()``: that starts the sink's transactional producer, whose
        ``init_transactions`` would fence the running driver's."""
        import confluent_kafka as kafka

        from headrace.connectors.kafka_sink import COMMITS_TOPIC, transactional_id

        if self.consumer is None:
            identity = sink_identity(self.setup)
            if identity is None:
                return -1
            self.consumer = kafka.Consumer({"bootstrap.servers": self.setup.servers,
                                            "group.id": transactional_id(identity), "enable.auto.commit": False,
                                            "isolation.level": "read_uncommitted"})
        try:
            [found] = self.consumer.committed([kafka.TopicPartition(COMMITS_TOPIC, 0)], timeout=30)
        except kafka.KafkaException:  # a coordinator moving or loading: the last answer stands
            return self.seen
        if found.error is None and found.offset >= 0:
            self.seen = max(self.seen, found.offset - 1)
        return self.seen

    def _delta_last(self) -> int:
        """The highest batch id among the Delta commits' transaction markers of the sink,
        read from the table's log (new commit files only) without Spark."""
        identity = sink_identity(self.setup)
        if identity is None:
            return -1
        for action in self.delta_log.new_actions():
            txn = action.get("txn")
            if txn and txn.get("appId") == identity:
                self.seen = max(self.seen, int(txn["version"]))
        return self.seen

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        if self.consumer is not None:
            self.consumer.close()


# -- the Kafka source's input ------------------------------------------------------------------

def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise ChaosFailed("Kafka runs need the Python package confluent-kafka (pip install confluent-kafka)") from None
    return confluent_kafka


def create_topics(setup: Setup, topics: list[str]) -> None:
    """New topics of 2 partitions (their names are unique to the run)."""
    kafka = _kafka()
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": setup.servers, "log_level": 4})  # no info lines
    try:
        for future in admin.create_topics([NewTopic(t, num_partitions=2, replication_factor=1)
                                           for t in topics]).values():
            future.result(60)
    except kafka.KafkaException as exc:
        raise ChaosFailed(f"cannot create the topics {topics} at {setup.servers}: {exc.args[0]}") from None


@dataclass(frozen=True)
class KafkaInput:
    """What this command produced into the source topic: each partition's end offset and the
    final record's event time, whose watermark closes every window before it."""

    ends: dict[int, int]
    final_ms: int

    def consumed(self, setup: Setup) -> bool:
        """Whether Spark has committed a batch planned with the final record's watermark after
        reading every record: every window then closed and went to the sink. (Read from the
        checkpoint: ``offsets/<batch>`` holds the batch's watermark and end offsets.)"""
        batch = last_commit(setup)
        if batch < 0:
            return False
        try:
            lines = (setup.checkpoint / "offsets" / str(batch)).read_text().splitlines()
        except OSError:
            return False
        watermark, offsets = -1, None
        for line in lines[1:]:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and "batchWatermarkMs" in entry:
                watermark = int(entry["batchWatermarkMs"])
            elif isinstance(entry, dict) and setup.source_topic in entry:
                offsets = entry[setup.source_topic]
        return (watermark >= self.final_ms - FINAL_RECORD_AHEAD_MS // 2 and offsets is not None
                and all(int(offsets.get(str(p), -1)) >= end for p, end in self.ends.items()))


def source_records(setup: Setup) -> tuple[list[tuple[str, int]], int]:
    """The generator's events as (user, event time in µs), then the final record; and the final
    record's event time in ms."""
    from headrace.connectors.generator import generate

    events = generate("clicks", 0, setup.events, seed=setup.seed)
    micros = events.column("event_time").cast("int64").to_pylist()
    final_ms = micros[-1] // 1000 + FINAL_RECORD_AHEAD_MS
    return [*zip(events.column("user_id").to_pylist(), micros), (FINAL_USER, final_ms * 1000)], final_ms


def watermark_passed(setup: Setup, final_ms: int) -> bool:
    """Whether Spark has committed a batch planned with the final record's watermark: a source
    read in order (one Redis stream, PostgreSQL's commit order) read every event before it."""
    batch = last_commit(setup)
    try:
        lines = (setup.checkpoint / "offsets" / str(batch)).read_text().splitlines() if batch >= 0 else []
    except OSError:
        return False
    for line in lines[1:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "batchWatermarkMs" in entry:
            return int(entry["batchWatermarkMs"]) >= final_ms - FINAL_RECORD_AHEAD_MS // 2
    return False


def produce_input(setup: Setup) -> KafkaInput:
    """Produce the generator's events into a new topic, alternately to its 2 partitions (so
    Spark's ``maxOffsetsPerTrigger``, shared out by what each partition holds, reads both
    equally far in event time), then the final record, in the turn of the partition it falls to."""
    kafka = _kafka()
    create_topics(setup, [setup.source_topic])
    records, final_ms = source_records(setup)
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    producer = kafka.Producer({"bootstrap.servers": setup.servers, "enable.idempotence": True, "linger.ms": 20})
    for number, (user, at) in enumerate(records):
        value = json.dumps({"user_id": user, "event_time": systems.iso(at)})
        while True:
            try:
                producer.produce(setup.source_topic, key=user, value=value, partition=number % 2,
                                 on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.1)
    left = producer.flush(120)
    if left or failures:
        raise ChaosFailed(f"producing into {setup.source_topic}: {left} records undelivered, "
                          f"{len(failures)} failed ({failures[:1]})")
    ends = {p: (len(records) + 1 - p) // 2 for p in (0, 1)}
    consumer = kafka.Consumer({"bootstrap.servers": setup.servers, "group.id": f"{setup.name}-check"})
    found = {p: consumer.get_watermark_offsets(kafka.TopicPartition(setup.source_topic, p), timeout=30)[1]
             for p in ends}
    consumer.close()
    if found != ends:
        raise ChaosFailed(f"the topic {setup.source_topic} ends at {found}, not {ends}")
    return KafkaInput(ends, final_ms)


def read_topic(setup: Setup, topic: str, timeout: float = 300.0) -> list[dict[str, Any]]:
    """Every record of ``topic`` as Kafka's ``read_committed`` readers see it (JSON values)."""
    from headrace.testing.kafka import read_topic as read_to_end

    try:
        return [record.json() for record in read_to_end(setup.servers, topic, timeout_s=timeout)]
    except TimeoutError as exc:
        raise ChaosFailed(str(exc)) from None


# -- the chaos loop ----------------------------------------------------------------------------

@dataclass
class Driver:
    """One driver process; its whole process group dies at once when killed."""

    setup: Setup
    number: int | str
    proc: subprocess.Popen[bytes] = field(init=False)
    started: float = field(init=False)

    def __post_init__(self) -> None:
        work = Path(self.setup.work)
        self.log = work / f"driver-{self.number}.log"
        self.phases = work / f"phases-{self.number}.jsonl"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("HEADRACE_SPARK_LOG", "stderr")  # the driver's log shows Spark's own (see SPARK_START_TIMEOUT)
        command = [sys.executable, os.path.abspath(__file__), "--driver", "--phases", str(self.phases),
                   *self.setup.driver_args()]
        self.started = time.time()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        kill_group(self.proc.pid)
        self.proc.wait()

    def failure(self) -> str:
        tail = self.log.read_text(errors="replace").strip().splitlines()[-15:]
        return f"driver {self.number} exited with status {self.proc.returncode}:\n  " + "\n  ".join(tail)


def kill_group(leader: int) -> None:
    """SIGKILL ``leader``'s process group, and the processes that left it (Spark's Python worker
    daemon makes a group of its own): like a machine losing power."""
    strays = _descendants(leader)
    try:
        os.killpg(leader, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cpu_seconds(root: int) -> float:
    """CPU seconds used so far by a process and all its descendants (dead ones its children
    waited for included): unlike wall time, hardly changed by other load on the machine."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in [root, *_descendants(root)]:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(value) for value in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class ChaosFailed(Exception):
    pass


def wait_for(condition: Callable[[], bool], driver: Driver, what: str, timeout: float = RECOVERY_TIMEOUT_S) -> None:
    deadline = time.time() + timeout
    while not condition():
        if not driver.alive():
            raise ChaosFailed(f"while waiting for {what}: {driver.failure()}")
        if time.time() > deadline:
            driver.kill()
            raise ChaosFailed(f"no {what} after {timeout:.0f} s (driver {driver.number}, log {driver.log})")
        time.sleep(POLL_S)


# Spark gives a new Python worker a fixed 10 s to connect back and fails the query otherwise; on
# an overloaded machine a driver's start can fail so. That is Spark's start-up, not a recovery
# failure: such a driver is started again (the first start's time still counts).
SPARK_START_TIMEOUT = "Python worker failed to connect back"


def start_and_wait(setup: Setup, number: int, condition: Callable[[], bool], what: str,
                   say: Callable[[str], None], timeout: float = RECOVERY_TIMEOUT_S) -> tuple[Driver, float]:
    """Start driver ``number`` and wait for ``condition``; returns it and when it was first started."""
    first_start = 0.0
    for attempt in range(4):
        driver = Driver(setup, number if attempt == 0 else f"{number}-again{attempt}")
        first_start = first_start or driver.started
        try:
            wait_for(condition, driver, what, timeout)
            return driver, first_start
        except ChaosFailed:
            if driver.alive() or SPARK_START_TIMEOUT not in driver.log.read_text(errors="replace") or attempt == 3:
                raise
            say(f"driver {number}: {SPARK_START_TIMEOUT} within Spark's 10 s (load average "
                f"{os.getloadavg()[0]:.1f}); starting it again")
    raise AssertionError("unreachable")


def recover(setup: Setup, number: int, before: int, say: Callable[[str], None]) -> tuple[Driver, float, float]:
    """The restarted driver, the seconds from its start to its first newly committed batch, and
    the CPU seconds its processes used meanwhile."""
    driver, started = start_and_wait(setup, number, lambda: last_commit(setup) > before,
                                     f"new commit after batch {before}", say)
    return driver, time.time() - started, cpu_seconds(driver.proc.pid)


def never() -> bool:
    return False


def kill_somewhere(driver: Driver, rng: random.Random, sink: SinkCommits, between: bool,
                   drained: Callable[[], bool] = never) -> str:
    """Kill the driver at a random moment, or, if ``between``, right after the sink committed a
    batch that Spark's commit log does not have yet. Returns how the kill landed. ``drained``:
    whether an unbounded source's driver has nothing left to commit (it then idles)."""
    setup = driver.setup
    if between:
        baseline = sink.last()
        deadline = time.time() + RECOVERY_TIMEOUT_S
        next_check = time.time()
        while driver.alive() and time.time() < deadline:
            if time.time() >= next_check:
                if drained():
                    return "not killed: the driver had consumed all its input"
                next_check = time.time() + 0.5
            committed = sink.last()
            if committed > baseline and committed > last_commit(setup):
                driver.kill()
                spark_last = last_commit(setup)
                return (f"sink committed batch {committed}, Spark's commit log had {spark_last}"
                        + ("" if spark_last < committed else " (too late: it caught up)"))
            time.sleep(0.002)
    else:
        for _ in range(rng.randrange(3)):  # let 0 to 2 more batches commit
            done = last_commit(setup)
            wait_for(lambda done=done: last_commit(setup) > done or drained(), driver, "the next commit")
        time.sleep(rng.uniform(0.0, 0.6))
        if drained():
            return "not killed: the driver had consumed all its input"
        if driver.alive():
            committed = last_commit(setup)
            driver.kill()
            return f"at a random moment after batch {committed}"
    return "not killed: the driver had finished"


def stop_when_drained(driver: Driver, drained: Callable[[], bool], say: Callable[[str], None]) -> Driver:
    """A Kafka source never ends: wait until Spark has committed the batch that closes every
    window, then SIGTERM the driver's Python process (headrace stops the query between batches)
    and wait for it to exit. Returns the driver that was stopped."""
    setup = driver.setup
    for attempt in range(4):
        try:
            wait_for(drained, driver, "a committed batch after the final record", timeout=1800)
            break
        except ChaosFailed:
            if (driver.alive() or attempt == 3
                    or SPARK_START_TIMEOUT not in driver.log.read_text(errors="replace")):
                raise
            say(f"the last driver: {SPARK_START_TIMEOUT} within Spark's 10 s; starting it again")
            driver = Driver(setup, f"end-again{attempt + 1}")
    stopping = time.time()
    os.kill(driver.proc.pid, signal.SIGTERM)
    try:
        driver.proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        driver.kill()
        raise ChaosFailed(f"driver {driver.number} did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM "
                          f"(log {driver.log})") from None
    say(f"every record read and every window closed by batch {last_commit(setup)}; the driver stopped "
        f"{time.time() - stopping:.1f} s after SIGTERM")
    return driver


def phase_breakdown(work: str, restarts: int) -> list[str]:
    """Median seconds of each start-up phase over the restarts (drivers 1..restarts)."""
    steps = (("python", "process start to Python running"), ("imports", "imports and plan"),
             ("session", "Spark session"), ("query", "compile, sink prepare, query start"),
             ("first_batch", "first batch planned and started"))
    spans: dict[str, list[float]] = {label: [] for _, label in steps}
    spans["first batch run and committed"] = []
    spans["trigger breakdown of the first batch (ms)"] = []
    first_durations: list[dict[str, int]] = []
    for number in range(1, restarts + 1):
        path = Path(work) / f"phases-{number}.jsonl"
        started_path = Path(work) / f"started-{number}"
        if not path.exists() or not started_path.exists():
            continue
        marks = {m["phase"]: m for m in map(json.loads, path.read_text().splitlines())}
        previous = float(started_path.read_text())
        for phase, label in steps:
            if phase in marks:
                if phase == "first_batch":
                    # the progress report arrives once the batch is done; its durations split it
                    durations = marks[phase]["durations"]
                    first_durations.append(durations)
                    end = marks[phase]["t"] - durations.get("triggerExecution", 0) / 1000
                else:
                    end = marks[phase]["t"]
                spans[label].append(end - previous)
                previous = end
        if "first_batch" in marks:
            spans["first batch run and committed"].append(marks["first_batch"]["durations"]
                                                         .get("triggerExecution", 0) / 1000)
    lines = [f"  {label:<40} {statistics.median(values):6.2f} s" for label, values in spans.items() if values]
    if first_durations:
        keys = sorted({k for d in first_durations for k in d}, key=lambda k: -statistics.median(
            [d.get(k, 0) for d in first_durations]))
        lines.append("  first batch, Spark's durationMs (median): " + ", ".join(
            f"{k} {statistics.median([d.get(k, 0) for d in first_durations]):.0f}" for k in keys))
    return lines


# -- verification ------------------------------------------------------------------------------

def expected_windows(setup: Setup) -> Counter:
    """(user, window start in ms, count) of every window, from the generator's events."""
    from headrace.connectors.generator import generate

    def events_of(seed: int) -> list[tuple[str, int]]:  # (user, event time in µs)
        events = generate("clicks", 0, setup.events, seed=seed)
        return list(zip(events.column("user_id").to_pylist(), events.column("event_time").cast("int64").to_pylist()))

    clicks = events_of(setup.seed)
    if setup.pipeline == "join":  # a pair per view within JOIN_WITHIN_MS of a click of its user, at the click's time
        views: dict[str, list[int]] = {}
        for user, micros in events_of(setup.seed + 1):
            views.setdefault(user, []).append(micros)
        within = JOIN_WITHIN_MS * 1000
        clicks = [(user, micros) for user, micros in clicks
                  for seen in views.get(user, []) if -within <= seen - micros <= within]
    counts = Counter((user, micros // 1000 - micros // 1000 % WINDOW_MS) for user, micros in clicks)
    if setup.pipeline == "sql":  # the users with the most clicks of each window
        most: dict[int, int] = {}
        for (_, start), n in counts.items():
            most[start] = max(most.get(start, 0), n)
        counts = Counter({(user, start): n for (user, start), n in counts.items() if n == most[start]})
    return Counter((user, start, n) for (user, start), n in counts.items())


def _epoch_ms(value: str) -> int:
    return int(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)


def written_windows(setup: Setup) -> Counter:
    if setup.sink == "files":
        from headrace.connectors.files_sink import read_rows

        return Counter((r["user_id"], _epoch_ms(r["window_start"]), r["count"])
                       for r in read_rows(setup.files, "jsonl"))
    if setup.sink == "kafka":
        return Counter((r["user_id"], _epoch_ms(r["window_start"]), r["count"])
                       for r in read_topic(setup, setup.sink_topic))
    if setup.sink == "redis":
        return systems.stream_windows(setup.sink_topic)
    if setup.sink == "delta":
        import pyarrow.parquet as pq

        written: Counter = Counter()
        for path in DeltaLog(setup.delta_table).live_files():
            rows = pq.read_table(path, columns=["user_id", "window_start", "count"]).to_pylist()
            written.update((r["user_id"], int(r["window_start"].timestamp() * 1000), r["count"]) for r in rows)
        return written
    import psycopg

    with psycopg.connect(DSN) as conn:
        rows = conn.execute(f'SELECT user_id, window_start, count FROM "{setup.table}"').fetchall()
    return Counter((user, int(start.timestamp() * 1000), n) for user, start, n in rows)


def verify(setup: Setup, say: Callable[[str], None]) -> bool:
    try:
        expected, written = expected_windows(setup), written_windows(setup)
    except ChaosFailed as exc:
        say(f"verify: FAILED: {exc}")
        return False
    missing, extra = expected - written, written - expected
    say(f"verify: {sum(expected.values()):,} windows expected, {sum(written.values()):,} written, "
        f"{sum(missing.values())} missing, {sum(extra.values())} extra or duplicated")
    for label, rows in (("missing", missing), ("extra", extra)):
        for row in sorted(rows)[:5]:
            say(f"  {label}: {row}")
    return not missing and not extra


def cleanup(setup: Setup) -> None:
    """Drop what the run made outside its working directory: its table and commit records, its
    topics and the Kafka sink's consumer group (all named after the run)."""
    topics = ([setup.source_topic] if setup.source == "kafka" else []) + \
        ([setup.sink_topic] if setup.sink == "kafka" else [])
    if topics:
        kafka = _kafka()
        from confluent_kafka.admin import AdminClient

        from headrace.connectors.kafka_sink import transactional_id

        admin = AdminClient({"bootstrap.servers": setup.servers, "log_level": 4})  # no info lines
        futures = list(admin.delete_topics(topics, operation_timeout=30).values())
        identity = sink_identity(setup)
        if setup.sink == "kafka" and identity is not None:
            futures += admin.delete_consumer_groups([transactional_id(identity)], request_timeout=30).values()
        for future in futures:
            try:
                future.result(60)
            except kafka.KafkaException as exc:
                if exc.args[0].code() not in (kafka.KafkaError.UNKNOWN_TOPIC_OR_PART,
                                              kafka.KafkaError.GROUP_ID_NOT_FOUND):
                    raise
    if setup.source == "redis" or setup.sink == "redis":
        from headrace.connectors.redis_sink import COMMITS_PREFIX

        identity = sink_identity(setup)
        systems.drop_redis([setup.source_topic, setup.sink_topic] + ([COMMITS_PREFIX + identity] if identity else []))
    if setup.source == "postgres-cdc":
        systems.drop_cdc(setup.source_topic, setup.name)
    if setup.sink == "postgres":
        import psycopg

        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(f'DROP TABLE IF EXISTS "{setup.table}"')
            conn.execute("DELETE FROM headrace_sink_commits WHERE sink LIKE %s", (f"{SINK_STEP}/{setup.name}@%",))


# -- the command -------------------------------------------------------------------------------

def chaos(setup: Setup, kills: int, seed: int, say: Callable[[str], None]) -> tuple[int, list[float], bool]:
    rng = random.Random(seed)
    between = set(rng.sample(range(kills), k=max(1, kills // 3))) if kills else set()
    sink = SinkCommits(setup)
    recoveries: list[float] = []
    cpus: list[float] = []
    killed = 0
    driver: Driver | None = None
    kafka_input: KafkaInput | None = None
    try:
        if setup.sink == "kafka":
            create_topics(setup, [setup.sink_topic])
        drained: Callable[[], bool] = never
        if setup.source == "kafka":
            kafka_input = produce_input(setup)
            say(f"produced {setup.events:,} events and a final record into {setup.source_topic} "
                f"(partition end offsets {kafka_input.ends})")
            drained = functools.partial(kafka_input.consumed, setup)
        elif setup.source in ("redis", "postgres-cdc"):
            records, final_ms = source_records(setup)
            if setup.source == "redis":
                systems.fill_stream(setup.source_topic, records)
            else:
                systems.fill_table(setup.source_topic, setup.name, records)
            say(f"wrote {setup.events:,} events and a final record into {setup.source} {setup.source_topic}")
            drained = functools.partial(watermark_passed, setup, final_ms)
        driver, started = start_and_wait(setup, 0, lambda: last_commit(setup) >= 0, "the first commit", say)
        say(f"driver 0 committed its first batch after {time.time() - started:.1f} s")
        for number in range(1, kills + 1):
            landed = kill_somewhere(driver, rng, sink, (number - 1) in between, drained)
            if driver.alive() or driver.proc.returncode not in (-signal.SIGKILL, 0):
                raise ChaosFailed(driver.failure())
            if landed.startswith("not killed"):
                say(f"kill {number}: {landed}; stopping the kills")
                break
            killed += 1
            before = last_commit(setup)
            (Path(setup.work) / f"started-{number}").write_text(str(time.time()))
            driver, recovery, cpu = recover(setup, number, before, say)
            recoveries.append(recovery)
            cpus.append(cpu)
            say(f"kill {number}: {landed}; restarted, first new commit (batch {last_commit(setup)}) "
                f"after {recovery:.1f} s ({cpu:.1f} CPU-s, load average {os.getloadavg()[0]:.1f})")
        if setup.source != "generator":  # an unbounded source: stop the last driver once all is written
            driver = stop_when_drained(driver, drained, say)
        else:
            for attempt in range(4):  # the last driver runs to the end of the input
                wait_for(lambda last=driver: not last.alive(), driver, "the end of the input", timeout=1800)
                if (driver.proc.returncode == 0 or attempt == 3
                        or SPARK_START_TIMEOUT not in driver.log.read_text(errors="replace")):
                    break
                say(f"the last driver: {SPARK_START_TIMEOUT} within Spark's 10 s; starting it again")
                driver = Driver(setup, f"end-again{attempt + 1}")
    except ChaosFailed as exc:
        say(f"FAILED: {exc}")
        return killed, recoveries, False
    finally:
        sink.close()
        if driver is not None and driver.alive():  # never leave a driver behind
            driver.kill()
    if driver.proc.returncode != 0:
        say(f"FAILED: {driver.failure()}")
        return killed, recoveries, False
    if cpus:
        say(f"recovery CPU: median {statistics.median(cpus):.1f} CPU-s, max {max(cpus):.1f} CPU-s "
            f"(driver, Spark's JVM and Python workers, from start to first new commit)")
    say("where a restart's time goes (median over the restarts):")
    for line in phase_breakdown(setup.work, killed):
        say(line)
    return killed, recoveries, verify(setup, say)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", choices=["generator", "kafka", "redis", "postgres-cdc"], default="generator",
                        help="the deterministic generator (default), or a new Kafka topic this command fills")
    parser.add_argument("--sink", choices=["postgres", "files", "kafka", "delta", "redis"], default="postgres")
    parser.add_argument("--pipeline", choices=["window", "join", "sql"], default="window",
                        help="window: counts per user and 10 ms window; join: the same counts of each click joined "
                             "with a second generator's views of its user within 1 ms (a join chained into a window); "
                             "sql: each window's busiest users, NEXMark q5's SQL")
    parser.add_argument("--servers", default=KAFKA_SERVERS, help=f"Kafka's bootstrap servers (default {KAFKA_SERVERS})")
    parser.add_argument("--kills", type=int, default=3, help="how many times to SIGKILL the driver (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the kill moments and the generator")
    parser.add_argument("--events", type=int, help="events to generate (default: enough for the kills)")
    parser.add_argument("--rows-per-batch", type=int, default=1_000, help="events per micro-batch (default 1,000)")
    parser.add_argument("--work", help="working directory (default: a new temporary one, removed at the end)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory and the table")
    parser.add_argument("--supervised", action="store_true",
                        help="submit the pipeline to headrace server, whose supervisor restarts each killed driver "
                             "(benchmarks/chaos_supervised.py; generator source only)")
    parser.add_argument("--standby", action=argparse.BooleanOptionalAction, default=True,
                        help="with --supervised: the server keeps a warm standby driver, as it does by default "
                             "(--no-standby: headrace server --no-standby, each restart a new driver)")
    parser.add_argument("--pause", type=float, default=0.0, metavar="S",
                        help="with --supervised: let the pipeline run S seconds after each recovery before the next "
                             "kill (default 0: kills as soon as it runs again; give --events enough for the run)")
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--phases", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.kills < 0 or args.rows_per_batch < 1:
        parser.error("--kills must be >= 0 and --rows-per-batch >= 1")
    if args.pause < 0 or args.pause and not args.supervised:
        parser.error("--pause takes seconds >= 0, with --supervised")
    if args.supervised and args.source != "generator":
        parser.error("--supervised runs the generator source only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.driver:
        setup = Setup(args.sink, args.work, args.name, args.events, args.rows_per_batch, args.seed, args.source,
                      args.servers, args.pipeline)
        return drive(setup, args.phases)

    def say(line: str) -> None:
        print(line, flush=True)

    work = args.work or tempfile.mkdtemp(prefix="headrace-chaos-")
    os.makedirs(work, exist_ok=True)
    events = args.events or args.rows_per_batch * max(40, 4 * args.kills + 12)
    if args.supervised:
        from benchmarks.chaos_supervised import SupervisedSetup, supervised_chaos

        setup: Setup = SupervisedSetup(args.sink, work, f"chaos_{uuid.uuid4().hex[:8]}", events, args.rows_per_batch,
                                       args.seed, args.source, args.servers, args.pipeline, args.standby)
    else:
        setup = Setup(args.sink, work, f"chaos_{uuid.uuid4().hex[:8]}", events, args.rows_per_batch, args.seed,
                      args.source, args.servers, args.pipeline)
    origin = {"generator": "", "kafka": f" from Kafka ({setup.servers})", "redis": " from a Redis stream",
              "postgres-cdc": " from PostgreSQL's changes"}[args.source]
    say(f"chaos: {events:,} events{origin} in batches of {args.rows_per_batch:,} into {args.sink}, "
        f"{args.kills} kills, seed {args.seed}, work {work}")
    try:
        if args.supervised:
            killed, recoveries, ok = supervised_chaos(setup, args.kills, args.seed, say,  # type: ignore[arg-type]
                                                      args.pause)
        else:
            killed, recoveries, ok = chaos(setup, args.kills, args.seed, say)
    finally:
        if not args.keep:
            try:
                cleanup(setup)
            except Exception as exc:  # noqa: BLE001 - a failed clean-up must not hide the result
                say(f"clean-up failed: {exc}")
            if not args.work:
                shutil.rmtree(work, ignore_errors=True)
    median = statistics.median(recoveries) if recoveries else 0.0
    worst = max(recoveries, default=0.0)
    ok = ok and killed == args.kills and len(recoveries) == killed
    print(f"chaos kills={killed} recovered={len(recoveries)} median_recovery_s={median:.1f} "
          f"max_recovery_s={worst:.1f} verify={'ok' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
