"""The PostgreSQL change data capture source against the real server (127.0.0.1:5432, made ready for
logical decoding by scripts/postgres_logical.sh): changes of chosen tables exactly once in commit
order with their images, a per-key state kept in a Postgres table, stop-and-restart and
SIGKILL-and-restart of a driver, the slot never passing what Spark committed, and the errors a user
can cause. Expected changes are computed here in plain Python from the statements the test ran;
every test uses tables and slots of its own and drops them at its end (a slot holds WAL)."""

from __future__ import annotations

import json
import random
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip
from driver_process import Driver, KilledRun

import headrace as hr
from headrace.connectors.base import SourceContext
from headrace.connectors.postgres_cdc import drop_slot, ensure_slot, lsn_int, wal_level_message
from headrace.connectors.spark_readers.postgres_cdc import ChangesReader
from headrace.errors import PlanError, SourceError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink

psycopg = pytest.importorskip("psycopg")

DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "postgres_cdc_driver.py"
Change = tuple[str, str, Any, Any]  # (op, table, before, after)


def _ready() -> str | None:
    """None when the server decodes logically with wal2json, else why not."""
    try:
        with psycopg.connect(DSN, autocommit=True, connect_timeout=3) as conn:
            level = conn.execute("SHOW wal_level").fetchone()[0]
            if level != "logical":
                return f"wal_level={level}"
    except psycopg.Error as exc:
        return f"{DSN}: {exc}"
    return None


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A connection to the running PostgreSQL, made logical-decoding ready with
    scripts/postgres_logical.sh when it is not, or a skip saying why."""
    why = _ready()
    if why is not None:
        try:
            done = subprocess.run(["bash", str(ROOT / "scripts" / "postgres_logical.sh")], capture_output=True,
                                  text=True, timeout=300)
            why = done.stderr.strip()[-500:] or why
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"scripts/postgres_logical.sh: {exc}"
        service_or_skip("PostgreSQL with wal_level=logical", _ready() is None, why)
    conn = psycopg.connect(DSN, autocommit=True)
    yield conn
    conn.close()


class Made:
    """The tables and slots of one test, dropped at its end."""

    def __init__(self, conn: Any) -> None:
        self.conn, self.tables, self.slots = conn, [], []  # type: ignore[var-annotated]
        self.tag = uuid.uuid4().hex[:8]

    def table(self, role: str, identity_full: bool = False) -> str:
        name = f"hr_cdc_{role}_{self.tag}"
        self.conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, name text, amount int)")
        if identity_full:
            self.conn.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
        self.tables.append(name)
        return name

    def slot(self) -> str:
        name = f"hr_cdc_{self.tag}_{len(self.slots)}"
        self.slots.append(name)
        return name

    def drop(self) -> None:
        for slot in self.slots:
            deadline = time.time() + 60
            while True:  # a killed driver's server process may hold the slot for a moment
                try:
                    drop_slot(DSN, slot)
                    break
                except SourceError:
                    raise
                except psycopg.Error:
                    if time.time() > deadline:
                        raise
                    time.sleep(0.5)
        for table in self.tables:
            self.conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.fixture
def made(server: Any) -> Iterator[Made]:
    found = Made(server)
    yield found
    found.drop()


def create_slot(slot: str) -> None:
    """The slot made before the test's statements run, as a pipeline's first start makes it."""
    with psycopg.connect(DSN, autocommit=True) as conn:
        ensure_slot(conn, "test", DSN, slot)


class Model:
    """Random transactions of inserts, updates and deletes on some tables, and the changes they make
    (op, table, before, after) in commit order, as the source should report them."""

    def __init__(self, conn: Any, tables: dict[str, bool], seed: int) -> None:
        self.conn, self.full = conn, tables  # table -> REPLICA IDENTITY FULL
        self.rows: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in tables}
        self.rng = random.Random(seed)
        self.changes: list[Change] = []

    def run(self, transactions: int, keys: int = 15) -> None:
        for _ in range(transactions):
            statements, made = [], []
            shadow = {t: dict(r) for t, r in self.rows.items()}
            for _ in range(self.rng.randint(1, 4)):
                table = self.rng.choice(sorted(self.rows))
                key = self.rng.randrange(keys)
                old = shadow[table].get(key)
                before = (old if self.full[table] else {"id": key}) if old else None
                if old is None:
                    new = {"id": key, "name": f"n{self.rng.randrange(1000)}", "amount": self.rng.randrange(100)}
                    statements.append((f"INSERT INTO {table} VALUES (%s, %s, %s)", (key, new["name"], new["amount"])))
                    made.append(("insert", table, None, new))
                    shadow[table][key] = new
                elif self.rng.random() < 0.6:
                    new = {**old, "amount": self.rng.randrange(100), "name": f"u{self.rng.randrange(1000)}"}
                    statements.append((f"UPDATE {table} SET name = %s, amount = %s WHERE id = %s",
                                       (new["name"], new["amount"], key)))
                    made.append(("update", table, before, new))
                    shadow[table][key] = new
                else:
                    statements.append((f"DELETE FROM {table} WHERE id = %s", (key,)))
                    made.append(("delete", table, before, None))
                    del shadow[table][key]
            with self.conn.transaction():
                for sql, params in statements:
                    self.conn.execute(sql, params)
            self.rows, self.changes = shadow, self.changes + made


def got(rows: list[dict[str, Any]]) -> list[Change]:
    """The changes of output rows, in commit order (commit LSN, then the change's own LSN)."""
    ordered = sorted(rows, key=lambda r: (lsn_int(r["commit_lsn"]), lsn_int(r["lsn"])))
    return [(r["op"], r["table"], json.loads(r["before"]) if r.get("before") else None,
             json.loads(r["after"]) if r.get("after") else None) for r in ordered]


def public(changes: list[Change]) -> list[Change]:
    return [(op, f"public.{table}", before, after) for op, table, before, after in changes]


def run_until(pipeline: hr.Pipeline, state_dir: str, done: Callable[[], bool], timeout: float = 120) -> Any:
    run = PipelineRun(pipeline, state_dir=state_dir, progress="quiet").start()
    deadline = time.time() + timeout
    try:
        while True:
            run.settle()
            if done():
                break
            assert time.time() < deadline, f"the pipeline did not finish within {timeout:.0f} s"
            time.sleep(0.2)
    finally:
        run.request_stop("test done")
    return run.wait(until_exhausted=False)


def confirmed(conn: Any, slot: str) -> int:
    return lsn_int(conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
                                (slot,)).fetchone()[0])


