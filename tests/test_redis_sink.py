"""The Redis sink against a real Redis (scripts/redis.sh, 127.0.0.1:6379): stream entries and hash
upserts equal to what plain Python computes, a replayed batch skipped by its recorded batch id, a
keyed window upserted into hashes, and the errors a user can cause. Every test uses keys of its own."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip

import headrace as hr
from headrace.errors import PlanError, SinkError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSource

redis = pytest.importorskip("redis")

URL = "redis://127.0.0.1:6379/0"
ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "order_id long, user string, amount long"
ORDERS = [{"order_id": i, "user": f"u{i % 4}", "amount": i % 5} for i in range(60)]


def _answers() -> bool:
    try:
        return bool(redis.Redis.from_url(URL, socket_connect_timeout=1).ping())
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A client of the running Redis (started with scripts/redis.sh when none answers), or a skip
    saying why; the keys the tests made are deleted at the end."""
    if not _answers():
        try:
            started = subprocess.run(["bash", str(ROOT / "scripts" / "redis.sh"), "start"], capture_output=True,
                                     text=True, timeout=300)
            why = started.stderr.strip()[-500:] or f"scripts/redis.sh start exited {started.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"scripts/redis.sh start: {exc}"
        service_or_skip("Redis", _answers(), why)
    client = redis.Redis.from_url(URL, decode_responses=True)
    yield client
    for prefix in PREFIXES:
        keys = list(client.scan_iter(f"{prefix}*"))
        if keys:
            client.delete(*keys)
    client.close()


PREFIXES: list[str] = []  # every key a test made starts with one of these


def new_name(kind: str) -> str:
    name = f"hr_test_{kind}_{uuid.uuid4().hex[:10]}"
    PREFIXES.append(name)
    return name


def drop_last_commit(state: Path) -> None:
    """Spark replays a batch whose commit it did not record (a driver killed after the sink
    committed): remove the last commit record, as such a kill leaves the checkpoint."""
    commits = sorted(state.glob("**/checkpoint/commits/[0-9]*"), key=lambda f: int(f.name))
    commits[-1].unlink()


def sink_commits(server: Any, pipeline: str) -> dict[str, str]:
    """The batch ids recorded by the sinks of ``pipeline``, by identity."""
    keys = [k for k in server.scan_iter("headrace:sink_commits:*") if f"/{pipeline}@" in k]
    return {k: server.get(k) for k in keys}


def orders_pipeline(name: str, sink: hr.sinks.Redis, flush: bool = True) -> hr.Pipeline:
    p = hr.Pipeline(name)
    batches = [ORDERS[:20], ORDERS[20:40], ORDERS[40:]]
    (p.source("orders", TestSource(batches, schema=SCHEMA, flush=flush))
     .filter(hr.col("amount") > 0)
     .sink("to_redis", sink))
    return p


def test_stream_entries_equal_python_and_a_replayed_batch_adds_none(spark: Any, server: Any, tmp_path: Path) -> None:
    stream, state = new_name("stream"), tmp_path / "state"
    pipeline = f"redis_sink_{uuid.uuid4().hex[:8]}"
    expected = [o for o in ORDERS if o["amount"] > 0]
    # No flush batch: the last batch carries rows, so its replay would add them again.
    hr.run(orders_pipeline(pipeline, hr.sinks.Redis(stream=stream), flush=False), state_dir=str(state),
           progress="quiet")
    entries = server.xrange(stream)
    assert [json.loads(fields["data"]) for _, fields in entries] == expected  # in order, once each
    recorded = sink_commits(server, pipeline)
    assert list(recorded.values()) == ["2"] and list(recorded)[0].startswith("headrace:sink_commits:to_redis/")

    drop_last_commit(state)  # batch 2 is replayed: its id is recorded, so the sink skips it
    hr.run(orders_pipeline(pipeline, hr.sinks.Redis(stream=stream), flush=False), state_dir=str(state),
           progress="quiet")
    assert server.xrange(stream) == entries
    assert sink_commits(server, pipeline) == recorded


def test_fields_and_hashes_hold_each_column_as_text(spark: Any, server: Any) -> None:
    """A bound sink written to directly, as the dispatcher does: a batch written twice lands once,
    a hash ends as its key's last row (null columns removed), values as the module documents."""
    stream, prefix = new_name("fields"), new_name("hash")
    rows = [(1, "a", 2.5, True, datetime(2026, 1, 1, 12, 0, 1, tzinfo=UTC), [1, 2]),
            (2, None, None, False, None, None),
            (1, "b", None, None, datetime(2026, 1, 1, 12, 0, 2, 500_000, tzinfo=UTC), []),
            ]
    df = spark.createDataFrame(rows, "id long, name string, score double, ok boolean, at timestamp, tags array<int>")
    fields = hr.sinks.Redis(stream=stream, format="fields").bind(f"fields/{stream}@t")
    hashes = hr.sinks.Redis(key_prefix=prefix, key="id").bind(f"hashes/{prefix}@t")
    for sink in (fields, hashes):
        assert not sink.committed(0)
        sink.write_batch(df, 0)
        sink.write_batch(df, 0)  # a replay: skipped
        assert sink.committed(0) and not sink.committed(1)

    first = {"id": "1", "name": "a", "score": "2.5", "ok": "true", "at": "2026-01-01T12:00:01.000Z", "tags": "[1,2]"}
    assert [f for _, f in server.xrange(stream)] == [
        first, {"id": "2", "ok": "false"}, {"id": "1", "name": "b", "at": "2026-01-01T12:00:02.500Z", "tags": "[]"}]
    assert server.hgetall(f"{prefix}:1") == {"id": "1", "name": "b", "at": "2026-01-01T12:00:02.500Z", "tags": "[]"}
    assert server.hgetall(f"{prefix}:2") == {"id": "2", "ok": "false"}
    assert sorted(server.scan_iter(f"{prefix}:*")) == [f"{prefix}:1", f"{prefix}:2"]


