"""Kafka against a real Apache Kafka broker (scripts/kafka.sh, KRaft, 127.0.0.1:9092) and Spark's
own Kafka connector: the source (JSON decoding, dead letters, metadata, lag), the transactional
sink (a replayed batch, a transaction a killed driver left open), and the errors a user can cause.
Expected outputs are computed here in plain Python from the records the test produced."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip

import headrace as hr
from headrace.connectors.kafka_sink import COMMITS_TOPIC, transactional_id
from headrace.environment import jars
from headrace.environment.checkpoints import query_id
from headrace.errors import PlanError, SetupError
from headrace.runtime.progress import summarise
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink
from headrace.testing.kafka import read_topic

kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

SERVERS = "127.0.0.1:9092"
ROOT = Path(__file__).resolve().parent.parent


def _reachable() -> bool:
    try:
        socket.create_connection(("127.0.0.1", 9092), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def broker() -> str:
    """A running broker (started with scripts/kafka.sh when none is), or a skip saying why."""
    if not _reachable():
        started = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start"], capture_output=True,
                                 text=True, timeout=300)
        service_or_skip("Kafka", started.returncode == 0 and _reachable(), started.stderr.strip()[-500:])
    if not jars.fetched().get(jars.KAFKA.name):
        service_or_skip("Spark's Kafka connector", False, "run bash scripts/fetch_jars.sh")
    return SERVERS


def new_topic(partitions: int = 2) -> str:
    name = f"t_{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": SERVERS})  # kept: the futures need their client alive
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    return name


def produce(topic: str, records: list[tuple[Any, Any, int]], headers: list[tuple[str, bytes]] | None = None) -> None:
    """(key, value, partition) each; a dict value is sent as JSON, None as a tombstone."""
    producer = kafka.Producer({"bootstrap.servers": SERVERS})
    for key, value, partition in records:
        payload = json.dumps(value) if isinstance(value, dict) else value
        producer.produce(topic, key=key, value=payload, partition=partition, headers=headers)
    assert producer.flush(30) == 0


def consume(topic: str, committed_only: bool = True) -> list[tuple[str | None, dict[str, Any]]]:
    """Every record of ``topic``, as (key, JSON value), read_committed by default."""
    return [(r.key, r.json()) for r in read_topic(SERVERS, topic, committed_only=committed_only)]


def run_until_idle(pipeline: hr.Pipeline, state_dir: str) -> Any:
    """Run ``pipeline`` until it processed everything in its topics, then stop it between batches."""
    run = PipelineRun(pipeline, state_dir=state_dir, progress="quiet").start()
    run.settle()
    run.request_stop("test done")
    return run.wait(until_exhausted=False)


ORDERS = [{"order_id": i, "user": f"u{i % 7}", "amount": i % 5} for i in range(300)]


def test_source_decodes_json_keeps_metadata_and_dead_letters_bad_values(spark: Any, broker: str,
                                                                         tmp_path: Path) -> None:
    topic = new_topic()
    good = [(f"u{o['order_id'] % 7}", o, o["order_id"] % 2) for o in ORDERS]
    bad = [(None, b"not json", 0), (None, b'{"order_id": "x", "user": "a", "amount": 1}', 1), ("gone", None, 1)]
    # a field missing from the object, or null in it, is a null field of a good record (docs/connectors.md)
    partial = [(None, {"order_id": 1000, "user": "m"}, 0), (None, {"order_id": 1001, "user": "n", "amount": None}, 1)]
    produce(topic, good[:150] + bad + partial + good[150:], headers=[("origin", b"shop")])
    p = hr.Pipeline("kafka_orders")
    orders = p.source("orders", hr.sources.Kafka(topic, schema="order_id long, user string, amount long",
                                                 metadata=["key", "partition", "offset", "timestamp", "headers"]))
    out, dead, unknown_amount = TestSink(), TestSink(), TestSink()
    orders.filter(hr.col("amount") > 0).sink("out", out)
    orders.filter(hr.col("amount").is_null()).sink("unknown_amount", unknown_amount)
    p.dead_letters().sink("dead", dead)

    result = run_until_idle(p, str(tmp_path / "state"))
    assert sorted((r["order_id"], r["user"], r["amount"]) for r in unknown_amount.rows()) == [
        (1000, "m", None), (1001, "n", None)]

    rows = out.rows()
    assert sorted(r["order_id"] for r in rows) == [o["order_id"] for o in ORDERS if o["amount"] > 0]
    assert all(r["kafka_key"] == r["user"] and r["kafka_partition"] == r["order_id"] % 2 for r in rows)
    assert all(json.loads(r["kafka_headers"]) == [{"key": "origin", "value": "shop"}] for r in rows)
    assert all(r["kafka_timestamp"] is not None for r in rows)
    assert len({(r["kafka_partition"], r["kafka_offset"]) for r in rows}) == len(rows)
    dead_rows = sorted(dead.rows(), key=lambda r: r["position"])
    assert [r["raw"] for r in dead_rows] == ["not json", '{"order_id": "x", "user": "a", "amount": 1}', None]
    assert [r["position"] for r in dead_rows] == [f"{topic}/0@75", f"{topic}/1@75", f"{topic}/1@76"]  # not partial
    assert all(r["source"] == "orders" and "not a JSON object of the schema" in r["error"] for r in dead_rows)
    assert result.dead_letters == len(bad)
    assert result.input_rows == len(good) + len(bad) + len(partial)  # the source is read once for every sink


def test_source_limits_batches_and_reports_lag(spark: Any, broker: str, tmp_path: Path) -> None:
    topic = new_topic(partitions=1)
    produce(topic, [(None, o, 0) for o in ORDERS[:100]])
    p = hr.Pipeline("kafka_lag")
    out = TestSink()
    (p.source("orders", hr.sources.Kafka(topic, schema="order_id long, user string, amount long",
                                         max_records_per_batch=30))
     .sink("out", out))

    result = run_until_idle(p, str(tmp_path / "state"))

    figures = [summarise(report) for report in result.progress if report["numInputRows"]]
    assert [f["input_rows"] for f in figures] == [30, 30, 30, 10]
    assert [f["lag"] for f in figures] == [70, 40, 10, 0]
    assert sorted(r["order_id"] for r in out.rows()) == list(range(100))


def kafka_to_kafka(name: str, source_topic: str, sink_topic: str) -> hr.Pipeline:
    p = hr.Pipeline(name)
    (p.source("orders", hr.sources.Kafka(source_topic, schema="order_id long, user string, amount long"))
     .with_columns(doubled=hr.col("amount") * 2)
     .sink("to_kafka", hr.sinks.Kafka(sink_topic, key="user")))
    return p


def expected_doubled(orders: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return sorted((o["user"], o["order_id"], o["amount"] * 2) for o in orders)


def written(topic: str, committed_only: bool = True) -> list[tuple[str | None, int, int]]:
    return sorted((key, value["order_id"], value["doubled"]) for key, value in consume(topic, committed_only))


def test_transactional_sink_skips_a_replayed_batch(spark: Any, broker: str, tmp_path: Path) -> None:
    source, sink = new_topic(), new_topic()
    produce(source, [(None, o, o["order_id"] % 2) for o in ORDERS[:200]])
    state = str(tmp_path / "state")
    run_until_idle(kafka_to_kafka("kafka_replay", source, sink), state)
    assert written(sink) == expected_doubled(ORDERS[:200])

    # Spark replays a batch whose commit it did not record (a driver killed after the sink
    # committed): remove the last commit record, as such a kill leaves the checkpoint.
    commits = sorted(Path(state).glob("**/checkpoint/commits/[0-9]*"), key=lambda f: int(f.name))
    commits[-1].unlink()
    produce(source, [(None, o, o["order_id"] % 2) for o in ORDERS[200:]])
    run_until_idle(kafka_to_kafka("kafka_replay", source, sink), state)

    assert written(sink) == expected_doubled(ORDERS)
    assert commits_topic_records() == 0  # batch ids go in as a consumer group's offsets, not records


def test_transaction_left_open_by_a_dead_driver_is_aborted(spark: Any, broker: str, tmp_path: Path) -> None:
    source, sink = new_topic(), new_topic()
    produce(source, [(None, o, 0) for o in ORDERS[:50]])
    state = str(tmp_path / "state")
    pipeline = kafka_to_kafka("kafka_fenced", source, sink)
    result = run_until_idle(pipeline, state)
    # A driver that died inside a transaction: same transactional id, records sent, no commit.
    ident = transactional_id(f"to_kafka/kafka_fenced@{query_id(result.checkpoint)}")
    zombie = kafka.Producer({"bootstrap.servers": SERVERS, "transactional.id": ident})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(sink, key="zombie", value=json.dumps({"order_id": -1, "doubled": -1}))
    zombie.flush(30)
    produce(source, [(None, o, 0) for o in ORDERS[50:100]])

    run_until_idle(kafka_to_kafka("kafka_fenced", source, sink), state)

    assert written(sink) == expected_doubled(ORDERS[:100])
    assert ("zombie", -1, -1) in written(sink, committed_only=False)  # it was written, then aborted


def test_kafka_sink_declares_at_least_once_without_transactions(spark: Any, broker: str, tmp_path: Path) -> None:
    source, sink = new_topic(), new_topic()
    produce(source, [(None, o, 0) for o in ORDERS[:40]])
    p = hr.Pipeline("kafka_plain")
    (p.source("orders", hr.sources.Kafka(source, schema="order_id long, user string, amount long"))
     .with_columns(doubled=hr.col("amount") * 2)
     .sink("to_kafka", hr.sinks.Kafka(sink, key="user", exactly_once=False)))
    assert "at-least-once" in p.explain()
    assert "lowered as: Spark's own kafka streaming sink" in p.explain()

    run_until_idle(p, str(tmp_path / "state"))
    assert written(sink) == expected_doubled(ORDERS[:40])

    # A stop between batches commits what was written (asynchronous progress tracking included):
    # the next run writes only the new records.
    produce(source, [(None, o, 1) for o in ORDERS[40:80]])
    run_until_idle(p, str(tmp_path / "state"))
    assert written(sink) == expected_doubled(ORDERS[:80])


def commits_topic_records() -> int:
    consumer = kafka.Consumer({"bootstrap.servers": SERVERS, "group.id": uuid.uuid4().hex})
    low, high = consumer.get_watermark_offsets(kafka.TopicPartition(COMMITS_TOPIC, 0), timeout=30)
    consumer.close()
    return high - low


ORDER_AVRO = json.dumps({"type": "record", "name": "Order", "fields": [
    {"name": "order_id", "type": "long"}, {"name": "user", "type": "string"},
    {"name": "amount", "type": ["null", "long"]}]})


def test_source_decodes_avro_and_dead_letters_what_does_not_decode(spark: Any, broker: str, tmp_path: Path) -> None:
    """Values encoded by Spark's own to_avro (plain Avro binary) decode into the schema's columns;
    bytes that are no such record go to the dead letters with their position."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import to_avro

    topic = new_topic(partitions=1)
    frame = spark.createDataFrame([(o["order_id"], o["user"], o["amount"]) for o in ORDERS[:50]],
                                  "order_id long, user string, amount long")
    encoded = [bytes(r.value) for r in frame.select(to_avro(F.struct("order_id", "user", "amount"), ORDER_AVRO)
                                                    .alias("value")).orderBy("order_id").collect()]
    produce(topic, [(None, value, 0) for value in encoded[:25]] + [(None, b"\x01", 0)]
            + [(None, value, 0) for value in encoded[25:]])
    p = hr.Pipeline("kafka_avro")
    out, dead = TestSink(), TestSink()
    p.source("orders", hr.sources.Kafka(topic, format="avro", avro_schema=ORDER_AVRO)).sink("out", out)
    p.dead_letters().sink("dead", dead)

    run_until_idle(p, str(tmp_path / "state"))

    assert sorted((r["order_id"], r["user"], r["amount"]) for r in out.rows()) == [
        (o["order_id"], o["user"], o["amount"]) for o in ORDERS[:50]]
    assert [(r["position"], "not an Avro record of the schema" in r["error"]) for r in dead.rows()] == [
        (f"{topic}/0@25", True)]


