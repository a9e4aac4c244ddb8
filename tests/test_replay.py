"""A batch that the sinks committed but Spark did not (a crash between the two) is replayed on
restart: the sinks skip it, yet Spark's stateful operators must still run it to commit their
state (Spark 4.1+ fails the batch otherwise: STATE_STORE_COMMIT_VALIDATION_FAILED, on every
restart). The same holds for a console sink that shows only the first rows of a batch."""

from __future__ import annotations

import datetime
import io
import os
import re
import shutil
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

import headrace as hr
from headrace.connectors.files_sink import batch_dir_name, read_rows
from headrace.connectors.generator import generate
from headrace.runtime.runner import PipelineRun

DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
EVENTS, PER_BATCH, WINDOW_MS = 12_000, 2_000, 10  # 10 µs apart: 12 windows of 1,000 events


def _postgres_or_skip() -> None:
    from conftest import service_or_skip
    try:
        import psycopg
        psycopg.connect(DSN, connect_timeout=5).close()
        reachable, why = True, ""
    except Exception as exc:  # noqa: BLE001
        reachable, why = False, str(exc)
    service_or_skip("PostgreSQL", reachable, why)


def expected_counts() -> Counter:
    """Views per user per 10 ms window, from the generator's events, without headrace."""
    events = generate("clicks", 0, EVENTS).to_pydict()
    counts: Counter = Counter()
    for user, time_ in zip(events["user_id"], events["event_time"]):
        millis = int(time_.timestamp() * 1000)
        counts[(user, millis - millis % WINDOW_MS)] += 1
    return Counter({(user, start, n): 1 for (user, start), n in counts.items()})


def build(name: str, sinks: dict[str, hr.sinks.Postgres | hr.sinks.Files | hr.sinks.Console]) -> hr.Pipeline:
    """A keyed tumbling window with allowed lateness: it runs on transformWithStateInPandas."""
    p = hr.Pipeline(name)
    clicks = p.source("clicks", hr.sources.Generator("clicks", limit=EVENTS, rows_per_batch=PER_BATCH),
                      event_time="event_time", max_out_of_orderness="2ms")
    counts = (clicks.key_by("user_id").window(hr.Tumbling(f"{WINDOW_MS}ms"), allowed_lateness="5ms").count()
              .select("user_id", "window_start", "count"))
    for sink_name, connector in sinks.items():
        counts.sink(sink_name, connector)
    return p


def run_until(run: PipelineRun, batches: int) -> None:
    """Run until ``batches`` batches are done, then stop gracefully at a batch boundary."""
    def watch() -> None:
        while len(run.query.recentProgress) < batches and run.query.isActive:
            time.sleep(0.02)
        run.request_stop("test")
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run.wait(until_exhausted=False)
    watcher.join(timeout=60)
    assert not run.exhausted(), "the first run should have stopped mid-stream"


def forget_last_commit(state: str, name: str) -> int:
    """Delete Spark's commit file of the last batch, as a crash right after the sinks
    committed it would leave the checkpoint; return that batch id."""
    commits = Path(state) / name / "checkpoint" / "commits"
    last = max(int(f.name) for f in commits.iterdir() if f.name.isdigit())
    for leftover in (commits / str(last), commits / f".{last}.crc"):
        leftover.unlink(missing_ok=True)
    return last


def table_counts(table: str) -> Counter:
    import psycopg
    with psycopg.connect(DSN) as conn:
        rows = conn.execute(f"SELECT user_id, window_start, count FROM {table}").fetchall()
        conn.execute(f"DROP TABLE {table}")
        conn.execute("DELETE FROM headrace_sink_commits WHERE sink LIKE %s", (f"%{table}%",))
    return Counter((u, int(w.timestamp() * 1000), n) for u, w, n in rows)


def file_counts(path: str) -> Counter:
    def millis(value: str) -> int:
        return int(datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    return Counter((r["user_id"], millis(r["window_start"]), r["count"]) for r in read_rows(path, "jsonl"))


@pytest.mark.parametrize("layout", ["postgres", "postgres+files", "postgres+files, files not committed"])
def test_a_replayed_batch_the_sinks_committed_runs_on(spark, tmp_path, layout):
    """Run, forget Spark's commit of the last batch, restart: the sinks skip the replayed batch,
    the pipeline goes on, and the output is exact (no window lost, none written twice)."""
    if "postgres" in layout:
        _postgres_or_skip()
    tag = uuid.uuid4().hex[:8]
    name, table, files, state = f"replay_{tag}", f"replay_{tag}", str(tmp_path / "files"), str(tmp_path / "state")

    def sinks() -> dict:
        chosen: dict = {}
        if "postgres" in layout:
            chosen["db"] = hr.sinks.Postgres(table, dsn=DSN)
        if "files" in layout:
            chosen["files"] = hr.sinks.Files(files, format="jsonl")
        return chosen

    run_until(PipelineRun(build(name, sinks()), state_dir=state, progress="quiet").start(), 3)
    replayed = forget_last_commit(state, name)
    if "files not committed" in layout:  # the crash came between the two sinks' commits
        shutil.rmtree(os.path.join(files, batch_dir_name(replayed)))
    result = PipelineRun(build(name, sinks()), state_dir=state, progress="quiet").start().wait()
    assert result.stopped_by == "input exhausted"
    assert result.progress[0]["batchId"] == replayed

    expected = expected_counts()
    assert len(expected) > 300 and max(expected.values()) == 1
    if "postgres" in layout:
        assert table_counts(table) == expected
    if "files" in layout:
        assert file_counts(files) == expected


def test_a_console_showing_a_few_rows_reads_the_whole_batch(spark, tmp_path):
    """Console(limit=3) shows 3 rows of batches that have many more: the batch is still read to
    its end, on a first run and on a replay."""
    name, state = f"replay_console_{uuid.uuid4().hex[:8]}", str(tmp_path / "state")
    first_out, second_out = io.StringIO(), io.StringIO()
    run_until(PipelineRun(build(name, {"console": hr.sinks.Console(limit=3, out=first_out)}),
                          state_dir=state, progress="quiet").start(), 3)
    replayed = forget_last_commit(state, name)
    result = PipelineRun(build(name, {"console": hr.sinks.Console(limit=3, out=second_out)}),
                         state_dir=state, progress="quiet").start().wait()
    assert result.stopped_by == "input exhausted"

    shown = re.findall(r"--- batch (\d+) ---", first_out.getvalue() + second_out.getvalue())
    assert [int(b) for b in shown] == [*range(replayed + 1), *range(replayed, int(shown[-1]) + 1)]
    assert "only showing the first 3 rows" in first_out.getvalue()
    assert "only showing the first 3 rows" in second_out.getvalue().split("--- batch")[1]  # the replay
