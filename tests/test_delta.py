"""Delta Lake through its own Spark package (io.delta:delta-spark, the release built for this
Spark): the sink appends or upserts each batch exactly once (a replayed batch is skipped by its
transaction marker), the source streams a table's versions, and the errors a user can cause.
Expected outputs are computed here in plain Python."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip

import headrace as hr
from headrace.environment import jars
from headrace.errors import PlanError, SetupError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource


@pytest.fixture(scope="module")
def delta(spark: Any) -> Any:
    """The test session with Delta's package, or a skip (a failure in CI) saying why."""
    if not jars.fetched().get(jars.DELTA.name):
        service_or_skip("Delta Lake's package", False, "run bash scripts/fetch_jars.sh")
    return spark


def table(spark: Any, path: Path) -> list[dict[str, Any]]:
    return [row.asDict() for row in spark.read.format("delta").load(str(path)).collect()]


def drop_last_commit(state: Path) -> None:
    """Spark replays a batch whose commit it did not record (a driver killed after the sink
    committed): remove the last commit record, as such a kill leaves the checkpoint."""
    commits = sorted(state.glob("**/checkpoint/commits/[0-9]*"), key=lambda f: int(f.name))
    commits[-1].unlink()


def at(second: int) -> datetime:
    return datetime(2026, 1, 1, 0, 0, second, tzinfo=UTC)


ORDERS = [{"order_id": i, "user": f"u{i % 4}", "amount": i % 5} for i in range(60)]


def orders_pipeline(target: Path, batches: list[list[dict[str, Any]]]) -> hr.Pipeline:
    p = hr.Pipeline("delta_orders")
    (p.source("orders", TestSource(batches, schema="order_id long, user string, amount long"))
     .filter(hr.col("amount") > 0)
     .sink("to_delta", hr.sinks.Delta(str(target))))
    return p


def test_append_writes_each_batch_once_with_its_marker(delta: Any, tmp_path: Path) -> None:
    target, state = tmp_path / "orders", tmp_path / "state"
    batches = [ORDERS[:20], ORDERS[20:40], ORDERS[40:]]
    hr.run(orders_pipeline(target, batches), state_dir=str(state), progress="quiet")
    expected = sorted(o["order_id"] for o in ORDERS if o["amount"] > 0)
    assert sorted(r["order_id"] for r in table(delta, target)) == expected

    markers_before = markers(target)
    # The last batch is replayed: its marker is in the table, so the sink skips it.
    drop_last_commit(state)
    hr.run(orders_pipeline(target, batches), state_dir=str(state), progress="quiet")
    assert sorted(r["order_id"] for r in table(delta, target)) == expected
    assert markers(target) == markers_before  # no commit for the replay
    assert [m["version"] for m in markers_before] == list(range(len(markers_before)))  # one commit per batch
    assert all(m["appId"].startswith("to_delta/delta_orders@") for m in markers_before)


def markers(target: Path) -> list[dict[str, Any]]:
    """The transaction markers of the table's commits, oldest first."""
    actions = [json.loads(line) for commit in sorted((target / "_delta_log").glob("*.json"))
               for line in commit.read_text().splitlines()]
    return [a["txn"] for a in actions if "txn" in a]


