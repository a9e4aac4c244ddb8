"""The NATS JetStream source and sink against a real nats-server (scripts/nats.sh, 127.0.0.1:4222):
records exactly once with their metadata, subject filters, dead letters, stop-and-restart and
SIGKILL-and-restart of a driver, a replayed sink batch leaving no duplicate, and the errors a user
can cause. Expected outputs are computed here in plain Python from the messages the test published;
every test uses streams of its own."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip
from driver_process import KilledRun

import headrace as hr
from headrace.connectors.nats_jetstream import COMMITS_BUCKET, commit_key
from headrace.connectors.spark_readers.nats_jetstream import NatsStreamReader
from headrace.errors import PlanError, SinkError, SourceError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

nats = pytest.importorskip("nats")

URL = "nats://127.0.0.1:4222"
ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "nats_driver.py"
SCHEMA = "order_id long, user string, amount long"
MADE: list[str] = []  # the streams the tests made


def _answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 4222), timeout=2) as conn:
            return b'"jetstream":true' in conn.recv(4096)
    except OSError:
        return False


def js_run(action: Callable[[Any], Any]) -> Any:
    """``await action(jetstream context)`` on a connection of its own."""
    async def main() -> Any:
        nc = await nats.connect(URL)
        try:
            return await action(nc.jetstream())
        finally:
            await nc.close()
    return asyncio.run(main())


@pytest.fixture(scope="module")
def server() -> Iterator[None]:
    """A running nats-server with JetStream (started with scripts/nats.sh when none answers), or a
    skip saying why; the streams the tests made are deleted at the end."""
    if not _answers():
        try:
            started = subprocess.run(["bash", str(ROOT / "scripts" / "nats.sh"), "start"], capture_output=True,
                                     text=True, timeout=300)
            why = started.stderr.strip()[-500:] or f"scripts/nats.sh start exited {started.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"scripts/nats.sh start: {exc}"
        service_or_skip("NATS", _answers(), why)
    yield

    async def clean(js: Any) -> None:
        for name in MADE:
            try:
                await js.delete_stream(name)
            except nats.js.errors.NotFoundError:
                pass
    js_run(clean)


def new_stream(duplicate_window: float = 120.0) -> str:
    """A stream of its own, taking the subjects ``<name>.>``."""
    name = f"hr_test_{uuid.uuid4().hex[:10]}"
    MADE.append(name)
    js_run(lambda js: js.add_stream(name=name, subjects=[f"{name}.>"], duplicate_window=duplicate_window))
    return name


def publish(subject: str | list[str], records: list[Any]) -> list[int]:
    """Each record (a dict as its JSON text, bytes as such) to ``subject`` (or the subject of the
    same index); returns the stream sequences."""
    subjects = subject if isinstance(subject, list) else [subject] * len(records)

    async def send(js: Any) -> list[int]:
        acks = [await js.publish_async(s, json.dumps(r).encode() if isinstance(r, dict) else r)
                for s, r in zip(subjects, records)]
        return [(await ack).seq for ack in acks]
    return js_run(send)


def stored(stream: str) -> list[tuple[str, dict[str, Any], str]]:
    """(subject, JSON payload, Nats-Msg-Id) of every message of ``stream``, in order."""
    async def read(js: Any) -> list[tuple[str, dict[str, Any], str]]:
        last = (await js.stream_info(stream)).state.last_seq
        found = []
        for seq in range(1, last + 1):
            msg = await js.get_msg(stream, seq)
            found.append((msg.subject, json.loads(msg.data), (msg.headers or {}).get("Nats-Msg-Id")))
        return found
    return js_run(read)


def orders(count: int, first: int = 0) -> list[dict[str, Any]]:
    return [{"order_id": i, "user": f"u{i % 7}", "amount": i % 5} for i in range(first, first + count)]


def run_until(pipeline: hr.Pipeline, state_dir: str, done: Callable[[], bool], timeout: float = 120) -> Any:
    """Run ``pipeline`` until ``done()`` holds (checked between polls), then stop it between batches."""
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


def test_records_arrive_exactly_once_with_their_metadata(spark: Any, server: None, tmp_path: Path) -> None:
    stream = new_stream()
    records = orders(700)
    subjects = [f"{stream}.{'eu' if r['order_id'] % 3 else 'us'}" for r in records]
    before = datetime.now(UTC)
    seqs = publish(subjects, records)
    after = datetime.now(UTC)
    p = hr.Pipeline("nats_orders")
    out = TestSink()
    p.source("orders", hr.sources.Nats(stream, schema=SCHEMA, max_records_per_batch=300,
                                       partition_records=200)).sink("out", out)

    result = run_until(p, str(tmp_path / "state"), lambda: len(out.rows()) >= len(records))

    rows = out.rows()
    assert len(rows) == len(records) == result.input_rows
    assert sorted(r["nats_seq"] for r in rows) == seqs == list(range(1, 701))
    for row in rows:
        k = row["nats_seq"] - 1
        assert {c: row[c] for c in ("order_id", "user", "amount")} == records[k]
        assert row["nats_subject"] == subjects[k]
        assert before.timestamp() - 0.001 <= row["nats_time"].timestamp() <= after.timestamp()
    assert list(rows[0]) == ["order_id", "user", "amount", "nats_subject", "nats_seq", "nats_time"]
    per_batch = [report["numInputRows"] for report in result.progress if report["numInputRows"]]
    assert per_batch == [300, 300, 100]


@pytest.mark.fast
def test_subject_filters_latest_start_and_a_replay_read_the_planned_messages(server: None, tmp_path: Path) -> None:
    """The reader as Spark drives it, without Spark: a batch planned once and replayed by another
    reader after more messages arrived reads the same messages; the filters; the stop file."""
    stream = new_stream()
    publish(f"{stream}.a", orders(20))
    records = orders(90, first=20)
    subjects = [f"{stream}.{'abc'[r['order_id'] % 3]}" for r in records]

    def reader(subjects: Any, **more: Any) -> NatsStreamReader:
        source = hr.sources.Nats(stream, schema=SCHEMA, subjects=subjects, start="latest", partition_records=40,
                                 **more)
        return NatsStreamReader({**source.options(), "hr_source": "orders", "hr_run_dir": str(tmp_path)})

    def read(one: NatsStreamReader, start: dict, end: dict) -> list[dict[str, Any]]:
        return [row for part in one.partitions(start, end) for batch in one.read(part) for row in batch.to_pylist()]

    everything = reader(None)
    start = everything.initialOffset()
    assert start == {"seq": 20}
    publish(subjects, records)
    assert everything.initialOffset() == start  # Spark asks twice: "latest" does not move
    end = everything.latestOffset(start)
    assert end == {"seq": 110}
    assert [p.value for p in everything.partitions(start, end)] == [(20, 60), (60, 100), (100, 110)]
    publish(f"{stream}.b", orders(30, first=110))
    rows = read(reader(None), start, end)  # a replay in another reader reads what was planned
    assert [r["order_id"] for r in rows] == list(range(20, 110))
    only_b = read(reader(f"{stream}.b"), start, end)
    assert [r["order_id"] for r in only_b] == [i for i in range(20, 110) if i % 3 == 1]
    assert {r["nats_subject"] for r in only_b} == {f"{stream}.b"}
    a_and_c = read(reader([f"{stream}.a", f"{stream}.c"]), start, end)
    assert [r["order_id"] for r in a_and_c] == [i for i in range(20, 110) if i % 3 != 1]
    assert read(reader(f"{stream}.*"), {"seq": 105}, {"seq": 120})[-1]["order_id"] == 119
    capped = reader(None, max_records_per_batch=50)
    assert capped.latestOffset(end) == {"seq": 140}
    (tmp_path / "stop").touch()
    assert capped.latestOffset(end) == end


def test_bad_messages_go_to_dead_letters_with_stream_and_sequence(spark: Any, server: None, tmp_path: Path) -> None:
    json_stream, raw_stream = new_stream(), new_stream()
    good = orders(20)
    bad = [b"not json", b'{"order_id": "x", "user": "a", "amount": 1}', b"[1, 2]", b""]
    json_seqs = publish(f"{json_stream}.orders", good[:10] + bad + good[10:])
    raw_seqs = publish(f"{raw_stream}.lines", [b"one", b"\xff\xfe", b"three"])
    p = hr.Pipeline("nats_dead")
    out, lines, dead = TestSink(), TestSink(), TestSink()
    p.source("from_json", hr.sources.Nats(json_stream, schema=SCHEMA)).sink("out", out)
    p.source("from_raw", hr.sources.Nats(raw_stream, schema="line string", format="raw")).sink("lines", lines)
    p.dead_letters().sink("dead", dead)
    total_dead = len(bad) + 1

    result = run_until(p, str(tmp_path / "state"), lambda: len(dead.rows()) >= total_dead and
                       len(out.rows()) >= len(good) and len(lines.rows()) >= 2)

    assert sorted(r["order_id"] for r in out.rows()) == [o["order_id"] for o in good]
    assert [r["line"] for r in lines.rows()] == ["one", "three"]
    found = {r["position"]: r for r in dead.rows()}
    assert found.keys() == {f"{json_stream}/{json_seqs[10 + k]}" for k in range(len(bad))} | \
        {f"{raw_stream}/{raw_seqs[1]}"}
    errors = [found[f"{json_stream}/{json_seqs[10 + k]}"] for k in range(len(bad))]
    assert [e["raw"] for e in errors] == ["not json", '{"order_id": "x", "user": "a", "amount": 1}', "[1, 2]", ""]
    assert "invalid JSON" in errors[0]["error"] and "field 'order_id'" in errors[1]["error"]
    assert "expected a JSON object" in errors[2]["error"] and "invalid JSON" in errors[3]["error"]
    assert "invalid UTF-8" in found[f"{raw_stream}/{raw_seqs[1]}"]["error"]
    assert {r["source"] for r in dead.rows()} == {"from_json", "from_raw"}
    assert result.dead_letters == total_dead


def per_user(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted(Counter(r["user"] for r in records).items())


def test_stop_and_restart_gives_the_uninterrupted_output(spark: Any, server: None, tmp_path: Path) -> None:
    stream = new_stream()
    first, later = orders(1200), orders(300, first=1200)
    publish(f"{stream}.orders", first)
    state = str(tmp_path / "state")

    def pipeline(out: TestSink) -> hr.Pipeline:
        p = hr.Pipeline("nats_restart")
        (p.source("orders", hr.sources.Nats(stream, schema=SCHEMA, max_records_per_batch=200))
          .select("order_id", "user", "amount", "nats_seq").sink("out", out))
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
    publish(f"{stream}.orders", later)
    out2 = TestSink()
    run_until(pipeline(out2), state, lambda: len(out1.rows()) + len(out2.rows()) >= len(first) + len(later))

    rows = out1.rows() + out2.rows()
    assert sorted(r["order_id"] for r in rows) == list(range(len(first) + len(later)))  # none twice, none lost
    assert sorted(r["nats_seq"] for r in rows) == list(range(1, len(rows) + 1))
    assert per_user(rows) == per_user(first + later)


def test_sigkill_of_the_driver_then_restart_gives_the_uninterrupted_output(server: None, tmp_path: Path) -> None:
    stream = new_stream()
    records = orders(3000)
    subjects = [f"{stream}.{'eu' if r['order_id'] % 2 else 'us'}" for r in records]
    seqs = publish(subjects, records)
    out = tmp_path / "out"
    args = {"name": "nats_killed", "stream": stream, "url": URL, "state_dir": str(tmp_path / "state"),
            "out": str(out), "max_records_per_batch": 300}
    run = KilledRun(DRIVER, args, tmp_path / "driver.log")
    run.kill_after(2)
    assert len(run.written()) < len(records), "the driver should have been killed mid-stream"
    run.restart_until("every record written", lambda: len(run.written()) >= len(records))

    got = Counter((r["nats_subject"], r["nats_seq"], r["order_id"], r["user"], r["amount"]) for r in run.written())
    expected = Counter((s, q, r["order_id"], r["user"], r["amount"]) for s, q, r in zip(subjects, seqs, records))
    assert got == expected  # each message exactly once


def drop_last_commit(state: Path) -> None:
    """Spark replays a batch whose commit it did not record (a driver killed after the sink
    committed): remove the last commit record, as such a kill leaves the checkpoint."""
    commits = sorted(state.glob("**/checkpoint/commits/[0-9]*"), key=lambda f: int(f.name))
    commits[-1].unlink()


def test_a_replayed_sink_batch_leaves_no_duplicate_in_the_stream(spark: Any, server: None, tmp_path: Path) -> None:
    stream = new_stream()
    batches = [orders(30), orders(30, first=30), orders(20, first=60) + orders(2, first=60)]  # equal rows too
    state = tmp_path / "state"

    def pipeline() -> hr.Pipeline:
        p = hr.Pipeline("nats_sink")
        (p.source("orders", TestSource(batches, schema=SCHEMA, flush=False))
         .sink("to_nats", hr.sinks.Nats(f"{stream}.orders", key="user")))
        return p

    expected = sorted(json.dumps(r, sort_keys=True) for batch in batches for r in batch)

    def check() -> list[tuple[str, dict[str, Any], str]]:
        messages = stored(stream)
        assert sorted(json.dumps(m[1], sort_keys=True) for m in messages) == expected
        assert all(subject == f"{stream}.orders.{m['user']}" for subject, m, _ in messages)
        assert len({msg_id for _, _, msg_id in messages}) == len(messages)
        return messages

    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    first = check()
    assert all(msg_id.startswith("to_nats/nats_sink@") for _, _, msg_id in first)
    assert [m["order_id"] for _, m, _ in first][:60] == list(range(60))  # published in the batch's order
    # The last batch replayed after its record in the commits bucket: skipped.
    drop_last_commit(state)
    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    assert check() == first
    # A crash between the messages and the record: published again, dropped by JetStream as duplicates.
    identity = "to_nats/nats_sink@" + first[0][2].split("@", 1)[1].split("/", 1)[0]

    async def recorded(js: Any) -> bytes:
        return (await (await js.key_value(COMMITS_BUCKET)).get(commit_key(identity))).value

    async def forget(js: Any) -> None:
        await (await js.key_value(COMMITS_BUCKET)).put(commit_key(identity), b"1")
    assert js_run(recorded) == b"2"
    js_run(forget)
    drop_last_commit(state)
    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    assert js_run(recorded) == b"2"  # the batch was published again: JetStream dropped its messages
    assert check() == first


def test_bad_arguments_and_unreachable_servers_say_what_is_wrong(spark: Any, server: None, tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"Nats\(s\): unknown format 'xml'; use one of json, raw"):
        hr.sources.Nats("s", schema=SCHEMA, format="xml")
    with pytest.raises(PlanError, match=r"stream must be a JetStream stream name .* got 'a.b'"):
        hr.sources.Nats("a.b", schema=SCHEMA)
    with pytest.raises(PlanError, match=r"start='middle' is not one of earliest, latest"):
        hr.sources.Nats("s", schema=SCHEMA, start="middle")
    with pytest.raises(PlanError, match=r"max_records_per_batch must be at least 1, got 0"):
        hr.sources.Nats("s", schema=SCHEMA, max_records_per_batch=0)
    with pytest.raises(PlanError, match=r"nats_seq clash with the source's own columns"):
        hr.sources.Nats("s", schema="nats_seq long")
    with pytest.raises(PlanError, match=r"format='raw' puts the payload in one column"):
        hr.sources.Nats("s", schema=SCHEMA, format="raw")
    with pytest.raises(PlanError, match=r"'orders\.\.eu' is not a NATS subject filter"):
        hr.sources.Nats("s", schema=SCHEMA, subjects="orders..eu")
    with pytest.raises(PlanError, match=r"url 'http://x' is not a nats://"):
        hr.sources.Nats("s", schema=SCHEMA, url="http://x")
    with pytest.raises(PlanError, match=r"Nats sink: subject must be a NATS subject without wildcards"):
        hr.sinks.Nats("orders.*")

    def start(source: Any = None, sink: Any = None) -> None:
        p = hr.Pipeline("nats_nowhere")
        p.source("orders", source or TestSource([orders(1)], schema=SCHEMA)).sink("out", sink or TestSink())
        PipelineRun(p, state_dir=str(tmp_path / uuid.uuid4().hex), progress="quiet").start()

    with pytest.raises(SourceError, match=r"source 'orders': NATS at nats://127.0.0.1:1: cannot connect"):
        start(hr.sources.Nats("s", schema=SCHEMA, url="nats://127.0.0.1:1"))
    with pytest.raises(SourceError, match=r"source 'orders': NATS at nats://127.0.0.1:4222: no JetStream stream "
                                          r"named 'hr_test_missing'"):
        start(hr.sources.Nats("hr_test_missing", schema=SCHEMA))
    with pytest.raises(SinkError, match=r"sink 'out' \(.*\): NATS at nats://127.0.0.1:1: cannot connect"):
        start(sink=hr.sinks.Nats("orders", url="nats://127.0.0.1:1"))
    with pytest.raises(SinkError, match=r"sink 'out' .*: no JetStream stream takes the subject 'hr_nowhere.x'"):
        start(sink=hr.sinks.Nats("hr_nowhere.x"))
    short = new_stream(duplicate_window=10)
    with pytest.raises(SinkError, match=rf"the JetStream stream '{short}' drops duplicate messages within 10 s; "
                                        r"exactly-once needs a duplicate window of at least 120 s"):
        start(sink=hr.sinks.Nats(f"{short}.orders"))
    other = new_stream()
    with pytest.raises(SinkError, match=rf"the JetStream stream '{other}' does not take the subject "
                                        rf"'{short}.orders' \(the stream '{short}' does\)"):
        start(sink=hr.sinks.Nats(f"{short}.orders", stream=other))
    assert hr.sinks.Nats(f"{short}.orders", exactly_once=False).guarantee.value == "at-least-once"
