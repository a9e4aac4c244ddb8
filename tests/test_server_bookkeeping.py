"""The server's bookkeeping without a driver: when an operation ends, how errors are counted once,
and what a restarted server makes of a rescale it did not see end."""

from __future__ import annotations

import json
from pathlib import Path

from headrace.server.metrics import Metrics
from headrace.server.operations import Operations
from headrace.server.registry import (
    DRAINING,
    FAILED,
    FINISHED,
    PAUSED,
    RESCALING,
    RUNNING,
    STOPPED,
    Entry,
    Registry,
)
from headrace.server.supervisor import Supervisor


def entry(status: str, wanted: bool = True) -> Entry:
    return Entry("orders", "/x/orders.py", "/x/state", status, wanted)


def test_an_operation_ends_when_what_it_asked_for_has_happened(tmp_path: Path):
    operations = Operations(str(tmp_path / "server.sqlite"))
    stop = operations.begin("orders", "stop", 100.0)
    resume = operations.begin("orders", "resume", 100.0)
    operations.settle(entry(RUNNING), last_report_at=lambda: 99.0)  # a report from before the requests
    assert [operations.get(o.id).status for o in (stop, resume)] == ["running", "running"]
    operations.settle(entry(RUNNING), last_report_at=lambda: 101.5)  # the new driver's query started
    assert operations.get(resume.id).status == "done" and operations.get(stop.id).status == "running"
    operations.settle(entry(STOPPED, wanted=False), last_report_at=lambda: 101.5)
    ended = operations.get(stop.id)
    assert (ended.status, ended.detail) == ("done", "orders is stopped")

    pause, restart = operations.begin("orders", "pause", 200.0), operations.begin("orders", "restart", 200.0)
    operations.settle(Entry("orders", "/x/orders.py", "/x/state", FAILED, False, reason="driver killed; no restart "
                            "left"), last_report_at=lambda: 150.0)
    assert {(operations.get(o.id).status, operations.get(o.id).detail) for o in (pause, restart)} == {
        ("failed", "the pipeline failed: driver killed; no restart left")}
    late = operations.begin("orders", "resume", 300.0)
    operations.settle(entry(PAUSED, wanted=False), last_report_at=lambda: 250.0)
    assert operations.get(late.id).detail == "the pipeline was paused before its driver was under way"


def test_the_same_error_on_another_record_is_counted_once(tmp_path: Path):
    registry = Registry(str(tmp_path / "server.sqlite"))
    for at, record in ((10.0, "{'id': 1}"), (20.0, "{'id': 2}")):
        registry.add_exception("orders", f"step 'check' (app.py:4) raised ValueError: bad (record: {record})", at)
    registry.add_exception("orders", "sink 'db' (app.py:9) failed to write batch 3: timeout", 15.0)
    assert registry.exceptions("orders") == [
        {"message": "step 'check' (app.py:4) raised ValueError: bad (record: {'id': 2})", "count": 2,
         "first_at": 10.0, "last_at": 20.0},
        {"message": "sink 'db' (app.py:9) failed to write batch 3: timeout", "count": 1, "first_at": 15.0,
         "last_at": 15.0}]
    registry.remove("orders")
    assert registry.exceptions("orders") == []


def test_a_rescale_a_restarted_server_did_not_see_end_leaves_the_pipeline_failed_saying_what_to_do(tmp_path: Path):
    database = str(tmp_path / "server.sqlite")
    registry = Registry(database)
    registry.put(entry(RESCALING))
    supervisor = Supervisor(registry, Operations(database), str(tmp_path), [str(tmp_path)])
    supervisor.start()
    try:
        found = registry.get("orders")
        assert found is not None and (found.status, found.wanted) == (FAILED, False)
        assert found.reason == ("the server ended during its rescale; headrace rescale orders N runs it again, "
                                "headrace restart orders starts it from its checkpoint as it is")
    finally:
        supervisor.close()


def test_each_steps_records_and_each_sinks_write_time_add_up_every_batch_once(tmp_path: Path):
    """From the progress file: a batch reported twice (a killed driver's, then its successor's)
    counts once, with its last report; the last batch gives the rates; a sink that took more than
    half of the last batch's time, and at least a second, is slow."""
    state = tmp_path / "state"
    state.mkdir()
    lines = [
        {"batch": 0, "batch_ms": 1000, "step_records": {"src": 9, "evens": 4}, "sink_ms": {"db": 100}},
        {"batch": 1, "batch_ms": 900, "step_records": {"src": 5, "evens": 2}, "sink_ms": {"db": 300}},
        {"batch": 1, "batch_ms": 2000, "step_records": {"src": 6, "evens": 3}, "sink_ms": {"db": 1500}},  # again
    ]
    (state / "progress.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    metrics = Metrics("progress.jsonl")
    orders = Entry("orders", "/x/orders.py", str(state), RUNNING, True)
    assert metrics.figures(orders)["steps"] == {
        "src": {"records_total": 15, "records_last_batch": 6, "records_per_second": 3.0},
        "evens": {"records_total": 7, "records_last_batch": 3, "records_per_second": 1.5},
        "db": {"write_seconds_total": 1.6, "write_ms_last_batch": 1500, "slow": True}}
    samples = metrics.exposition([orders], {}).splitlines()
    assert 'headrace_step_records_total{pipeline="orders",step="evens"} 7' in samples
    assert 'headrace_sink_write_seconds_total{pipeline="orders",sink="db"} 1.6' in samples
    assert "# HELP headrace_step_records_total records a step handed on" in samples


def test_a_drain_is_done_when_the_pipeline_is_finished_and_failed_when_it_was_stopped_first(tmp_path: Path):
    operations = Operations(str(tmp_path / "server.sqlite"))
    drained, again = operations.begin("orders", "drain", 100.0), operations.begin("orders", "drain", 100.0)
    operations.settle(entry(DRAINING), last_report_at=lambda: 101.0)  # a batch of the drain: not yet done
    assert operations.get(drained.id).status == "running"
    operations.settle(entry(FINISHED, wanted=False), last_report_at=lambda: 102.0)
    assert (operations.get(drained.id).status, operations.get(drained.id).detail) == ("done", "orders is finished")
    late = operations.begin("orders", "drain", 200.0)
    operations.settle(entry(STOPPED, wanted=False), last_report_at=lambda: 201.0)
    assert (operations.get(late.id).status, operations.get(late.id).detail) == ("failed",
                                                                               "the pipeline was stopped first")
    assert operations.get(again.id).status == "done"  # a second request for the same drain: done with it
