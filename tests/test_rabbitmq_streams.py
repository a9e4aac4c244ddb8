"""The RabbitMQ Streams source and sink against a real RabbitMQ with the stream plugin
(scripts/rabbitmq.sh, streams on 127.0.0.1:5552): messages exactly once with their offsets and
times, dead letters, stop-and-restart and SIGKILL-and-restart of a driver, a replayed sink batch
that adds no duplicate, and the errors a user can cause. Every test uses streams of its own."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip
from driver_process import KilledRun

import headrace as hr
from headrace.errors import PlanError, SinkError, SourceError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

pytest.importorskip("rstream")

from headrace.connectors.rabbitmq_streams import (  # noqa: E402 - after the skip
    BLOCK,
    publisher_reference,
    rabbitmq_close,
    rabbitmq_connect,
)
from headrace.connectors.spark_readers.rabbitmq_streams import RabbitMQStreamReader  # noqa: E402

URL = "rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f"
ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "rabbitmq_driver.py"
SCHEMA = "order_id long, user string, amount long"
MADE: list[str] = []  # the streams the tests made


async def _answers() -> bool:
    try:
        await rabbitmq_close(await rabbitmq_connect(URL, "headrace-test"))
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The stream URL of the running RabbitMQ (started with scripts/rabbitmq.sh when none answers),
    or a skip saying why; the streams the tests made are deleted at the end."""
    if not asyncio.run(_answers()):
        try:
            started = subprocess.run(["bash", str(ROOT / "scripts" / "rabbitmq.sh"), "start"], capture_output=True,
                                     text=True, timeout=600)
            why = started.stderr.strip()[-500:] or f"scripts/rabbitmq.sh start exited {started.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"scripts/rabbitmq.sh start: {exc}"
        service_or_skip("RabbitMQ", asyncio.run(_answers()), why)
    yield URL
    asyncio.run(_run(lambda client: _delete(client, MADE)))


async def _delete(client: Any, streams: list[str]) -> None:
    for stream in streams:
        try:
            await client.delete_stream(stream)
        except Exception:  # noqa: BLE001 - gone already
            pass


async def _run(work: Callable[[Any], Any]) -> Any:
    client = await rabbitmq_connect(URL, "headrace-test")
    try:
        return await work(client)
    finally:
        await rabbitmq_close(client)


def new_stream() -> str:
    name = f"hr_test_{uuid.uuid4().hex[:10]}"
    asyncio.run(_run(lambda client: client.create_stream(name)))
    MADE.append(name)
    return name


def publish(stream: str, records: list[Any], amqp: bool = True) -> None:
    """Each record as a message: a dict as its JSON text, bytes as they are; in an AMQP 1.0 data
    section (as most clients publish) or, with ``amqp=False``, as the bare payload."""
    from rstream import schema
    from rstream.amqp import AMQPMessage

    async def send(client: Any) -> None:
        confirmed: list[int] = []
        client.add_handler(schema.PublishConfirm, lambda frame: confirmed.extend(frame.publishing_ids))
        await client.declare_publisher(stream, "", 1)
        for first in range(0, len(records), 500):
            messages = []
            for k, record in enumerate(records[first:first + 500], start=first + 1):
                body = json.dumps(record).encode() if isinstance(record, dict) else record
                data = bytes(AMQPMessage(body=body)) if amqp else body
                messages.append(schema.Message(publishing_id=k, data=data, filter_value=None))
            await client.publish(messages, 1)
        deadline = time.time() + 60
        while len(confirmed) < len(records):
            assert time.time() < deadline, "RabbitMQ did not confirm the test's messages"
            await asyncio.sleep(0.01)
        await client.delete_publisher(1)

    asyncio.run(_run(send))


def read_all(stream: str, schema: str) -> list[dict[str, Any]]:
    """Every message of ``stream``, through the source's reader as Spark drives it."""
    source = hr.sources.RabbitMQ(stream, schema=schema, max_records_per_batch=None)
    reader = RabbitMQStreamReader({**source.options(), "hr_source": "check"})
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start)
        return [row for part in reader.partitions(start, end) for batch in reader.read(part)
                for row in batch.to_pylist()]
    finally:
        reader.stop()


def orders(count: int, first: int = 0) -> list[dict[str, Any]]:
    return [{"order_id": i, "user": f"u{i % 7}", "amount": i % 5} for i in range(first, first + count)]


def run_until(pipeline: hr.Pipeline, state_dir: str, done: Callable[[], bool], timeout: float = 120) -> Any:
    """Run ``pipeline`` until ``done()`` holds, then stop it between batches."""
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