def last_committed_offset(checkpoint: Path) -> int | None:
    """The source's end offset of the checkpoint's last committed batch (an LSN)."""
    done = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")]
    if not done:
        return None
    lines = (checkpoint / "offsets" / str(max(done))).read_text().splitlines()
    return lsn_int(json.loads(lines[2])["lsn"])


def test_chosen_tables_arrive_exactly_once_in_commit_order_with_their_images(spark: Any, made: Made,
                                                                             tmp_path: Path) -> None:
    plain, full, other = made.table("plain"), made.table("full", identity_full=True), made.table("other")
    slot = made.slot()
    create_slot(slot)
    model = Model(made.conn, {plain: False, full: True, other: False}, seed=1)
    model.run(40)
    expected = public([c for c in model.changes if c[1] != other])
    assert {c[0] for c in expected} == {"insert", "update", "delete"}
    p = hr.Pipeline(f"cdc_order_{made.tag}")
    out = TestSink()
    p.source("changes", hr.sources.PostgresChanges([plain, full], dsn=DSN, slot=slot, max_records_per_batch=20)
             ).sink("out", out)

    result = run_until(p, str(tmp_path / "state"), lambda: len(out.rows()) >= len(expected))

    rows = out.rows()
    assert got(rows) == expected
    assert [lsn_int(r["commit_lsn"]) for r in rows] == sorted(lsn_int(r["commit_lsn"]) for r in rows)  # commit order
    assert len({r["lsn"] for r in rows}) == len(rows) == result.input_rows
    assert all(r["commit_time"].year >= 2024 and isinstance(r["xid"], int) for r in rows)
    by_commit: dict[str, set[int]] = {}
    for r in rows:
        by_commit.setdefault(r["commit_lsn"], set()).add(r["xid"])
    assert all(len(xids) == 1 for xids in by_commit.values())  # one transaction per commit position
    per_batch = [report["numInputRows"] for report in result.progress if report["numInputRows"]]
    assert len(per_batch) > 1 and max(per_batch) <= 20 + 3, per_batch  # whole transactions, capped
    assert list(rows[0])[:8] == ["op", "table", "before", "after", "lsn", "commit_lsn", "commit_time", "xid"]