def test_keyed_upsert_keeps_the_last_value_of_each_key(delta: Any, tmp_path: Path) -> None:
    """Counts per user in 10 s windows, updated as events arrive (early panes every 4 records), upserted by
    (user, window_start): the table ends with each window's final count."""
    events = [{"user": f"u{i % 3}", "ts": at(i // 4)} for i in range(90)]  # in order: none late
    batches = [events[:45], events[45:]]
    target, state = tmp_path / "counts", tmp_path / "state"

    def pipeline() -> hr.Pipeline:
        p = hr.Pipeline("delta_counts")
        (p.source("events", TestSource(batches, schema="user string, ts timestamp"), event_time="ts")
         .key_by("user").window(hr.Tumbling("10s"), trigger=hr.AfterWatermark(early=hr.EveryN(4))).count()
         .select("user", "window_start", "count")
         .sink("counts", hr.sinks.Delta(str(target), key=["user", "window_start"])))
        return p

    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    expected = Counter((e["user"], e["ts"].replace(second=e["ts"].second // 10 * 10)) for e in events)
    got = {(r["user"], r["window_start"].replace(tzinfo=UTC)): r["count"] for r in table(delta, target)}
    assert got == dict(expected)

    drop_last_commit(state)  # a replayed upsert leaves the table as it was
    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    got = {(r["user"], r["window_start"].replace(tzinfo=UTC)): r["count"] for r in table(delta, target)}
    assert got == dict(expected)


def test_source_streams_the_rows_then_each_new_version_once(delta: Any, tmp_path: Path) -> None:
    target, state = tmp_path / "orders", tmp_path / "state"
    frame = delta.createDataFrame([(o["order_id"], o["user"], o["amount"]) for o in ORDERS[:30]],
                                  "order_id long, user string, amount long")
    frame.write.format("delta").save(str(target))

    def run_once() -> list[dict[str, Any]]:
        p = hr.Pipeline("delta_source")
        out = TestSink()
        (p.source("orders", hr.sources.Delta(str(target), max_files_per_batch=1))
         .filter(hr.col("amount") > 0).sink("out", out))
        run = PipelineRun(p, state_dir=str(state), progress="quiet").start()
        run.settle()
        run.request_stop("test done")
        run.wait(until_exhausted=False)
        return out.rows()

    first = run_once()
    assert sorted(r["order_id"] for r in first) == [o["order_id"] for o in ORDERS[:30] if o["amount"] > 0]
    more = delta.createDataFrame([(o["order_id"], o["user"], o["amount"]) for o in ORDERS[30:]],
                                 "order_id long, user string, amount long")
    more.write.format("delta").mode("append").save(str(target))
    second = run_once()  # from the checkpoint: only the new version's rows
    assert sorted(r["order_id"] for r in second) == [o["order_id"] for o in ORDERS[30:] if o["amount"] > 0]


def test_missing_key_column_names_the_step(delta: Any, tmp_path: Path) -> None:
    p = hr.Pipeline("delta_bad_key")
    (p.source("orders", TestSource([ORDERS[:3]], schema="order_id long, user string, amount long"))
     .sink("to_delta", hr.sinks.Delta(str(tmp_path / "t"), key="customer")))
    with pytest.raises(Exception, match=r"sink 'to_delta' \(.*test_delta.py:\d+\): the column\(s\) \['customer'\] "
                                        r"are not among the rows' columns"):
        hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")


@pytest.mark.parametrize("make, message", [
    (lambda d: hr.sinks.Delta(""), "Delta sink: path must be the table's folder"),
    (lambda d: hr.sinks.Delta(str(d), key=["a", "a"]), "key ['a', 'a'] names a column twice"),
    (lambda d: hr.sinks.Delta(str(d), key=[1]), "key must be a column name or a list of column names"),
    (lambda d: hr.sources.Delta(str(d / "none")), "no Delta table there (no _delta_log with a schema)"),
    (lambda d: hr.sources.Delta("s3a://bucket/t"), "give schema= for a table on a Hadoop URI"),
    (lambda d: hr.sources.Delta(str(d), schema="a long", max_files_per_batch=0),
     "max_files_per_batch must be a whole number of at least 1, got 0"),
])
@pytest.mark.fast
def test_bad_settings_are_refused_with_the_reason(tmp_path: Path, make: Any, message: str) -> None:
    with pytest.raises(PlanError) as raised:
        make(tmp_path)
    assert message in str(raised.value)


def test_a_session_without_deltas_settings_says_which_and_how(delta: Any) -> None:
    needs = jars.Package("io.delta", "delta-spark_2.13", "org.apache.spark.sql.delta.sources.DeltaDataSource",
                         settings=(("spark.sql.extensions", "com.example.Missing"),))
    with pytest.raises(SetupError, match=r"sink 'x' needs the Spark setting spark.sql.extensions=com.example.Missing, "
                                         r"which this Spark session was started without"):
        jars.require(delta, [needs], "sink 'x'")


def test_delta_coordinate_is_the_release_built_for_this_spark() -> None:
    assert jars.built_for_spark("<artifactId>spark-sql_2.13</artifactId>\n  <version>4.2.0</version>") == "4.2.0"
    import pyspark
    coordinate = jars.DELTA.coordinate
    if "<none" in coordinate:
        pytest.skip(f"Maven Central unreachable or no Delta for Spark {pyspark.__version__}: {coordinate}")
    assert coordinate.startswith("io.delta:delta-spark_2.13:")


def test_sessions_example_writes_the_sessions_plain_python_finds(delta: Any, tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    """examples/kafka_sessions_delta.py on a fresh topic: every closed session, once."""
    import random
    import runpy
    import socket
    import subprocess
    import uuid

    kafka = pytest.importorskip("confluent_kafka")
    root = Path(__file__).resolve().parent.parent
    try:
        socket.create_connection(("127.0.0.1", 9092), timeout=1).close()
    except OSError:
        started = subprocess.run(["bash", str(root / "scripts" / "kafka.sh"), "start"], capture_output=True,
                                 text=True, timeout=300)
        service_or_skip("Kafka", started.returncode == 0, started.stderr.strip()[-500:])
    topic, target = f"clicks_{uuid.uuid4().hex[:8]}", tmp_path / "sessions"
    rng = random.Random(7)
    clicks, now = [], 1_795_000_000_000
    for _ in range(400):  # gaps from 0.1 s to 50 s: some close a session (> 30 s), most do not
        now += rng.choice([100, 800, 3_000, 12_000, 50_000])
        clicks.append({"user": f"u{rng.randrange(5)}", "page": f"/p{rng.randrange(9)}", "ts": now})
    clicks.append({"user": "~end", "page": "/", "ts": now + 3_600_000})  # moves the watermark past every session
    producer = kafka.Producer({"bootstrap.servers": "127.0.0.1:9092"})
    for click in clicks:
        iso = datetime.fromtimestamp(click["ts"] / 1000, UTC).isoformat().replace("+00:00", "Z")
        producer.produce(topic, json.dumps({**click, "ts": iso}))
    assert producer.flush(30) == 0

    monkeypatch.setenv("HEADRACE_EXAMPLE_TOPIC", topic)
    monkeypatch.setenv("HEADRACE_EXAMPLE_DELTA", str(target))
    pipeline = runpy.run_path(str(root / "examples" / "kafka_sessions_delta.py"))["pipeline"]
    run = PipelineRun(pipeline, state_dir=str(tmp_path / "state"), progress="quiet").start()
    run.settle()
    run.request_stop("test done")
    run.wait(until_exhausted=False)

    expected: dict[tuple[str, int], tuple[int, int, int]] = {}  # (user, start) -> (end, clicks, last)
    by_user: dict[str, list[int]] = {}
    for click in clicks[:-1]:
        by_user.setdefault(click["user"], []).append(click["ts"])
    for user, times in by_user.items():
        session = [times[0]]
        for ts in [*times[1:], None]:
            if ts is not None and ts <= session[-1] + 30_000:  # touching windows merge
                session.append(ts)
                continue
            expected[(user, session[0])] = (session[-1] + 30_000, len(session), session[-1])
            session = [ts] if ts is not None else []
    millis = lambda d: int(d.replace(tzinfo=UTC).timestamp() * 1000)  # noqa: E731
    got = {(r["user"], millis(r["window_start"])): (millis(r["window_end"]), r["clicks"], millis(r["last_click"]))
           for r in table(delta, target)}
    assert len(table(delta, target)) == len(got)  # one row per session
    assert got == expected
