"""Recovery: a pipeline stopped (or killed) mid-stream and restarted from its checkpoint
gives exactly the rows of an uninterrupted run, in PostgreSQL and in files."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import pytest

import headrace as hr
from headrace.connectors.files_sink import read_rows
from headrace.runtime.runner import PipelineRun

DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _postgres_or_skip():
    from conftest import service_or_skip
    try:
        import psycopg
        psycopg.connect(DSN, connect_timeout=5).close()
        reachable, why = True, ""
    except Exception as exc:  # noqa: BLE001
        reachable, why = False, str(exc)
    service_or_skip("PostgreSQL", reachable, why)


def campaign_counts(name: str, table: str, files: str) -> hr.Pipeline:
    """YSB-like views per campaign per 50 ms window, to PostgreSQL and to files (two sinks).

    The generator spaces events 10 µs apart in event time, so 30,000 events span 300 ms."""
    p = hr.Pipeline(name)
    ads = p.table("ads", hr.sources.ysb_ads())
    events = p.source("events", hr.sources.Generator("ysb", limit=30_000, rows_per_batch=5_000, seed=7),
                      event_time="event_time", max_out_of_orderness="10ms")
    counts = (events.filter(hr.col("event_type") == "view").join(ads, on="ad_id")
              .key_by("campaign_id").window(hr.Tumbling("50ms")).aggregate(views=hr.count()))
    counts.sink("db", hr.sinks.Postgres(table, dsn=DSN, key=("campaign_id", "window_start")))
    counts.sink("files", hr.sinks.Files(files, format="jsonl"))
    return p


def table_rows(table: str) -> Counter:
    import psycopg
    with psycopg.connect(DSN) as conn:
        rows = conn.execute(f"SELECT campaign_id, window_start, views FROM {table}").fetchall()
        conn.execute(f"DROP TABLE {table}")
        conn.execute("DELETE FROM headrace_sink_commits WHERE sink LIKE %s", (f"%{table}%",))
    return Counter((c, w.timestamp(), v) for c, w, v in rows)


def file_rows(path: str) -> Counter:
    return Counter((r["campaign_id"], str(r["window_start"]), r["views"]) for r in read_rows(path, "jsonl"))


def stop_after(run: PipelineRun, batches: int, graceful: bool) -> threading.Thread:
    def watch() -> None:
        while len(run.query.recentProgress) < batches:
            time.sleep(0.05)
        if graceful:
            run.request_stop("test")
        else:
            run.query.stop()  # a crash: the batch in flight is lost and replayed on restart
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def uninterrupted(spark, tmp_path_factory):
    """The output of one run from start to end: what every interrupted run must match."""
    _postgres_or_skip()
    tag = uuid.uuid4().hex[:8]
    folder = tmp_path_factory.mktemp("whole")
    whole = campaign_counts(f"whole_{tag}", f"whole_{tag}", str(folder / "files"))
    hr.run(whole, state_dir=str(folder / "state"), progress="quiet", handle_signals=False)
    return table_rows(f"whole_{tag}"), file_rows(str(folder / "files"))


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful-stop", "killed"])
def test_restart_gives_the_uninterrupted_output(uninterrupted, tmp_path, graceful):
    tag = uuid.uuid4().hex[:8]

    table, files, state = f"parts_{tag}", str(tmp_path / "parts"), str(tmp_path / "state_parts")
    first = PipelineRun(campaign_counts(f"parts_{tag}", table, files), state_dir=state, progress="quiet").start()
    watcher = stop_after(first, 2, graceful)
    try:
        first.wait()
    except hr.HeadraceError:
        assert not graceful  # a killed query may report its interruption
    watcher.join(timeout=60)
    assert not first.exhausted(), "the first run should have stopped mid-stream"
    second = PipelineRun(campaign_counts(f"parts_{tag}", table, files), state_dir=state, progress="quiet").start()
    result = second.wait()
    assert result.stopped_by == "input exhausted"

    expected_db, expected_files = uninterrupted
    assert len(expected_db) >= 500 and max(expected_db.values()) == 1
    assert table_rows(table) == expected_db
    assert file_rows(files) == expected_files
    assert len(expected_files) == len(expected_db)