def test_a_replay_reads_the_planned_changes_and_the_stop_file_holds(made: Made, tmp_path: Path) -> None:
    """The reader as Spark drives it, without Spark: a batch planned once and read again by another
    reader after more changes reads the same rows; nothing is consumed until commit."""
    table, slot = made.table("replay"), made.slot()
    create_slot(slot)
    source = hr.sources.PostgresChanges(table, dsn=DSN, slot=slot, schema="id long, amount long")
    options = {**source.options(), "hr_source": "changes", "hr_run_dir": str(tmp_path)}
    reader = ChangesReader(options)
    start = reader.initialOffset()
    model = Model(made.conn, {table: False}, seed=2)
    model.run(10)
    end = reader.latestOffset(start)
    read = [row for part in reader.partitions(start, end) for batch in reader.read(part) for row in batch.to_pylist()]
    model.run(10)
    again = ChangesReader(options)
    replay = [row for part in again.partitions(start, end) for batch in again.read(part) for row in batch.to_pylist()]
    assert replay == read and got(read) == public(model.changes[:len(read)]) and read
    assert all(r["id"] == json.loads(r["after"] or r["before"])["id"] for r in read)  # typed from the images
    assert confirmed(made.conn, slot) == lsn_int(start["lsn"])  # peeking consumed nothing
    reader.commit(end)
    assert confirmed(made.conn, slot) == lsn_int(end["lsn"])
    (tmp_path / "stop").touch()
    assert reader.latestOffset(end) == end
    reader.stop()
    again.stop()


def test_without_a_record_cap_batches_are_planned_by_wal_position(made: Made, tmp_path: Path) -> None:
    """Without a record cap a batch reads every transaction committed when it is planned (the
    changes are decoded once); another table's changes plan no batch; every change arrives once, in
    order, also when more transactions commit between batches."""
    table, other, slot = made.table("by_position"), made.table("by_position_other"), made.slot()
    create_slot(slot)
    source = hr.sources.PostgresChanges(table, dsn=DSN, slot=slot)
    reader = ChangesReader({**source.options(), "hr_source": "changes", "hr_run_dir": str(tmp_path)})
    start = reader.initialOffset()
    Model(made.conn, {other: False}, seed=3).run(5)
    assert reader.latestOffset(start) == start  # nothing of the chosen table: no batch
    model = Model(made.conn, {table: False}, seed=4)
    rows: list[dict[str, Any]] = []
    offset = start
    for _ in range(3):
        model.run(10)
        end = reader.latestOffset(offset)
        model.run(5)  # committed after the plan: the next batch's
        rows += [row for part in reader.partitions(offset, end) for batch in reader.read(part)
                 for row in batch.to_pylist()]
        reader.commit(end)
        offset = end
    end = reader.latestOffset(offset)
    rows += [row for part in reader.partitions(offset, end) for batch in reader.read(part) for row in batch.to_pylist()]
    assert reader.latestOffset(end) == end
    reader.stop()
    assert got(rows) == public(model.changes)


def test_per_key_state_in_postgres_equals_the_table_after_stop_and_restart(spark: Any, made: Made,
                                                                           tmp_path: Path) -> None:
    plain, full = made.table("src"), made.table("srcfull", identity_full=True)
    state = f"hr_cdc_state_{made.tag}"
    made.tables.append(state)
    slot = made.slot()
    create_slot(slot)
    model = Model(made.conn, {plain: False, full: True}, seed=3)
    model.run(60)
    state_dir = str(tmp_path / "state")

    def pipeline(out: TestSink) -> hr.Pipeline:
        p = hr.Pipeline(f"cdc_state_{made.tag}")
        changes = p.source("changes", hr.sources.PostgresChanges(
            [plain, full], dsn=DSN, slot=slot, schema="id int, name string, amount int", max_records_per_batch=25))
        changes.sink("out", out)
        (changes.select("table", "id", "name", "amount", deleted=hr.col("op") == "delete")
                .sink("latest", hr.sinks.Postgres(state, dsn=DSN, key=["table", "id"])))
        return p

    out1 = TestSink()
    run = PipelineRun(pipeline(out1), state_dir=state_dir, progress="quiet").start()
    deadline = time.time() + 120
    while len(run.query.recentProgress) < 2:  # the first batches committed, then a stop mid-stream
        assert time.time() < deadline and run.query.isActive, "no first batches within 120 s"
        time.sleep(0.05)
    run.request_stop("test")
    run.wait(until_exhausted=False)
    checkpoint = tmp_path / "state" / f"cdc_state_{made.tag}" / "checkpoint"
    assert confirmed(made.conn, slot) <= (last_committed_offset(checkpoint) or 0)
    assert 0 < len(out1.rows()) < len(model.changes), "the first run should have stopped mid-stream"
    model.run(30)
    out2 = TestSink()
    run_until(pipeline(out2), state_dir, lambda: len(out1.rows()) + len(out2.rows()) >= len(model.changes))

    assert got(out1.rows() + out2.rows()) == public(model.changes)  # none twice, none lost, in commit order
    for table in (plain, full):
        source = made.conn.execute(f"SELECT id, name, amount FROM {table} ORDER BY id").fetchall()
        latest = made.conn.execute(f"SELECT id, name, amount FROM {state} WHERE \"table\" = %s AND NOT deleted "
                                   "ORDER BY id", (f"public.{table}",)).fetchall()
        assert latest == source and source


