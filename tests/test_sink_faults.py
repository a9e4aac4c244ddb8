"""Sink faults against the real PostgreSQL server and real directories: connections terminated
by the server, a server that refuses connections for a while (a TCP proxy in front of it that
the test closes and opens), a commit whose answer never comes back, and tables or directories
that lose what a sink committed. The output is compared with an answer computed in plain Python."""

from __future__ import annotations

import json
import logging
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import PG_DSN
from fault_proxy import FaultProxy, free_port

import headrace as hr
from headrace.connectors import kafka_sink
from headrace.connectors.base import redact_dsn
from headrace.connectors.files_sink import FileSink, read_rows
from headrace.connectors.postgres import COMMIT_TABLE, Postgres, transient
from headrace.connectors.retry import Backoff
from headrace.errors import PlanError, SinkError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, run_to_completion
from headrace.testing.kafka import read_topic

WORDS = ("spark", "river", "mill", "race", "flow")
BATCHES = [[{"id": b * 500 + i, "word": WORDS[(b * 500 + i) % len(WORDS)]} for i in range(500)] for b in range(6)]
ALL_BATCH_IDS = list(range(len(BATCHES) + 1))  # and the last, empty one: the end of the input
SINK_AT = "test_sink_faults.py:" + str(next(
    number for number, line in enumerate(Path(__file__).read_text().splitlines(), 1) if line.endswith("# the sinks")))


def numbers(name: str, **sinks: object) -> hr.Pipeline:
    """Numbered words, every third number left out, ``twice`` added; one sink step per keyword."""
    p = hr.Pipeline(name)
    stream = (p.source("numbers", TestSource(BATCHES, schema={"id": "long", "word": "string"}))
              .filter(hr.col("id") % 3 != 0).with_columns(twice=hr.col("id") * 2))
    for step, connector in sinks.items():
        stream.sink(step, connector)  # the sinks
    return p


def expected(batch_ids=None) -> list[tuple[int, str, int]]:
    """What the pipeline writes for these batches (all by default), computed without headrace."""
    chosen = range(len(BATCHES)) if batch_ids is None else batch_ids
    return [(r["id"], r["word"], r["id"] * 2) for b in chosen for r in BATCHES[b] if r["id"] % 3 != 0]


class Steps:
    """``on_step`` for run_to_completion: calls ``actions[n]`` after the n-th micro-batch settled."""

    def __init__(self, **actions) -> None:
        self.actions = {int(k.removeprefix("after_")): v for k, v in actions.items()}
        self.done = 0

    def __call__(self, _run) -> None:
        self.done += 1
        action = self.actions.get(self.done)
        if action:
            action()


# -- PostgreSQL fixtures ----------------------------------------------------------------------


@pytest.fixture
def name(pg):
    """A fresh pipeline name, also the sink's table; the table, its copies and records go afterwards."""
    name = f"faults_{uuid.uuid4().hex[:10]}"
    yield name
    for table in (name, f"{name}_saved", f"{name}_away"):
        pg.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    pg.execute(f"DROP FUNCTION IF EXISTS {name}_kill()")
    pg.execute(f"DROP SEQUENCE IF EXISTS {name}_loads")
    pg.execute(f"DELETE FROM {COMMIT_TABLE} WHERE sink LIKE %s", (f"%/{name}@%",))


def table_rows(pg, table: str) -> list[tuple[int, str, int]]:
    return pg.execute(f"SELECT id, word, twice FROM {table} ORDER BY id").fetchall()


def commits(pg, pipeline: str) -> list[int]:
    return [row[0] for row in pg.execute(f"SELECT batch_id FROM {COMMIT_TABLE} WHERE sink LIKE %s ORDER BY batch_id",
                                         (f"totals/{pipeline}@%",))]


def committed_summary(pg, pipeline: str) -> str:
    """How the sink's messages describe what it committed so far, from its commit records."""
    ids = commits(pg, pipeline)
    rows = len(expected(ids))
    return f"batches {ids[0]}-{ids[-1]} ({len(ids)} batches, {rows:,} rows)"


# -- a TCP proxy in front of the real server ---------------------------------------------------

COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"  # a simple-protocol query message: COMMIT