def test_messages_arrive_exactly_once_with_offsets_and_times(spark: Any, server: str, tmp_path: Path) -> None:
    stream = new_stream()
    records = orders(700)
    publish(stream, records[:400])
    publish(stream, records[400:], amqp=False)  # bare JSON payloads too
    p = hr.Pipeline("rabbitmq_orders")
    out = TestSink()
    p.source("orders", hr.sources.RabbitMQ(stream, schema=SCHEMA, max_records_per_batch=300,
                                           partition_records=200)).sink("out", out)
    before = time.time()

    result = run_until(p, str(tmp_path / "state"), lambda: len(out.rows()) >= len(records))

    rows = sorted(out.rows(), key=lambda r: r["rabbitmq_offset"])
    assert len(rows) == len(records) == result.input_rows
    assert [{k: r[k] for k in ("order_id", "user", "amount")} for r in rows] == records
    assert [r["rabbitmq_offset"] for r in rows] == list(range(len(records)))
    assert all(before - 120 < r["rabbitmq_time"].timestamp() <= time.time() for r in rows)
    assert list(rows[0]) == ["order_id", "user", "amount", "rabbitmq_offset", "rabbitmq_time"]
    per_batch = [report["numInputRows"] for report in result.progress if report["numInputRows"]]
    assert per_batch == [300, 300, 100], per_batch  # capped


def test_start_positions_and_a_replay_read_exactly_the_planned_messages(server: str, tmp_path: Path) -> None:
    """The reader as Spark drives it, without Spark: "next" and "last" starts, a batch replayed by
    another reader after more messages arrived reads the same messages, the backlog, the stop file."""
    stream = new_stream()
    publish(stream, orders(50))
    publish(stream, orders(20, first=50))  # a chunk of its own: "last" starts there
    source = hr.sources.RabbitMQ(stream, schema=SCHEMA, start="next", max_records_per_batch=60,
                                 partition_records=25)
    options = {**source.options(), "hr_source": "orders", "hr_run_dir": str(tmp_path)}
    reader = RabbitMQStreamReader(options)
    last = RabbitMQStreamReader({**options, "start": "last"})
    try:
        start = reader.initialOffset()
        assert start == {"offset": 69} == reader.initialOffset()
        assert last.initialOffset() == {"offset": 49}
        publish(stream, orders(100, first=70))
        end = reader.latestOffset(start)
        assert end == {"offset": 129} and reader.reportLatestOffset() == {"backlog": 40, "unit": "records"}
        planned = [p.value for p in reader.partitions(start, end)]
        assert planned == [(69, 94), (94, 119), (119, 129)]
        publish(stream, orders(30, first=170))
        replay = RabbitMQStreamReader(options)
        rows = [row for part in replay.partitions(start, end) for batch in replay.read(part)
                for row in batch.to_pylist()]
        assert [r["order_id"] for r in rows] == list(range(70, 130))
        assert [r["rabbitmq_offset"] for r in rows] == list(range(70, 130))
        (tmp_path / "stop").touch()
        assert reader.latestOffset(end) == end
    finally:
        reader.stop()
        last.stop()


def test_bad_messages_go_to_dead_letters_with_stream_and_offset(spark: Any, server: str, tmp_path: Path) -> None:
    stream, raw_stream = new_stream(), new_stream()
    good = orders(20)
    bad = [b"not json", b'{"order_id": "x", "user": "a", "amount": 1}', b"[1, 2]"]
    publish(stream, good[:10] + bad + good[10:])
    publish(raw_stream, [b"hello", b"\xff\xfe", b"bye"], amqp=False)
    p = hr.Pipeline("rabbitmq_dead")
    out, texts, dead = TestSink(), TestSink(), TestSink()
    p.source("orders", hr.sources.RabbitMQ(stream, schema=SCHEMA)).sink("out", out)
    p.source("texts", hr.sources.RabbitMQ(raw_stream, schema="body string", format="raw")).sink("text_out", texts)
    p.dead_letters().sink("dead", dead)

    result = run_until(p, str(tmp_path / "state"), lambda: len(dead.rows()) >= 4 and len(out.rows()) >= 20
                       and len(texts.rows()) >= 2)

    assert sorted(r["order_id"] for r in out.rows()) == [o["order_id"] for o in good]
    assert sorted(r["body"] for r in texts.rows()) == ["bye", "hello"]
    found = {r["position"]: r for r in dead.rows()}
    assert found.keys() == {f"{stream}@10", f"{stream}@11", f"{stream}@12", f"{raw_stream}@1"}
    assert [found[f"{stream}@{k}"]["raw"] for k in (10, 11, 12)] == [b.decode() for b in bad]
    assert "invalid JSON" in found[f"{stream}@10"]["error"]
    assert "field 'order_id'" in found[f"{stream}@11"]["error"]
    assert "expected a JSON object" in found[f"{stream}@12"]["error"]
    assert "invalid UTF-8" in found[f"{raw_stream}@1"]["error"]
    assert {r["source"] for r in dead.rows()} == {"orders", "texts"}
    assert result.dead_letters == 4


