"""Every sink, alone and beside another sink and the dead letters, under a SIGKILL between the
sinks' commit and Spark's: the output is exactly the windows computed here in plain Python.

The pipeline (``tests/sink_matrix_driver.py``): JSON-lines files, one a micro-batch, each with one
bad line -> a keyed one-minute window count -> the sink(s). Exactly-once sinks only:

* **alone** (one run each in this process, not killed): the collect sink (``TestSink``, whose rows
  live in the driver, so it cannot outlive a kill), Files (Spark's own file sink when alone),
  PostgreSQL, Kafka (transactions, read ``read_committed``), Delta, Redis, NATS JetStream,
  RabbitMQ Streams and a queryable view (SQLite, read with SQLite's own client);
* **killed groups** (a driver process each): two groups of sinks with the dead letters sunk
  between them. At batch 2 of the first run the dead-letter sink, once it has committed, waits;
  the test kills the process group there: the first group and the dead letters hold batch 2, the
  second group and Spark's commit log do not. The restart replays batch 2: the first group and
  the dead letters skip it, the second writes it. Every sink is in a killed run, four of them
  before the kill point and four after, and a view on both sides.

Not here: MQTT and the console are at-least-once (MQTT publishes a replayed batch again, the
console prints it again), so an exact comparison after a kill does not hold for them by design;
``tests/test_mqtt.py`` checks MQTT's at-least-once delivery.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import socket
import sqlite3
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip
from driver_process import KilledRun
from input_files import write_in_order
from sink_matrix_driver import PG_DSN, build, make_sink

from headrace.connectors.files_sink import read_rows
from headrace.environment import jars
from headrace.testing import TestSink

DRIVER = Path(__file__).resolve().parent / "sink_matrix_driver.py"
KAFKA = "127.0.0.1:9092"
START_MS = 1_700_000_040_000  # a minute boundary
FILES, PER_FILE = 3, 80  # batch 2 (PAUSE_AT), the last file, is where the killed runs stop
USERS = 4
BAD = [f"not json {n}" for n in range(FILES)]


def events() -> list[tuple[str, int]]:
    """(user, event time in ms): two seconds apart, so the files span eight minutes."""
    return [(f"u{i % USERS}", START_MS + i * 2000) for i in range(FILES * PER_FILE)]


def expected_windows() -> list[tuple[str, int, int]]:
    counts = Counter((user, at - at % 60_000) for user, at in events())
    return sorted((user, start, count) for (user, start), count in counts.items())


def write_input(folder: Path) -> None:
    folder.mkdir(parents=True)
    every = events()
    for n in range(FILES):
        lines = [json.dumps({"user": u, "event_time": _iso(at)}) for u, at in every[n * PER_FILE:(n + 1) * PER_FILE]]
        lines.insert(PER_FILE // 2, BAD[n])
        write_in_order(folder / f"part-{n}.jsonl", "\n".join(lines) + "\n", n)


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _ms(value: Any) -> int:
    if isinstance(value, str):
        value = datetime.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return int(value.timestamp() * 1000)


def windows_of(rows: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return sorted((r["user"], _ms(r["window_start"]), int(r["count"])) for r in rows)


# -- each sink: a target of its own, a check that its service answers, and its rows read back ----

def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


def need(kind: str) -> None:
    """The service (and Python package, Spark package) ``kind`` writes with, or a skip saying why."""
    port = {"postgres": 5432, "kafka": 9092, "redis": 6379, "nats": 4222, "rabbitmq": 5552}.get(kind)
    if port is not None:
        service_or_skip(kind, _reachable(port), f"nothing listens on 127.0.0.1:{port}")
    package = {"postgres": "psycopg", "kafka": "confluent_kafka", "redis": "redis", "nats": "nats",
               "rabbitmq": "rstream", "delta": "pyarrow"}.get(kind)
    if package:
        pytest.importorskip(package)
    if kind == "delta" and not jars.fetched().get(jars.DELTA.name):
        service_or_skip("Delta Lake's package", False, "run bash scripts/fetch_jars.sh")


def new_target(kind: str, tmp_path: Path) -> str:
    name = f"m_{kind}_{uuid.uuid4().hex[:8]}"
    if kind == "view":  # the state dir whose pipeline keeps the view
        return str(tmp_path / "state")
    if kind in ("files", "delta"):
        return str(tmp_path / name)
    if kind == "kafka":
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": KAFKA})
        for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
            future.result(30)
    if kind == "nats":
        _nats(lambda js: js.add_stream(name=name, subjects=[f"{name}.>"]))
    if kind == "rabbitmq":
        from headrace.connectors.rabbitmq_streams import rabbitmq_close, rabbitmq_connect

        async def create() -> None:
            client = await rabbitmq_connect("rabbitmq-stream://guest:guest@127.0.0.1:5552/%2f", "headrace-test")
            try:
                await client.create_stream(name)
            finally:
                await rabbitmq_close(client)
        asyncio.run(create())
    return name


def _nats(action: Any) -> Any:
    import nats

    async def main() -> Any:
        nc = await nats.connect("nats://127.0.0.1:4222")
        try:
            return await action(nc.jetstream())
        finally:
            await nc.close()
    return asyncio.run(main())


def sink_steps(count: int, before: int) -> list[str]:
    """The names ``build`` gives its sinks."""
    return [f"first_{i}" if i < before else f"second_{i - before}" for i in range(count)]


def written(kind: str, target: str, step: str = "") -> list[dict[str, Any]]:
    """The rows the sink committed, read with the system's own client (never through headrace's sink)."""
    if kind == "view":  # SQLite's own client, on the pipeline's one serving store
        store, = Path(target).glob("*/run/views.sqlite")
        with sqlite3.connect(store) as db:
            return [json.loads(v) for v, in db.execute("SELECT value FROM rows WHERE view = ?", (step,))]
    if kind == "files":
        return read_rows(target, "jsonl")
    if kind == "postgres":
        import psycopg
        with psycopg.connect(PG_DSN) as conn:
            return [{"user": u, "window_start": w, "count": c}
                    for u, w, c in conn.execute(f'SELECT "user", window_start, count FROM {target}').fetchall()]
    if kind == "kafka":
        from headrace.testing.kafka import read_topic
        return [record.json() for record in read_topic(KAFKA, target)]
    if kind == "delta":
        import pyarrow.parquet as pq

        from benchmarks.chaos import DeltaLog
        return [row for path in DeltaLog(target).live_files() for row in pq.read_table(path).to_pylist()]
    if kind == "redis":
        import redis
        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        return [json.loads(fields[b"data"]) for _id, fields in client.xrange(target)]
    if kind == "nats":
        async def read(js: Any) -> list[dict[str, Any]]:
            last = (await js.stream_info(target)).state.last_seq
            return [json.loads((await js.get_msg(target, seq)).data) for seq in range(1, last + 1)]
        return list(_nats(read))
    if kind == "rabbitmq":
        from test_rabbitmq_streams import read_all  # the stream read back through the source's reader

        return read_all(target, "user string, window_start timestamp, count long")
    raise ValueError(kind)


# -- alone, not killed --------------------------------------------------------------------------

ALONE = ["collect", "files", "postgres", "kafka", "delta", "redis", "nats", "rabbitmq", "view"]


@pytest.mark.parametrize("kind", ALONE)
def test_each_sink_alone_holds_exactly_the_windows(kind: str, spark: Any, tmp_path: Path) -> None:
    import headrace as hr

    write_input(tmp_path / "in")
    if kind == "collect":
        sink: Any = TestSink()
    else:
        need(kind)
        target = new_target(kind, tmp_path)
        sink = make_sink(kind, target)
    pipeline = build(f"alone_{kind}_{uuid.uuid4().hex[:6]}", str(tmp_path / "in"), [sink])
    result = hr.run(pipeline, state_dir=str(tmp_path / "state"), progress="quiet", handle_signals=False)

    rows = sink.rows() if kind == "collect" else written(kind, target, "first_0")
    assert windows_of(rows) == expected_windows()
    assert result.input_rows == FILES * (PER_FILE + 1)
    assert result.dead_letters == FILES


# -- pairs beside the dead letters, killed between the sinks' commit and Spark's -----------------

# Each group of sinks before the kill point, then each after it: every sink is in a killed run,
# four of them before it and four after (Kafka on both sides).
GROUPS = [(("postgres", "redis", "view"), ("kafka", "nats", "view")), (("kafka", "rabbitmq"), ("delta", "files"))]
PAUSE_AT = 2


@pytest.mark.parametrize("first, second", GROUPS, ids=["+".join((*a, "|", *b)) for a, b in GROUPS])
def test_sinks_beside_the_dead_letters_killed_between_the_commits_are_exact(first: tuple[str, ...],
                                                                           second: tuple[str, ...],
                                                                           tmp_path: Path) -> None:
    kinds = [*first, *second]
    for kind in kinds:
        need(kind)
    write_input(tmp_path / "in")
    targets = [new_target(kind, tmp_path) for kind in kinds]
    pause_file = tmp_path / "paused"
    args = {"name": f"group_{'_'.join(kinds)}_{uuid.uuid4().hex[:6]}", "state_dir": str(tmp_path / "state"),
            "input": str(tmp_path / "in"), "sinks": [list(pair) for pair in zip(kinds, targets)],
            "before": len(first), "dead": str(tmp_path / "dead"), "pause_file": str(pause_file),
            "pause_at": PAUSE_AT, "out": str(tmp_path / "dead")}
    run = KilledRun(DRIVER, args, tmp_path / "driver.log")

    run.kill_when("the dead-letter sink paused after committing batch 2", pause_file.exists)
    assert run.committed() == PAUSE_AT  # Spark's commit log has batches 0 and 1 only
    exhausted = Path(args["state_dir"]) / args["name"] / "run" / "exhausted" / "clicks"
    run.restart_until("every file read and its batch committed",
                      lambda: exhausted.exists() and run.committed() >= run.planned())

    expected = expected_windows()
    for kind, target, step in zip(kinds, targets, sink_steps(len(kinds), len(first))):
        assert windows_of(written(kind, target, step)) == expected, kind
    assert sorted(r["raw"] for r in run.written()) == BAD