class PgProxy(FaultProxy):
    """A FaultProxy in front of the PostgreSQL server; ``dsn`` connects through it."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        params = psycopg.conninfo.conninfo_to_dict(dsn)
        super().__init__(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432)))
        self.dsn = psycopg.conninfo.make_conninfo(dsn, host="127.0.0.1", port=str(self.port), sslmode="disable")


@pytest.fixture
def proxy(pg):
    running = PgProxy(PG_DSN).start()
    yield running
    running.stop()


# -- transient faults are retried --------------------------------------------------------------

def test_connections_terminated_by_the_server_are_retried_exactly_once(spark, pg, name, tmp_path):
    """The server ends the sink's connection between batches (pg_terminate_backend from the test)
    and in the middle of two batches' transactions (pg_terminate_backend of its own backend, from
    a trigger on the table): the pipeline goes on and the table holds every row once."""
    application = f"hr_{name}"
    pg.execute(f"CREATE TABLE {name} (id bigint, word text, twice bigint)")
    pg.execute(f"CREATE SEQUENCE {name}_loads")
    pg.execute(f"""CREATE FUNCTION {name}_kill() RETURNS trigger LANGUAGE plpgsql AS $$
                   BEGIN
                     IF nextval('{name}_loads') IN (2, 4) THEN PERFORM pg_terminate_backend(pg_backend_pid()); END IF;
                     RETURN NULL;
                   END $$""")
    pg.execute(f"CREATE TRIGGER {name}_kill BEFORE INSERT ON {name} FOR EACH STATEMENT EXECUTE FUNCTION {name}_kill()")
    terminated = []

    def terminate() -> None:
        terminated.extend(row[0] for row in pg.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s", (application,)))

    sink = hr.sinks.Postgres(name, dsn=f"{PG_DSN}?application_name={application}")
    run_to_completion(numbers(name, totals=sink), state_dir=str(tmp_path / "state"),
                      on_step=Steps(after_1=terminate, after_3=terminate, after_5=terminate))

    assert table_rows(pg, name) == expected()
    assert commits(pg, name) == ALL_BATCH_IDS
    assert terminated.count(True) >= 3  # the sink's idle connection, each time
    assert pg.execute(f"SELECT last_value FROM {name}_loads").fetchone()[0] == len(BATCHES) + 2  # 2 loads again


def test_a_lost_commit_answer_and_a_3_s_outage_are_ridden_out(spark, pg, name, proxy, tmp_path):
    """Through a proxy: the answer to one batch's COMMIT never arrives (the retry finds the batch
    committed and writes nothing), then the server is unreachable for 3 s (the sink waits)."""
    def lose_an_answer() -> None:
        proxy.lose_answers_to(COMMIT, 1)

    moments = {}

    def outage() -> None:
        proxy.stop()
        moments["down"] = time.monotonic()
        threading.Timer(3.0, proxy.start).start()

    run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=proxy.dsn)), state_dir=str(tmp_path / "s"),
                      on_step=Steps(after_1=lose_an_answer, after_3=outage,
                                    after_4=lambda: moments.setdefault("next batch", time.monotonic())))

    assert proxy.lost_answers == 1
    assert proxy.accepted >= 3  # the first connection, one after the lost answer, one after the outage
    assert moments["next batch"] - moments["down"] >= 3.0  # the batch after the outage waited for the server
    assert table_rows(pg, name) == expected()
    assert commits(pg, name) == ALL_BATCH_IDS


def test_an_outage_longer_than_the_retries_restarts_the_query_with_exact_output(spark, pg, name, proxy, tmp_path):
    """The server is out of reach for 4 s, longer than the sink's retries (3 attempts over 0.6 s):
    the restart strategy restarts the query (a restart whose start still finds the server down
    counts as one more) until the server is back, and the table holds every row once."""
    sink = hr.sinks.Postgres(name, dsn=proxy.dsn, retries=2, retry_backoff=0.2)
    run = PipelineRun(numbers(name, totals=sink), state_dir=str(tmp_path / "s"), progress="quiet",
                      restart_attempts=6, restart_backoff="500ms").start()
    result = run.wait(until_exhausted=True, on_settled=Steps(after_2=lambda: proxy.outage(4.0)))
    assert result.restarts >= 1
    assert table_rows(pg, name) == expected()
    assert commits(pg, name) == ALL_BATCH_IDS


def test_an_outage_past_the_restart_policy_stops_the_pipeline_saying_what_to_do(spark, pg, name, proxy, tmp_path):
    sink = hr.sinks.Postgres(name, dsn=proxy.dsn, retries=2, retry_backoff=0.2)
    run = PipelineRun(numbers(name, totals=sink), state_dir=str(tmp_path / "s"), progress="quiet",
                      restart_attempts=1, restart_backoff="100ms").start()
    with pytest.raises(SinkError) as caught:
        run.wait(until_exhausted=True, on_settled=Steps(after_2=proxy.stop))
    message = str(caught.value)
    assert re.fullmatch(
        rf"sink 'totals' \({SINK_AT}\): PostgreSQL unreachable after 3 attempts over \d+\.\d s: connection failed: "
        rf".*Connection refused.*; gave up trying to (?:check whether batch 2 is committed|check table .*) at "
        rf"{re.escape(redact_dsn(proxy.dsn))}; the run restarts the query from its checkpoint under its restart "
        r"strategy \(exactly once\); if the server stays down longer, restart the pipeline once it is back, or let "
        r"the sink wait longer with retries= and retry_backoff= \(not restarted again: the restart policy allows "
        r"1 restart within 10m\)", message), message
    assert "/" + name + "@" not in message  # the step, not the internal identity
    assert commits(pg, name) == [0, 1]
    assert table_rows(pg, name) == expected([0, 1])


@pytest.mark.fast
def test_only_transient_errors_are_retried():
    import psycopg

    for error in (psycopg.errors.AdminShutdown("terminating connection due to administrator command"),
                  psycopg.errors.SerializationFailure("could not serialize access"),
                  psycopg.errors.CannotConnectNow("the database system is starting up"),
                  psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"),
                  psycopg.OperationalError("connection failed: Connection refused"),
                  psycopg.OperationalError("consuming input failed: server closed the connection unexpectedly")):
        assert transient(error), error
    for error in (psycopg.errors.UniqueViolation("duplicate key"), psycopg.errors.UndefinedTable("no table"),
                  psycopg.errors.InvalidTextRepresentation("invalid input syntax for type integer"),
                  psycopg.errors.QueryCanceled("canceling statement due to statement timeout"),
                  psycopg.OperationalError('connection failed: FATAL:  database "nope" does not exist'),
                  ValueError("not a database error")):
        assert not transient(error), error


def test_constraint_and_type_errors_fail_at_once(spark, pg, name):
    pg.execute(f"CREATE TABLE {name} (id bigint CHECK (id > 0), word text, twice bigint)")
    sink = Postgres(name, dsn=PG_DSN, retries=5, retry_backoff=8).bind("checked")
    assert not sink.is_committed(0)
    backend = sink._conn.info.backend_pid  # a retry would start on a new connection
    frame = spark.createDataFrame([(-1, "a", -2)], "id long, word string, twice long")
    with pytest.raises(SinkError, match=rf"^sink 'checked': cannot write batch 0: new row for relation \"{name}\" "
                                        r"violates check constraint"):
        sink.write_batch(frame, 0)
    pg.execute(f"ALTER TABLE {name} ALTER COLUMN word TYPE integer USING 0")
    with pytest.raises(SinkError, match=r"^sink 'checked': cannot write batch 0: invalid input syntax for type "
                                        r"integer: \"a\""):
        sink.write_batch(spark.createDataFrame([(1, "a", 2)], "id long, word string, twice long"), 0)
    assert sink._conn.info.backend_pid == backend  # tried once each, on the same connection
    sink.close()


def test_a_wrong_database_fails_at_once(monkeypatch):
    import psycopg

    connect, attempts = psycopg.connect, []
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: attempts.append(a) or connect(*a, **k))
    sink = Postgres("t", dsn="postgresql://postgres@127.0.0.1:5432/no_such_db_here", retry_backoff=8).bind("to_db")
    with pytest.raises(SinkError, match=r"^sink 'to_db': cannot connect to PostgreSQL at "
                                        r"postgresql://postgres@127.0.0.1:5432/no_such_db_here: .*\"no_such_db_here\" "
                                        r"does not exist; check the DSN"):
        sink.prepare("/nonexistent/run")
    assert len(attempts) == 1  # not retried: no backoff waited


@pytest.mark.fast
def test_retry_settings_are_checked():
    with pytest.raises(PlanError, match=r"Postgres sink for table 't': retries must be a whole number"):
        Postgres("t", retries=-1)
    with pytest.raises(PlanError, match=r"retry_backoff must be the first wait in seconds"):
        Postgres("t", retry_backoff=0)
    with pytest.raises(PlanError, match=r"rewrite=True creates the table again .* needs create_table=True"):
        Postgres("t", create_table=False, rewrite=True)


# -- rows committed before are never lost without a word ------------------------------------------

def test_a_dropped_table_stops_the_sink_and_rewrite_accepts_the_loss(spark, pg, name, tmp_path):
    state, found = str(tmp_path / "state"), {}

    def drop() -> None:
        found["summary"] = committed_summary(pg, name)
        pg.execute(f"DROP TABLE {name}")

    assert pg.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None
    with pytest.raises(SinkError) as caught:
        run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=PG_DSN)), state_dir=state,
                          on_step=Steps(after_3=drop))
    message = str(caught.value)
    assert message.startswith(
        f"sink 'totals' ({SINK_AT}): table '{name}' is missing, but this sink committed {found['summary']} into it "
        f"(commit records of 'totals/{name}@"), message
    assert ("it was dropped or renamed, and writing on would lose those rows without a word. To go on: restore "
            "the table (or rename it back) and restart the pipeline; or restart it with --fresh (fresh=True) to "
            "start over from the beginning of its input; or pass rewrite=True to this sink to create the table "
            "again and accept that those batches are gone") in message
    assert found["summary"] == "batches 0-2 (3 batches, 1,000 rows)"

    with pytest.raises(SinkError) as again:  # a restart stops before Spark runs a batch
        run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=PG_DSN)), state_dir=state)
    assert str(again.value) == message
    assert pg.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None  # not created again

    with pytest.warns(UserWarning, match=rf"^sink 'totals' \({SINK_AT}\): table '{name}' was missing; rewrite=True: "
                                         r"writing on into a new table, and batches 0-2 \(3 batches, 1,000 rows\) "
                                         r"committed before are gone$"):
        run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=PG_DSN, rewrite=True)), state_dir=state)
    assert table_rows(pg, name) == expected(range(3, len(BATCHES)))
    assert commits(pg, name) == ALL_BATCH_IDS[3:]


def test_a_table_renamed_away_stops_the_sink_and_renamed_back_goes_on(spark, pg, name, tmp_path):
    state = str(tmp_path / "state")
    with pytest.raises(SinkError) as caught:
        run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=PG_DSN)), state_dir=state,
                          on_step=Steps(after_2=lambda: pg.execute(f"ALTER TABLE {name} RENAME TO {name}_away")))
    assert str(caught.value).startswith(
        f"sink 'totals' ({SINK_AT}): table '{name}' is missing, but this sink committed batches 0-1 (2 batches, "
        f"666 rows) into it"), str(caught.value)
    assert pg.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None  # no second table was started

    pg.execute(f"ALTER TABLE {name}_away RENAME TO {name}")
    run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=PG_DSN)), state_dir=state)
    assert table_rows(pg, name) == expected()
    assert commits(pg, name) == ALL_BATCH_IDS


def test_an_emptied_table_stops_the_sink(spark, pg, name, tmp_path):
    with pytest.raises(SinkError) as caught:
        run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=PG_DSN)), state_dir=str(tmp_path / "s"),
                          on_step=Steps(after_2=lambda: pg.execute(f"TRUNCATE {name}")))
    message = str(caught.value)
    assert message.startswith(
        f"sink 'totals' ({SINK_AT}): table '{name}' is empty, but this sink committed batches 0-1 (2 batches, "
        "666 rows) into it"), message
    assert ("it was emptied (TRUNCATE, DELETE) or dropped and created again, and writing on would lose those "
            "rows without a word. To go on: restore its rows and restart the pipeline; or restart it with --fresh"
            ) in message


def test_a_fresh_pipeline_creates_its_table(spark, pg, name, tmp_path):
    """create_table=True (the default) still creates the table of a sink that committed nothing."""
    pg.execute(f"CREATE TABLE {name}_saved (id bigint)")  # another pipeline's records must not matter
    assert pg.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None
    run_to_completion(numbers(name, totals=hr.sinks.Postgres(name, dsn=PG_DSN)), state_dir=str(tmp_path / "s"))
    assert table_rows(pg, name) == expected()


# -- the Files sink ---------------------------------------------------------------------------

def empty(folder: Path) -> None:
    for entry in folder.iterdir():
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def file_rows(path: Path) -> list[tuple[int, str, int]]:
    return sorted((r["id"], r["word"], r["twice"]) for r in read_rows(str(path), "jsonl"))


def test_files_emptied_after_a_run_stops_the_next_start(spark, tmp_path):
    """Spark's own file writer (the only sink): the directory emptied between two runs."""
    out, state, pipeline = tmp_path / "out", str(tmp_path / "state"), f"files_{uuid.uuid4().hex[:8]}"
    run_to_completion(numbers(pipeline, out=hr.sinks.Files(str(out), format="jsonl")), state_dir=state)
    assert file_rows(out) == expected()
    empty(out)
    with pytest.raises(SinkError) as caught:  # a restart on the finished run's checkpoint
        PipelineRun(numbers(pipeline, out=hr.sinks.Files(str(out), format="jsonl")), state_dir=state,
                    progress="quiet").start().wait(until_exhausted=True)
    record = Path(state) / pipeline / "run" / "sinks" / "out.json"
    assert str(caught.value) == (
        f"sink 'out' ({SINK_AT}): the directory '{out}' was emptied after this sink began writing into it (run "
        f"record {record}); writing on would leave those batches gone without a word. To go on: restore the "
        "directory and restart the pipeline; or restart it with --fresh (fresh=True) to start over from the "
        "beginning of its input, into an empty directory; or pass rewrite=True to this sink to write on and "
        "accept that those batches are gone")