def test_stop_and_restart_gives_the_uninterrupted_output(spark: Any, server: str, tmp_path: Path) -> None:
    stream = new_stream()
    first, later = orders(1200), orders(300, first=1200)
    publish(stream, first)
    state = str(tmp_path / "state")

    def pipeline(out: TestSink) -> hr.Pipeline:
        p = hr.Pipeline("rabbitmq_restart")
        (p.source("orders", hr.sources.RabbitMQ(stream, schema=SCHEMA, max_records_per_batch=200))
          .select("order_id", "user", "amount", "rabbitmq_offset").sink("out", out))
        return p

    out1 = TestSink()
    run = PipelineRun(pipeline(out1), state_dir=state, progress="quiet").start()
    deadline = time.time() + 120
    while len(run.query.recentProgress) < 2:  # the first batches committed, then a stop mid-stream
        assert time.time() < deadline and run.query.isActive, "no first batches within 120 s"
        time.sleep(0.05)
    run.request_stop("test")
    run.wait(until_exhausted=False)
    assert 0 < len(out1.rows()) < len(first), "the first run should have stopped mid-stream"
    publish(stream, later)
    out2 = TestSink()
    run_until(pipeline(out2), state, lambda: len(out1.rows()) + len(out2.rows()) >= len(first) + len(later))

    rows = out1.rows() + out2.rows()
    assert sorted(r["order_id"] for r in rows) == list(range(len(first) + len(later)))  # none twice, none lost
    assert sorted(r["rabbitmq_offset"] for r in rows) == list(range(len(first) + len(later)))


def test_sigkill_of_the_driver_then_restart_gives_the_uninterrupted_output(server: str, tmp_path: Path) -> None:
    stream = new_stream()
    records = orders(3000)
    publish(stream, records)
    out = tmp_path / "out"
    args = {"name": "rabbitmq_killed", "stream": stream, "url": URL, "state_dir": str(tmp_path / "state"),
            "out": str(out), "max_records_per_batch": 300}
    run = KilledRun(DRIVER, args, tmp_path / "driver.log")
    run.kill_after(2)
    assert len(run.written()) < len(records), "the driver should have been killed mid-stream"
    run.restart_until("every record written", lambda: len(run.written()) >= len(records))

    got = Counter((r["rabbitmq_offset"], r["order_id"], r["user"], r["amount"]) for r in run.written())
    expected = Counter((k, r["order_id"], r["user"], r["amount"]) for k, r in enumerate(records))
    assert got == expected  # each message exactly once


def test_sink_publishes_each_row_once_and_a_replayed_batch_adds_none(spark: Any, server: str, tmp_path: Path) -> None:
    stream, state = new_stream(), tmp_path / "state"
    batches = [orders(20), orders(20, first=20), orders(20, first=40)]
    expected = sorted(o["order_id"] for b in batches for o in b if o["amount"] > 0)

    def pipeline() -> hr.Pipeline:
        p = hr.Pipeline("rabbitmq_sink")
        # No flush batch: the last batch carries rows, so its replay would publish them again.
        (p.source("orders", TestSource(batches, schema=SCHEMA, flush=False))
          .filter(hr.col("amount") > 0).sink("to_rabbitmq", hr.sinks.RabbitMQ(stream, url=server, key="user")))
        return p

    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    published = read_all(stream, SCHEMA)
    assert sorted(r["order_id"] for r in published) == expected

    drop_last_commit(state)  # batch 2 is replayed
    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    assert read_all(stream, SCHEMA) == published


def drop_last_commit(state: Path) -> None:
    """Spark replays a batch whose commit it did not record (a driver killed after the sink
    committed): remove the last commit record, as such a kill leaves the checkpoint."""
    commits = sorted(state.glob("**/checkpoint/commits/[0-9]*"), key=lambda f: int(f.name))
    commits[-1].unlink()