# -- errors a user can cause -------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({}, "give topics= or pattern=, not neither"),
    ({"topics": "a", "pattern": "b.*", "schema": "x long"}, "not both"),
    ({"topics": "a"}, "a json source needs schema="),
    ({"topics": "a", "format": "xml", "schema": "x long"}, "unknown format 'xml'"),
    ({"topics": "a", "format": "raw", "schema": "x long"}, "a raw source has the columns key and value"),
    ({"topics": "a", "schema": "x long", "metadata": ["size"]}, "unknown metadata ['size']"),
    ({"topics": "a", "schema": "x long", "starting": "middle"}, "starting='middle' is not"),
    ({"topics": "a", "schema": "x long", "max_records_per_batch": 0}, "max_records_per_batch must be at least 1"),
    ({"topics": "a", "format": "avro"}, "an avro source needs avro_schema=, an Avro record schema in JSON"),
    ({"topics": "a", "schema": "x long", "avro_schema": "{}"}, "avro_schema= goes with format='avro'"),
    ({"topics": "a", "format": "avro", "avro_schema": '{"type": "string"}'}, "avro_schema must be an Avro record"),
    ({"topics": "a", "format": "avro", "avro_schema": '{"type": "record", "name": "R", "fields": '
      '[{"name": "tags", "type": {"type": "array", "items": "string"}}]}'},
     "the Avro field 'tags' has the type {\"type\": \"array\", \"items\": \"string\"}, which has no column type"),
])
@pytest.mark.fast
def test_kafka_source_refuses_bad_settings(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError) as error:
        hr.sources.Kafka(**kwargs)
    assert message in str(error.value)


