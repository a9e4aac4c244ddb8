"""The Redis Streams source against a real Redis (scripts/redis.sh, 127.0.0.1:6379): records of
several streams exactly once, event-time windows on entry ids, dead letters, stop-and-restart and
SIGKILL-and-restart of a driver, and the errors a user can cause. Expected outputs are computed
here in plain Python from the entries the test added; every test uses streams of its own."""

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
from headrace.connectors.spark_readers.redis_streams import RedisStreamReader
from headrace.errors import PlanError, SourceError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink

redis = pytest.importorskip("redis")

URL = "redis://127.0.0.1:6379/0"
ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "redis_driver.py"
SCHEMA = "order_id long, user string, amount long"
BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _answers() -> bool:
    try:
        return bool(redis.Redis.from_url(URL, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A client of the running Redis (started with scripts/redis.sh when none answers), or a skip
    saying why; the streams the tests made are deleted at the end."""
    if not _answers():
        try:
            started = subprocess.run(["bash", str(ROOT / "scripts" / "redis.sh"), "start"], capture_output=True,
                                     text=True, timeout=300)
            why = started.stderr.strip()[-500:] or f"scripts/redis.sh start exited {started.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"scripts/redis.sh start: {exc}"
        service_or_skip("Redis", _answers(), why)
    client = redis.Redis.from_url(URL)
    yield client
    if MADE:
        client.delete(*MADE)
    client.close()


MADE: list[str] = []  # the streams the tests made


def new_stream(server: Any) -> str:
    name = f"hr_test_{uuid.uuid4().hex[:10]}"
    MADE.append(name)
    return name


def add(server: Any, stream: str, records: list[Any], ids: list[str] | None = None) -> list[str]:
    """Each record as an entry: a dict as its JSON text in the field ``data``, bytes as such,
    ``("fields", {...})`` as the entry's own fields. Returns the entry ids."""
    pipe = server.pipeline(transaction=False)
    for k, record in enumerate(records):
        if isinstance(record, tuple):
            fields = record[1]
        else:
            fields = {"data": json.dumps(record) if isinstance(record, dict) else record}
        pipe.xadd(stream, fields, id=ids[k] if ids else "*")
    return [i.decode() for i in pipe.execute()]


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


def test_several_streams_arrive_exactly_once_with_their_metadata(spark: Any, server: Any, tmp_path: Path) -> None:
    streams = [new_stream(server) for _ in range(3)]
    sizes = [700, 250, 50]
    added: dict[tuple[str, str], dict[str, Any]] = {}
    for stream, size in zip(streams, sizes):
        records = orders(size)
        added.update(((stream, i), r) for i, r in zip(add(server, stream, records), records))
    p = hr.Pipeline("redis_orders")
    out = TestSink()
    p.source("orders", hr.sources.Redis(streams, schema=SCHEMA, max_records_per_batch=300,
                                        partition_records=200)).sink("out", out)

    result = run_until(p, str(tmp_path / "state"), lambda: len(out.rows()) >= len(added))

    rows = out.rows()
    assert len(rows) == len(added) == result.input_rows
    got = {(r["redis_stream"], r["redis_id"]): r for r in rows}
    assert got.keys() == added.keys()
    for (stream, entry_id), row in got.items():
        assert {k: row[k] for k in ("order_id", "user", "amount")} == added[(stream, entry_id)]
        assert int(row["redis_time"].timestamp() * 1000) == int(entry_id.split("-")[0])
    assert list(rows[0]) == ["order_id", "user", "amount", "redis_stream", "redis_id", "redis_time"]
    per_batch = [report["numInputRows"] for report in result.progress if report["numInputRows"]]
    assert max(per_batch) == 300 and len(per_batch) == 4, per_batch  # capped, shared between the streams


@pytest.mark.fast
def test_latest_start_and_a_replay_read_exactly_the_planned_entries(server: Any, tmp_path: Path) -> None:
    """The reader as Spark drives it, without Spark: a batch planned once and replayed by another
    process (no cache) after more entries arrived reads the same entries; the stop file holds it."""
    stream = new_stream(server)
    add(server, stream, orders(50))
    source = hr.sources.Redis(stream, schema=SCHEMA, start="latest", partition_records=40)
    options = {**source.options(), "hr_source": "orders", "hr_run_dir": str(tmp_path)}
    reader = RedisStreamReader(options)
    start = reader.initialOffset()
    ids = add(server, stream, orders(100, first=50))
    assert reader.initialOffset() == start  # Spark asks twice: "latest" does not move
    end = reader.latestOffset(start)
    assert end == {stream: ids[-1]}
    planned = [p.value for p in reader.partitions(start, end)]
    assert [(lo, hi) for _, lo, hi in planned] == [(start[stream], ids[39]), (ids[39], ids[79]), (ids[79], ids[-1])]
    add(server, stream, orders(30, first=150))
    replay = RedisStreamReader(options).partitions(start, end)
    assert [p.value for p in replay] == planned
    rows = [row for part in replay for batch in reader.read(part) for row in batch.to_pylist()]
    assert [r["order_id"] for r in rows] == list(range(50, 150))
    (tmp_path / "stop").touch()
    assert reader.latestOffset(end) == end


def per_window(events: list[tuple[str, int]], size_ms: int) -> list[tuple[str, int, int]]:
    """(user, window start ms, count) of each tumbling window, from (user, event time ms)."""
    counts = Counter((user, at - at % size_ms) for user, at in events)
    return sorted((user, start, n) for (user, start), n in counts.items())


def test_keyed_window_on_entry_times_counts_what_python_counts(spark: Any, server: Any, tmp_path: Path) -> None:
    streams = [new_stream(server) for _ in range(2)]
    rng = random.Random(3)
    events: list[tuple[str, int]] = []
    for k, stream in enumerate(streams):  # entry ids 10 ms apart, the streams interleaved
        times = [BASE_MS + 20 * i + 10 * k for i in range(600)]
        users = [f"u{rng.randrange(4)}" for _ in times]
        add(server, stream, [{"user": u} for u in users], ids=[f"{t}-0" for t in times])
        events.extend(zip(users, times))
    expected = per_window(events, 1000)
    add(server, streams[0], [{"user": "closing"}], ids=[f"{BASE_MS + 3_600_000}-0"])  # fires every window
    p = hr.Pipeline("redis_windows")
    out = TestSink()
    clicks = p.source("clicks", hr.sources.Redis(streams, schema="user string", max_records_per_batch=500),
                      event_time="redis_time", max_out_of_orderness="1min")
    clicks.key_by("user").window(hr.Tumbling("1s")).count().sink("out", out)

    run_until(p, str(tmp_path / "state"), lambda: len(out.rows()) >= len(expected))

    got = sorted((r["user"], int(r["window_start"].timestamp() * 1000), r["count"]) for r in out.rows())
    assert got == expected


def test_bad_entries_go_to_dead_letters_with_stream_and_id(spark: Any, server: Any, tmp_path: Path) -> None:
    json_stream, fields_stream = new_stream(server), new_stream(server)
    good = orders(20)
    bad = [b"not json", b'{"order_id": "x", "user": "a", "amount": 1}', b"[1, 2]", ("fields", {"other": "x"})]
    json_ids = add(server, json_stream, good[:10] + bad + good[10:])
    fields = [("fields", {k: str(v) for k, v in o.items()}) for o in good]
    fields_bad = [("fields", {"order_id": "7.5", "user": "b"}), ("fields", {"order_id": b"\xff"})]
    fields_ids = add(server, fields_stream, fields[:5] + fields_bad + fields[5:])
    p = hr.Pipeline("redis_dead")
    out, dead = TestSink(), TestSink()
    from_json = p.source("from_json", hr.sources.Redis(json_stream, schema=SCHEMA))
    from_fields = p.source("from_fields", hr.sources.Redis(fields_stream, schema=SCHEMA, format="fields"))
    from_json.union(from_fields).sink("out", out)
    p.dead_letters().sink("dead", dead)
    total_dead = len(bad) + len(fields_bad)

    result = run_until(p, str(tmp_path / "state"), lambda: len(dead.rows()) >= total_dead and
                       len(out.rows()) >= 2 * len(good))

    assert sorted(r["order_id"] for r in out.rows()) == sorted(2 * [o["order_id"] for o in good])
    assert [r["user"] for r in out.rows() if r["redis_stream"] == fields_stream][:3] == ["u0", "u1", "u2"]
    found = {r["position"]: r for r in dead.rows()}
    expected = {f"{json_stream}/{json_ids[10 + k]}" for k in range(len(bad))} | \
               {f"{fields_stream}/{fields_ids[5 + k]}" for k in range(len(fields_bad))}
    assert found.keys() == expected
    errors = [found[f"{json_stream}/{json_ids[10 + k]}"] for k in range(len(bad))]
    assert [e["raw"] for e in errors[:3]] == ["not json", '{"order_id": "x", "user": "a", "amount": 1}', "[1, 2]"]
    assert "invalid JSON" in errors[0]["error"] and "field 'order_id'" in errors[1]["error"]
    assert "expected a JSON object" in errors[2]["error"] and "no field 'data'" in errors[3]["error"]
    assert "field 'order_id'" in found[f"{fields_stream}/{fields_ids[5]}"]["error"]
    assert "invalid UTF-8" in found[f"{fields_stream}/{fields_ids[6]}"]["error"]
    assert {r["source"] for r in dead.rows()} == {"from_json", "from_fields"}
    assert result.dead_letters == total_dead


def per_user(records: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return sorted(Counter(r["user"] for r in records).items())


def test_stop_and_restart_gives_the_uninterrupted_output(spark: Any, server: Any, tmp_path: Path) -> None:
    streams = [new_stream(server) for _ in range(2)]
    first, later = orders(1200), orders(300, first=1200)
    for k, stream in enumerate(streams):
        add(server, stream, first[k::2])
    state = str(tmp_path / "state")

    def pipeline(out: TestSink) -> hr.Pipeline:
        p = hr.Pipeline("redis_restart")
        (p.source("orders", hr.sources.Redis(streams, schema=SCHEMA, max_records_per_batch=200))
          .select("order_id", "user", "amount", "redis_stream", "redis_id").sink("out", out))
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
    for k, stream in enumerate(streams):
        add(server, stream, later[k::2])
    out2 = TestSink()
    run_until(pipeline(out2), state, lambda: len(out1.rows()) + len(out2.rows()) >= len(first) + len(later))

    rows = out1.rows() + out2.rows()
    assert sorted(r["order_id"] for r in rows) == list(range(len(first) + len(later)))  # none twice, none lost
    assert len({(r["redis_stream"], r["redis_id"]) for r in rows}) == len(rows)
    assert per_user(rows) == per_user(first + later)


def test_sigkill_of_the_driver_then_restart_gives_the_uninterrupted_output(server: Any, tmp_path: Path) -> None:
    streams = [new_stream(server) for _ in range(2)]
    records = orders(3000)
    ids = {}
    for k, stream in enumerate(streams):
        ids.update(zip(((stream, i) for i in add(server, stream, records[k::2])), records[k::2]))
    args = {"name": "redis_killed", "streams": streams, "url": URL, "state_dir": str(tmp_path / "state"),
            "out": str(tmp_path / "out"), "max_records_per_batch": 300}
    run = KilledRun(DRIVER, args, tmp_path / "driver.log")
    run.kill_after(2)
    started = time.time()
    assert len(run.written()) < len(records), "the driver should have been killed mid-stream"
    print(f"killed after {run.committed()} batches; {len(run.written())} records written", flush=True)
    second = Driver(DRIVER, args, tmp_path / "driver.log")
    try:
        second.wait_for("every record written", lambda: len(run.written()) >= len(records))
        print(f"restarted: every record written {time.time() - started:.1f} s after the kill", flush=True)
        second.stop()
    finally:
        second.kill()

    got = Counter((r["redis_stream"], r["redis_id"], r["order_id"], r["user"], r["amount"]) for r in run.written())
    expected = Counter((s, i, r["order_id"], r["user"], r["amount"]) for (s, i), r in ids.items())
    assert got == expected  # each entry exactly once


def test_bad_arguments_and_an_unreachable_server_say_what_is_wrong(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"Redis\(s\): unknown format 'xml'; use one of json, fields"):
        hr.sources.Redis("s", schema=SCHEMA, format="xml")
    with pytest.raises(PlanError, match=r"give at least one stream name"):
        hr.sources.Redis([], schema=SCHEMA)
    with pytest.raises(PlanError, match=r"start='middle' is not one of earliest, latest"):
        hr.sources.Redis("s", schema=SCHEMA, start="middle")
    with pytest.raises(PlanError, match=r"max_records_per_batch must be at least 1, got 0"):
        hr.sources.Redis("s", schema=SCHEMA, max_records_per_batch=0)
    with pytest.raises(PlanError, match=r"redis_id clash with the source's own columns"):
        hr.sources.Redis("s", schema="redis_id string")
    p = hr.Pipeline("redis_nowhere")
    p.source("orders", hr.sources.Redis("s", schema=SCHEMA, url="redis://127.0.0.1:1/0")).sink("out", TestSink())
    with pytest.raises(SourceError, match=r"source 'orders': Redis at redis://127.0.0.1:1/0: cannot connect"):
        PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