def test_the_broker_drops_a_replayed_or_half_written_batch(spark: Any, server: str) -> None:
    """A bound sink written to directly, as the dispatcher does: a batch written twice (its
    ``committed`` ignored) lands once, and a batch whose first rows were published before a crash
    is completed, not repeated."""
    stream = new_stream()
    sink = hr.sinks.RabbitMQ(stream, url=server).bind(f"out/{stream}@t")
    assert sink.reference == publisher_reference(f"out/{stream}@t") == f"headrace/out/{stream}@t"
    df = spark.createDataFrame([(i, f"u{i % 3}", i % 4) for i in range(30)], SCHEMA)
    try:
        assert not sink.committed(0)
        sink.write_batch(df, 0)
        sink.write_batch(df, 0)  # a replay the broker drops
        assert sink.committed(0) and not sink.committed(1)
        later = spark.createDataFrame([(i, "z", 1) for i in range(30, 40)], SCHEMA)
        values = sorted(json.dumps({"order_id": i, "user": "z", "amount": 1}, separators=(",", ":"))
                        for i in range(30, 40))
        sink.publish(1, values, count=4)  # a crash after 4 of the batch's 10 rows
        assert not sink.committed(1)
        sink.write_batch(later, 1)
        assert sink.committed(1)
    finally:
        sink.close()
    rows = read_all(stream, SCHEMA)
    assert sorted(r["order_id"] for r in rows) == list(range(40))
    assert [r["order_id"] for r in rows[30:]] == sorted(range(30, 40), key=lambda i: values[i - 30])


def test_bad_arguments_and_an_unreachable_server_say_what_is_wrong(spark: Any, server: str, tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"RabbitMQ\(s\): unknown format 'xml'; use one of json, raw"):
        hr.sources.RabbitMQ("s", schema=SCHEMA, format="xml")
    with pytest.raises(PlanError, match=r"RabbitMQ\(\): stream must be a stream name, got ''"):
        hr.sources.RabbitMQ("", schema=SCHEMA)
    with pytest.raises(PlanError, match=r"start='middle' is not one of first, last, next"):
        hr.sources.RabbitMQ("s", schema=SCHEMA, start="middle")
    with pytest.raises(PlanError, match=r"max_records_per_batch must be at least 1, got 0"):
        hr.sources.RabbitMQ("s", schema=SCHEMA, max_records_per_batch=0)
    with pytest.raises(PlanError, match=r"rabbitmq_offset clash with the source's own columns"):
        hr.sources.RabbitMQ("s", schema="rabbitmq_offset long")
    with pytest.raises(PlanError, match=r"format='raw' puts the payload in one column"):
        hr.sources.RabbitMQ("s", schema=SCHEMA, format="raw")
    with pytest.raises(PlanError, match=r"url 'amqp://guest@h/' is not a rabbitmq-stream:// URL"):
        hr.sources.RabbitMQ("s", schema=SCHEMA, url="amqp://guest:secret@h/")
    with pytest.raises(PlanError, match=r"RabbitMQ sink for stream 's': key must be a column name, got 3"):
        hr.sinks.RabbitMQ("s", key=3)  # type: ignore[arg-type]
    nowhere = "rabbitmq-stream://guest:secret@127.0.0.1:1/%2f"
    p = hr.Pipeline("rabbitmq_nowhere")
    p.source("orders", hr.sources.RabbitMQ("s", schema=SCHEMA, url=nowhere)).sink("out", TestSink())
    with pytest.raises(SourceError, match=r"source 'orders': RabbitMQ at rabbitmq-stream://guest@127.0.0.1:1/%2f: "
                                          r"cannot connect") as caught:
        PipelineRun(p, state_dir=str(tmp_path / "a"), progress="quiet").start()
    assert "secret" not in str(caught.value)
    missing = f"hr_test_missing_{uuid.uuid4().hex[:6]}"
    p = hr.Pipeline("rabbitmq_missing")
    p.source("orders", hr.sources.RabbitMQ(missing, schema=SCHEMA, url=server)).sink("out", TestSink())
    with pytest.raises(SourceError, match=rf"source 'orders': .*no stream named '{missing}'; create it first"):
        PipelineRun(p, state_dir=str(tmp_path / "b"), progress="quiet").start()
    p = hr.Pipeline("rabbitmq_sink_missing")
    p.source("orders", TestSource([orders(2)], schema=SCHEMA)).sink("to_rabbitmq", hr.sinks.RabbitMQ(missing))
    with pytest.raises(SinkError, match=rf"sink 'to_rabbitmq' .*no stream named '{missing}'"):
        PipelineRun(p, state_dir=str(tmp_path / "c"), progress="quiet").start()
    sink = hr.sinks.RabbitMQ("s", url=nowhere).bind("to_rabbitmq/p@x", "app.py:3")
    with pytest.raises(SinkError, match=r"sink 'to_rabbitmq' \(app.py:3\): RabbitMQ at "
                                        r"rabbitmq-stream://guest@127.0.0.1:1/%2f: cannot query the publisher"):
        sink.committed(0)
    sink = hr.sinks.RabbitMQ(new_stream(), url=server).bind("big/p@x")
    try:
        with pytest.raises(SinkError, match=rf"sink 'big': batch 0 has {BLOCK + 1} rows; a RabbitMQ sink "
                                            rf"publishes at most {BLOCK} rows per batch"):
            sink.write_batch(spark.range(BLOCK + 1), 0)
    finally:
        sink.close()