def test_a_keyed_window_upserted_into_hashes_ends_with_the_window_counts(spark: Any, server: Any,
                                                                         tmp_path: Path) -> None:
    prefix, state = new_name("counts"), tmp_path / "state"
    events = [{"user": f"u{i % 3}", "ts": datetime(2026, 1, 1, 0, 0, i // 4, tzinfo=UTC)} for i in range(90)]
    batches = [events[:30], events[30:60], events[60:]]

    def pipeline() -> hr.Pipeline:
        p = hr.Pipeline("redis_counts")
        (p.source("events", TestSource(batches, schema="user string, ts timestamp"), event_time="ts")
         .key_by("user").window(hr.Tumbling("10s")).count()
         .select("user", "window_start", "count")
         .sink("counts", hr.sinks.Redis(key_prefix=prefix, key=["user", "window_start"])))
        return p

    def hashes() -> dict[tuple[str, str], int]:
        found = {}
        for key in server.scan_iter(f"{prefix}:*"):
            row = server.hgetall(key)
            assert key == f"{prefix}:{row['user']}:{row['window_start']}"
            found[(row["user"], row["window_start"])] = int(row["count"])
        return found

    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    expected = Counter((e["user"], e["ts"].replace(second=e["ts"].second // 10 * 10).strftime("%Y-%m-%dT%H:%M:%S.000Z"))
                       for e in events)
    assert hashes() == dict(expected)

    drop_last_commit(state)  # the replayed batch is skipped; the hashes stay
    hr.run(pipeline(), state_dir=str(state), progress="quiet")
    assert hashes() == dict(expected)


@pytest.mark.fast
def test_bad_arguments_say_what_is_wrong() -> None:
    cases = [
        (dict(), r"give stream= \(append each row as a stream entry\) or key_prefix= and key="),
        (dict(stream="s", key_prefix="p"), r"give either stream= .* or key_prefix= .*, not both"),
        (dict(stream=""), r"stream must be a non-empty string, got ''"),
        (dict(key_prefix="p"), r"Redis sink for hashes p:\*: key= names the column\(s\)"),
        (dict(stream="s", key="id"), r"key= is for hashes \(key_prefix=\)"),
        (dict(stream="s", format="xml"), r"Redis sink for stream 's': unknown format 'xml'; use one of json, fields"),
        (dict(key_prefix="p", key=["id", "id"]), r"key \['id', 'id'\] names a column twice"),
        (dict(key_prefix="p", key=3), r"key must be a column name or a list of column names, got 3"),
        (dict(stream="s", url="http://x:6379"), r"url 'http://x:6379' is not a redis://, rediss:// or unix:// URL"),
        (dict(stream="s", retries=-1), r"retries must be a whole number of retries, 0 or more, got -1"),
    ]
    for kwargs, message in cases:
        with pytest.raises(PlanError, match=message):
            hr.sinks.Redis(**kwargs)


def test_unreachable_server_missing_key_column_and_wrong_key_type_name_the_step(spark: Any, server: Any,
                                                                                tmp_path: Path) -> None:
    nowhere = hr.sinks.Redis(stream="s", url="redis://app:secret@127.0.0.1:1/0", retries=1, retry_backoff=0.1)
    p = orders_pipeline("redis_sink_nowhere", nowhere)
    with pytest.raises(SinkError, match=r"sink 'to_redis' \(.*test_redis_sink.py:\d+\): Redis at "
                                        r"redis://app@127.0.0.1:1/0 unreachable after 2 attempts .* gave up trying to "
                                        r"connect") as raised:
        PipelineRun(p, state_dir=str(tmp_path / "nowhere"), progress="quiet").start()
    assert "secret" not in str(raised.value)

    p = orders_pipeline("redis_sink_no_key", hr.sinks.Redis(key_prefix=new_name("nokey"), key=["user", "region"]))
    with pytest.raises(Exception, match=r"sink 'to_redis' \(.*\): key column\(s\) \['region'\] are not in the "
                                        r"stream's columns \['order_id', 'user', 'amount'\]"):
        hr.run(p, state_dir=str(tmp_path / "no_key"), progress="quiet")

    taken = new_name("taken")
    server.set(taken, "a string")
    p = orders_pipeline("redis_sink_taken", hr.sinks.Redis(stream=taken))
    with pytest.raises(Exception, match=rf"sink 'to_redis' \(.*\): batch 0: the key '{taken}' holds a string, "
                                        "not a stream"):
        hr.run(p, state_dir=str(tmp_path / "taken"), progress="quiet")
    assert server.get(taken) == "a string"