def test_files_emptied_while_running_stops_the_sink(spark, tmp_path):
    """One directory per batch (two sinks): the directory emptied between two batches."""
    out, state, pipeline = tmp_path / "out", str(tmp_path / "state"), f"files_{uuid.uuid4().hex[:8]}"
    with pytest.raises(SinkError) as caught:
        run_to_completion(numbers(pipeline, out=hr.sinks.Files(str(out), format="jsonl"), also=hr.sinks.Null()),
                          state_dir=state, on_step=Steps(after_2=lambda: empty(out)))
    assert str(caught.value).startswith(
        f"sink 'out' ({SINK_AT}): the directory '{out}' was emptied after this sink committed batches 0-1 into it "
        f"(run record {Path(state) / pipeline / 'run' / 'sinks' / 'out.json'}); writing on would leave those "
        "batches gone without a word."), str(caught.value)


def test_files_lost_batches_stop_the_start_and_rewrite_accepts_the_loss(spark, tmp_path):
    """The sink used on its own, as the writer drives it: bound, prepared, batch by batch."""
    out, run_dir = tmp_path / "out", str(tmp_path / "p" / "run")

    def sink(rewrite: bool = False) -> FileSink:
        bound = FileSink(str(out), format="jsonl", rewrite=rewrite).bind("out/p@0001")
        bound.prepare(run_dir)
        return bound

    def frame(batch: int):
        return spark.createDataFrame(expected([batch]), "id long, word string, twice long")

    first = sink()
    for batch in range(3):
        first.write_batch(frame(batch), batch)
    shutil.rmtree(out / "batch-000000000001")
    with pytest.raises(SinkError, match=rf"^sink 'out': the directory '{re.escape(str(out))}' lost the directories "
                                        r"of batch 1 after this sink committed batches 0-2 into it \(run record "):
        sink()
    shutil.rmtree(out)
    with pytest.raises(SinkError, match=r"^sink 'out': the directory .* was removed after this sink committed "
                                        r"batches 0-2 into it"):
        sink()
    with pytest.warns(UserWarning, match=r"^sink 'out': the directory .* was removed after this sink committed "
                                         r"batches 0-2 into it; rewrite=True: writing on, and those batches are gone$"):
        again = sink(rewrite=True)
    again.write_batch(frame(3), 3)
    assert file_rows(out) == expected([3])
    sink().write_batch(frame(4), 4)  # from now on, the record starts at batch 3
    assert file_rows(out) == expected([3, 4])