@pytest.mark.fast
def test_kafka_sink_refuses_bad_settings() -> None:
    with pytest.raises(PlanError, match="unknown format 'avro'"):
        hr.sinks.Kafka("out", format="avro")
    with pytest.raises(PlanError, match="key must be a column name"):
        hr.sinks.Kafka("out", key=[""])


def test_a_session_without_the_connector_says_which_package_and_how(spark: Any) -> None:
    missing = jars.Package("org.example", "no-such-connector_2.13", "org.example.NoSuchProvider")
    with pytest.raises(SetupError) as error:
        jars.require(spark, [missing], "source 'orders'")
    text = str(error.value)
    assert text.startswith("source 'orders' needs the Spark package org.example:no-such-connector_2.13:")
    assert "scripts/fetch_jars.sh" in text and "spark.jars.packages=" in text


@pytest.mark.fast
def test_session_settings_use_the_fetched_folder_or_spark_packages(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("HEADRACE_JARS_DIR", str(tmp_path))
    monkeypatch.setenv("HEADRACE_SPARK_PACKAGE_VERSION", "4.2.0")
    package = jars.Package("org.apache.spark", "spark-sql-kafka-0-10_2.13", "x.Y")
    assert jars.session_settings([package]) == {
        "spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"}
    for name in ("a.jar", "b.jar"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / jars.MANIFEST).write_text("# fetched\norg.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 a.jar\n"
                                          "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 b.jar\n")
    assert jars.session_settings([package]) == {"spark.jars": f"{tmp_path}/a.jar,{tmp_path}/b.jar"}
    assert jars.session_settings([]) == {"spark.jars": f"{tmp_path}/a.jar,{tmp_path}/b.jar"}
    shutil.rmtree(tmp_path)
    os.makedirs(tmp_path)
    assert jars.session_settings([]) == {}


@pytest.mark.fast
def test_coordinator_errors_are_retried_and_others_are_not() -> None:
    """A fresh broker answers NOT_COORDINATOR while it creates its offsets topic; librdkafka does
    not flag that retriable where a consumer call returns it, so the sink names it itself."""
    from headrace.connectors.kafka_sink import retriable

    def error(code: int) -> Exception:
        return kafka.KafkaException(kafka.KafkaError(code))

    assert retriable(error(kafka.KafkaError.NOT_COORDINATOR))
    assert retriable(error(kafka.KafkaError.COORDINATOR_LOAD_IN_PROGRESS))
    assert not retriable(error(kafka.KafkaError.TOPIC_AUTHORIZATION_FAILED))
    assert not retriable(ValueError("not Kafka's"))


def test_a_fenced_producer_is_replaced_and_the_batch_written_once(spark: Any, broker: str) -> None:
    """A producer Kafka fenced (its coordinator bumped the epoch, as when the coordinator moves
    off a killed broker) is replaced by a new one, and the batch goes in once."""
    sink_topic = new_topic(1)
    sink = hr.sinks.Kafka(sink_topic, SERVERS, key="user").bind(f"out/fenced@{uuid.uuid4()}")
    rows = spark.createDataFrame([("u1", 1), ("u2", 2)], "user string, order_id long")
    sink.prepare("")
    sink.write_batch(rows, 0)
    newer = kafka.Producer({"bootstrap.servers": SERVERS, "transactional.id": transactional_id(sink.name)})
    newer.init_transactions(30)  # fences the sink's producer
    sink.write_batch(rows.selectExpr("user", "order_id + 10 AS order_id"), 1)
    sink.write_batch(rows, 1)  # a replay of a committed batch writes nothing
    sink.close()
    assert sorted((key, value["order_id"]) for key, value in consume(sink_topic)) == [
        ("u1", 1), ("u1", 11), ("u2", 2), ("u2", 12)]


# -- one source, several sinks and the dead letters ---------------------------------------------

def _epoch_ms(text: str) -> int:
    import datetime
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)