def test_bad_changes_go_to_dead_letters_with_their_lsn(spark: Any, made: Made, tmp_path: Path) -> None:
    table, slot = made.table("typed"), made.slot()
    create_slot(slot)
    made.conn.execute(f"INSERT INTO {table} VALUES (1, 'one', 1), (2, NULL, 2), (3, 'three', 3)")
    p = hr.Pipeline(f"cdc_dead_{made.tag}")
    out, dead = TestSink(), TestSink()
    p.source("changes", hr.sources.PostgresChanges(table, dsn=DSN, slot=slot, schema="id long, name long")
             ).sink("out", out)
    p.dead_letters().sink("dead", dead)

    run_until(p, str(tmp_path / "state"), lambda: len(out.rows()) + len(dead.rows()) >= 3)

    assert [(r["id"], r["name"]) for r in out.rows()] == [(2, None)]
    assert len(dead.rows()) == 2
    for row in dead.rows():
        assert row["source"] == "changes" and "field 'name': expected long" in row["error"]
        assert f"table public.{table}" in row["error"] and lsn_int(row["position"]) > 0
        assert json.loads(row["raw"])["action"] == "I"


def test_sigkill_of_the_driver_then_restart_gives_the_uninterrupted_output(made: Made, tmp_path: Path) -> None:
    plain, full = made.table("kill"), made.table("killfull", identity_full=True)
    slot = made.slot()
    create_slot(slot)
    start = confirmed(made.conn, slot)
    model = Model(made.conn, {plain: False, full: True}, seed=4)
    model.run(80)
    name = f"cdc_killed_{made.tag}"
    args = {"name": name, "tables": [plain, full], "dsn": DSN, "slot": slot, "state_dir": str(tmp_path / "state"),
            "out": str(tmp_path / "out"), "max_records_per_batch": 40}
    checkpoint = tmp_path / "state" / name / "checkpoint"
    run = KilledRun(DRIVER, args, tmp_path / "driver.log")
    run.kill_after(2)
    assert len(run.written()) < len(model.changes), "the driver should have been killed mid-stream"
    assert start <= confirmed(made.conn, slot) <= (last_committed_offset(checkpoint) or start)
    second = Driver(DRIVER, args, tmp_path / "driver.log")
    try:
        second.wait_for("every change written", lambda: len(run.written()) >= len(model.changes))
        assert confirmed(made.conn, slot) <= (last_committed_offset(checkpoint) or start)
        second.stop()
    finally:
        second.kill()

    rows = run.written()
    assert got(rows) == public(model.changes)  # each change exactly once
    assert Counter(r["lsn"] for r in rows).most_common(1)[0][1] == 1
    assert start < confirmed(made.conn, slot) <= (last_committed_offset(checkpoint) or start)