# -- Kafka: a private broker that goes down and comes back -------------------------------------

ROOT = Path(__file__).resolve().parent.parent


class PrivateKafka:
    """A single-node Kafka of this test's own (scripts/kafka.sh with its own folder and ports), so
    an outage disturbs no other test: ``stop()`` shuts it down (connections are refused), and
    ``start()`` brings it back with its data."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = next(port for port in iter(free_port, None) if _free(port + 100))
        self.servers = f"127.0.0.1:{self.port}"

    def _script(self, command: str, *options: str) -> None:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), command, "--dir", str(self.folder),
                               *options], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]

    def start(self) -> None:
        self._script("start", "--port", str(self.port))

    def stop(self) -> None:
        self._script("stop")


def _free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def private_kafka(tmp_path_factory):
    from conftest import service_or_skip

    pytest.importorskip("confluent_kafka")
    kafka = PrivateKafka(tmp_path_factory.mktemp("kafka"))
    try:
        kafka.start()
    except AssertionError as exc:
        service_or_skip("a private Kafka broker (scripts/kafka.sh)", False, str(exc))
    yield kafka
    kafka.stop()


def test_a_kafka_outage_past_the_sinks_retries_is_restarted_with_exact_output(spark, private_kafka, tmp_path, caplog,
                                                                             monkeypatch):
    """The broker goes down after batch 2 and comes back some seconds later; the Kafka sink's retries
    (2 attempts, each call bounded by a timeout shortened here to 3 and 5 s) run out first: its error
    says the broker is unreachable, the restart strategy restarts the query until the broker is
    back, the run ends with every record once for read_committed readers, and librdkafka's
    connection errors are summarised, not streamed."""
    monkeypatch.setattr(kafka_sink, "CONNECT_TIMEOUT_S", 3.0)
    monkeypatch.setattr(kafka_sink, "FLUSH_TIMEOUT_S", 5.0)
    topic = f"faults_{uuid.uuid4().hex[:10]}"
    sink = hr.sinks.Kafka(topic, servers=private_kafka.servers, key="id")
    sink.backoff = Backoff(retries=1, first_s=0.2)
    moments: dict[str, float] = {}

    def back() -> None:
        try:
            private_kafka.start()
            moments["up"] = time.monotonic()
        except AssertionError as exc:  # said by the assertion below, not lost in the timer's thread
            moments["start failed"] = str(exc)

    def outage() -> None:
        private_kafka.stop()
        moments["down"] = time.monotonic()
        threading.Timer(15.0, back).start()  # past the sink's retries (2 attempts of at most 5 s each)

    caplog.set_level(logging.INFO, logger="headrace.kafka")
    run = PipelineRun(numbers(f"k{topic}", totals=sink), state_dir=str(tmp_path / "s"), progress="quiet",
                      restart_attempts=8, restart_backoff="1s").start()
    result = run.wait(until_exhausted=True, on_settled=Steps(after_2=outage))
    assert "up" in moments, moments
    assert result.restarts >= 1
    written = sorted((r.json()["id"], r.json()["word"], r.json()["twice"]) for r in read_topic(
        private_kafka.servers, topic))
    assert written == expected()
    refused = [r for r in caplog.records if r.name == "headrace.kafka" and "Connection refused" in r.getMessage()]
    assert 1 <= len(refused) <= 3, [r.getMessage() for r in refused]  # one a minute


def test_a_kafka_source_outage_past_sparks_retries_is_restarted_with_exact_output(spark, private_kafka, tmp_path):
    """Spark's Kafka source loses its broker between batches: its offset requests time out (shortened
    here to 3 s, 1 retry) and the query fails; the restart strategy restarts it until the broker is
    back, and every record is read once."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"faults_src_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": private_kafka.servers})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)

    def produce(numbers: range) -> None:
        producer = Producer({"bootstrap.servers": private_kafka.servers, "logger": logging.getLogger("test")})
        for n in numbers:
            producer.produce(topic, value=json.dumps({"n": n}))
        assert producer.flush(30) == 0

    produce(range(100))
    p = hr.Pipeline("kafka_source_outage")
    out = TestSink()
    p.source("numbers", hr.sources.Kafka(topic, schema="n long", servers=private_kafka.servers, options={
        "kafka.default.api.timeout.ms": "3000", "kafka.request.timeout.ms": "2000", "fetchOffset.numRetries": "1",
        "fetchOffset.retryIntervalMs": "200"})).sink("out", out)
    run = PipelineRun(p, state_dir=str(tmp_path / "s"), progress="quiet", restart_attempts=10,
                      restart_backoff="1s").start()
    run.settle()
    private_kafka.stop()
    deadline = time.time() + 120
    while run.restarts == 0 and time.time() < deadline:
        run.poll()
        run._alive()  # a failed query is restarted here, as wait() does
        time.sleep(0.5)
    assert run.restarts >= 1
    private_kafka.start()
    produce(range(100, 200))
    run.settle()
    run.request_stop("test done")
    result = run.wait(until_exhausted=False)
    assert result.restarts >= 1
    assert sorted(r["n"] for r in out.rows()) == list(range(200))