def test_a_window_to_postgres_and_kafka_beside_the_dead_letters_writes_each_window_once_and_drains(
        spark: Any, broker: str, pg: Any, tmp_path: Path) -> None:
    """The issue's pipeline: a keyed one-minute window into PostgreSQL and (transactions) into
    Kafka, and the source's dead letters into PostgreSQL. Each sink gets every window exactly
    once, the window keeps one state, and input_rows counts each record once (the query scans
    the source once for the window and once for the dead letters). Drained, it reads the records
    produced since and fires the windows left open, the last record's included, each once."""
    import datetime

    from conftest import PG_DSN

    start = 1_700_000_040_000  # a minute boundary
    events = [(f"u{i % 5}", start + i * 1000) for i in range(300)]
    def iso(ms: int) -> str:
        return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    records: list[tuple[Any, Any, int]] = [(None, {"user": u, "event_time": iso(t)}, i % 2)
                                           for i, (u, t) in enumerate(events)]
    records.insert(50, (None, b"not json", 0))
    records.insert(170, (None, b'{"user": 1, "event_time": "later"}', 1))
    records.append((None, {"user": "~final", "event_time": iso(start + 3_600_000)}, 0))  # closes the windows
    source, sink, tag = new_topic(), new_topic(partitions=1), uuid.uuid4().hex[:8]
    produce(source, records)
    windows, dead = f"windows_{tag}", f"dead_{tag}"

    p = hr.Pipeline(f"fan_out_{tag}")
    clicks = p.source("clicks", hr.sources.Kafka(source, schema="user string, event_time timestamp",
                                                 max_records_per_batch=100),
                      event_time="event_time", max_out_of_orderness="1s")
    counts = clicks.key_by("user").window(hr.Tumbling("1m")).count().select("user", "window_start", "count")
    counts.sink("to_postgres", hr.sinks.Postgres(windows, dsn=PG_DSN))
    counts.sink("to_kafka", hr.sinks.Kafka(sink, key="user"))
    p.dead_letters().sink("dead", hr.sinks.Postgres(dead, dsn=PG_DSN))

    result = run_until_idle(p, str(tmp_path / "state"))

    expected = sorted(Counter((u, t - t % 60_000) for u, t in events).items())
    in_postgres = pg.execute(f'SELECT "user", (extract(epoch FROM window_start) * 1000)::bigint, count '
                             f"FROM {windows}").fetchall()
    assert sorted(((u, w), c) for u, w, c in in_postgres) == expected
    in_kafka = [value for _key, value in consume(sink)]
    assert sorted(((v["user"], _epoch_ms(v["window_start"])), v["count"]) for v in in_kafka) == expected
    assert sorted(r[0] for r in pg.execute(f"SELECT raw FROM {dead}").fetchall()) == [
        "not json", '{"user": 1, "event_time": "later"}']
    assert result.input_rows == len(records)
    assert result.dead_letters == 2
    # one state per window and key: the query does not plan the window once per sink
    last = summarise(result.progress[-1])
    assert last["state_rows"] <= len({u for u, _ in events}) + 1

    # drained (headrace run --drain): the records produced since are read, then the last windows fire, once each
    later = [("u1", start + 3_600_000 + 5_000), ("u2", start + 3_600_000 + 70_000)]
    produce(source, [(None, {"user": u, "event_time": iso(t)}, 0) for u, t in later])
    drained = hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet", handle_signals=False, drain=True)
    assert drained.stopped_by.startswith("drained: every window fired, ended for good at batch ")
    final = sorted(Counter((u, t - t % 60_000) for u, t in [*events, ("~final", start + 3_600_000), *later]).items())
    in_postgres = pg.execute(f'SELECT "user", (extract(epoch FROM window_start) * 1000)::bigint, count '
                             f"FROM {windows}").fetchall()
    assert sorted(((u, w), c) for u, w, c in in_postgres) == final
    assert sorted(((v["user"], _epoch_ms(v["window_start"])), v["count"]) for _k, v in consume(sink)) == final