def test_bad_arguments_tables_and_servers_say_what_is_wrong(spark: Any, made: Made, tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"give at least one table"):
        hr.sources.PostgresChanges([])
    with pytest.raises(PlanError, match=r"'a.b.c' is not a table name like 'orders' or 'shop.orders'"):
        hr.sources.PostgresChanges("a.b.c")
    with pytest.raises(PlanError, match=r"slot='Bad-Slot' is not a replication slot name"):
        hr.sources.PostgresChanges("t", slot="Bad-Slot")
    with pytest.raises(PlanError, match=r"max_records_per_batch must be at least 1, got 0"):
        hr.sources.PostgresChanges("t", max_records_per_batch=0)
    with pytest.raises(PlanError, match=r"column\(s\) op clash with the source's own columns"):
        hr.sources.PostgresChanges("t", schema="op string")
    with pytest.raises(PlanError, match=r"column 'id' is long in one table's schema and string in table 'b'"):
        hr.sources.PostgresChanges("a, b", schema={"a": "id long", "b": "id string"})
    message = wal_level_message("source 'changes'", "replica", "postgresql://app:secret@db/shop")
    assert message == ("source 'changes': PostgreSQL at postgresql://app@db/shop runs with wal_level=replica, and "
                       "change data capture needs wal_level=logical: run scripts/postgres_logical.sh on the local "
                       "cluster, or set wal_level=logical (and max_replication_slots, max_wal_senders >= 1) in "
                       "postgresql.conf and restart the server")
    keyless = f"hr_cdc_keyless_{made.tag}"
    made.conn.execute(f"CREATE TABLE {keyless} (x int)")
    made.tables.append(keyless)

    def start(source: Any) -> None:
        p = hr.Pipeline(f"cdc_errors_{uuid.uuid4().hex[:6]}")
        p.source("changes", source).sink("out", TestSink())
        PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()

    missing = f"hr_cdc_missing_{made.tag}"
    with pytest.raises(SourceError, match=rf"source 'changes': table 'public.{missing}' does not exist"):
        start(hr.sources.PostgresChanges(missing, dsn=DSN, slot=made.slot()))
    with pytest.raises(SourceError, match=rf"table 'public.{keyless}' has no primary key and REPLICA IDENTITY DEFAULT.*"
                                          rf"ALTER TABLE public.{keyless} REPLICA IDENTITY FULL"):
        start(hr.sources.PostgresChanges(keyless, dsn=DSN, slot=made.slot()))
    with pytest.raises(SourceError) as failed:
        start(hr.sources.PostgresChanges("t", dsn="postgresql://postgres:secret@127.0.0.1:1/postgres"))
    assert "source 'changes': cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:1/postgres" \
        in str(failed.value) and "secret" not in str(failed.value)
    other = made.slot()
    made.conn.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (other,))
    source = hr.sources.PostgresChanges(made.table("taken"), dsn=DSN, slot=other)
    with pytest.raises(SourceError, match=rf"the replication slot '{other}' exists for plugin 'test_decoding'"):
        source.prepare(SourceContext(str(tmp_path), "changes"))
    described = source.describe()
    assert described["type"] == "PostgresChanges" and "change data capture" in described["what"]
    assert described["guarantee"] == "exactly-once" and described["slot"] == other
    assert hr.sources.PostgresChanges("t").describe()["slot"] == "headrace_<source name>"


def test_the_live_view_example_equals_the_table(made: Made, tmp_path: Path, monkeypatch: Any) -> None:
    """examples/cdc_live_view.py on random inserts, updates and deletes: each customer's hash in
    Redis holds the count and total of the table's orders (a customer whose orders went has 0)."""
    import runpy

    redis = pytest.importorskip("redis")
    from conftest import service_or_skip

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        client.ping()
    except redis.RedisError:
        started = subprocess.run(["bash", str(ROOT / "scripts" / "redis.sh"), "start"], capture_output=True,
                                 text=True, timeout=300)
        service_or_skip("Redis", started.returncode == 0, started.stderr.strip()[-500:])
    table, prefix = f"hr_cdc_orders_{made.tag}", f"live:{made.tag}"
    made.conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, customer text, amount bigint)")
    made.conn.execute(f"ALTER TABLE {table} REPLICA IDENTITY FULL")
    made.tables.append(table)
    made.slots.append(f"live_{table}")
    create_slot(f"live_{table}")
    rng = random.Random(5)
    for _ in range(120):
        key = rng.randrange(30)
        # Only the last transaction commits after this position: an offset past it has read them all.
        before_last = lsn_int(made.conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
        with made.conn.transaction():
            if made.conn.execute(f"SELECT 1 FROM {table} WHERE id = %s", (key,)).fetchone() is None:
                made.conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)",
                                  (key, f"c{rng.randrange(5)}", rng.randrange(100)))
            elif rng.random() < 0.6:  # a new amount, sometimes a new customer
                made.conn.execute(f"UPDATE {table} SET customer = %s, amount = %s WHERE id = %s",
                                  (f"c{rng.randrange(5)}", rng.randrange(100), key))
            else:
                made.conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))

    monkeypatch.setenv("HEADRACE_EXAMPLE_TABLE", table)
    monkeypatch.setenv("HEADRACE_EXAMPLE_PREFIX", prefix)
    pipeline = runpy.run_path(str(ROOT / "examples" / "cdc_live_view.py"))["pipeline"]
    checkpoint = tmp_path / "state" / "orders_live_view" / "checkpoint"
    run_until(pipeline, str(tmp_path / "state"),
              lambda: (last_committed_offset(checkpoint) or 0) > before_last, timeout=180)
    try:
        expected = {customer: (count, total) for customer, count, total in made.conn.execute(
            f"SELECT customer, count(*), sum(amount) FROM {table} GROUP BY customer").fetchall()}
        view = {}
        for key in client.keys(f"{prefix}:*"):
            fields = {k.decode(): v.decode() for k, v in client.hgetall(key).items()}
            if int(fields["orders"]):
                view[fields["customer"]] = (int(fields["orders"]), int(fields["amount"]))
        assert view == expected
    finally:
        keys = client.keys(f"{prefix}:*")
        if keys:
            client.delete(*keys)
