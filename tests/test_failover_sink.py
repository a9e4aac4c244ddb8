"""hr.sinks.Failover: each micro-batch goes to the first member that writes it; failovers are
counted and logged; a batch any member committed is skipped on replay; the guarantee is the
weakest member's."""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.connectors.base import Guarantee, SinkConnector, run_batch
from headrace.connectors.failover import Failover
from headrace.connectors.files_sink import read_rows
from headrace.connectors.generator import generate
from headrace.errors import PlanError, SinkError
from headrace.runtime.runner import PipelineRun


class Broken(SinkConnector):
    """A sink whose system is down: every write fails."""

    guarantee = Guarantee.EXACTLY_ONCE

    def __init__(self, why: str = "connection refused") -> None:
        self.why, self.attempts = why, 0

    def write_batch(self, df: Any, batch_id: int) -> None:
        self.attempts += 1
        raise ConnectionError(self.why)


class Committed(SinkConnector):
    """A sink that has committed some batch ids already."""

    def __init__(self, batch_ids: set[int], fails: bool = False) -> None:
        self.batch_ids, self.fails = batch_ids, fails

    def committed(self, batch_id: int) -> bool:
        if self.fails:
            raise ConnectionError("cannot reach the commit table")
        return batch_id in self.batch_ids

    def write_batch(self, df: Any, batch_id: int) -> None:
        raise AssertionError("not written in these tests")


def frame(spark: Any, rows: list[tuple[str, int]]) -> Any:
    return spark.createDataFrame(rows, "word string, n long")


# -- building ------------------------------------------------------------------------------------

@pytest.mark.fast
def test_the_guarantee_is_the_weakest_members():
    assert Failover(hr.sinks.Null(), hr.sinks.TestSink()).guarantee is Guarantee.EXACTLY_ONCE
    assert Failover(hr.sinks.Null(), hr.sinks.Console()).guarantee is Guarantee.AT_LEAST_ONCE
    assert Failover(hr.sinks.Console(), hr.sinks.Null(), names=["log", "void"]).describe() == {
        "type": "Failover", "members": [{"name": "log", "type": "Console", "limit": 20, "truncate": False},
                                        {"name": "void", "type": "Null"}]}


@pytest.mark.parametrize("args, kwargs, message", [
    ((hr.sinks.Null(),), {}, "Failover: give a primary and at least one backup sink: Failover(primary, backup, ...)"),
    ((hr.sinks.Null(), "console"), {}, "Failover: member 2 must be a headrace sink (hr.sinks.*), got str"),
    ((hr.sinks.Null(), hr.sinks.Null()), {"names": ["a"]},
     "Failover: names must be 2 non-empty strings, one per member, got ['a']"),
    ((hr.sinks.Null(), hr.sinks.Null()), {"names": ["a", "a"]}, "Failover: a member name appears twice in ['a', 'a']"),
])
@pytest.mark.fast
def test_bad_groups_are_refused(args, kwargs, message):
    with pytest.raises(PlanError) as caught:
        Failover(*args, **kwargs)
    assert str(caught.value) == message


@pytest.mark.fast
def test_a_group_is_a_sink_of_the_fluent_api():
    p = hr.Pipeline("failover_plan")
    source = p.source("words", hr.sources.TestSource([[{"word": "a"}]], schema={"word": "string"}))
    source.sink("out", Failover(Broken(), hr.sinks.TestSink()))
    plan = p.to_json()
    assert plan["guarantee"] == "exactly-once"
    assert plan["nodes"][-1]["connector"] == {"type": "Failover", "members": [
        {"name": "primary", "type": "Broken"}, {"name": "backup", "type": "TestSink"}]}
    assert re.search(r"\n  out +sink Failover <- words\n +lowered as: foreachBatch, committed by batch id ",
                     p.explain())


# -- one batch at a time ----------------------------------------------------------------------------

def test_a_failing_primary_sends_the_batch_to_the_backup(spark, caplog):
    primary, backup = Broken("primary is down"), hr.sinks.TestSink()
    group = Failover(primary, backup)
    with caplog.at_level(logging.WARNING, logger="headrace.sinks.failover"):
        group.write_batch(frame(spark, [("a", 1), ("b", 2)]), 0)
        group.write_batch(frame(spark, [("c", 3)]), 1)
    assert backup.batches == {0: [{"word": "a", "n": 1}, {"word": "b", "n": 2}], 1: [{"word": "c", "n": 3}]}
    assert primary.attempts == 2  # the primary is tried first for every batch
    assert group.failovers == 2 and group.failovers_by_member == {"primary": 2}
    assert [r.getMessage() for r in caplog.records] == [
        "Failover(primary, backup): batch 0: member 'primary' failed, failing over to 'backup': "
        "ConnectionError: primary is down",
        "Failover(primary, backup): batch 1: member 'primary' failed, failing over to 'backup': "
        "ConnectionError: primary is down"]


def test_a_working_primary_takes_every_batch(spark):
    primary, backup = hr.sinks.TestSink(), hr.sinks.TestSink()
    group = Failover(primary, backup)
    group.write_batch(frame(spark, [("a", 1)]), 0)
    assert primary.batches == {0: [{"word": "a", "n": 1}]} and backup.batches == {}
    assert group.failovers == 0


def test_the_next_backup_takes_over_when_the_first_fails_too(spark):
    last = hr.sinks.TestSink()
    group = Failover(Broken("down"), Broken("also down"), last, names=["db", "replica", "disk"])
    group.write_batch(frame(spark, [("a", 1)]), 4)
    assert last.batches == {4: [{"word": "a", "n": 1}]}
    assert group.failovers_by_member == {"db": 1, "replica": 1}


def test_when_every_member_fails_the_batch_fails_with_each_error(spark):
    group = Failover(Broken("down"), Broken("also down"))
    with pytest.raises(SinkError) as caught:
        group.write_batch(frame(spark, [("a", 1)]), 7)
    assert str(caught.value) == ("Failover(primary, backup): every member failed to write batch 7: primary: "
                                 "ConnectionError: down; backup: ConnectionError: also down")
    assert group.failovers == 1  # the last member has nothing to fail over to


@pytest.mark.fast
def test_a_batch_any_member_committed_is_committed(caplog):
    assert Failover(Committed({1}), Committed({2})).committed(2)
    assert not Failover(Committed({1}), Committed({2})).committed(3)
    with caplog.at_level(logging.WARNING, logger="headrace.sinks.failover"):
        assert Failover(Committed(set(), fails=True), Committed({5})).committed(5)
        assert not Failover(Committed(set(), fails=True), Committed({5})).committed(6)
    assert caplog.records[-1].getMessage() == (
        "Failover(primary, backup): cannot tell whether member 'primary' committed batch 6 (ConnectionError: "
        "cannot reach the commit table); counting it as not committed there")


def test_members_are_bound_under_names_of_their_own(spark, tmp_path):
    group = Failover(hr.sinks.Files(str(tmp_path / "a")), hr.sinks.Files(str(tmp_path / "b")), names=["main", "spare"])
    bound = group.bind("archive/orders@3274e357", "pipeline.yaml:30")
    assert [m.owner for m in bound.members] == ["archive.main/orders@3274e357", "archive.spare/orders@3274e357"]
    assert [m.owner for m in group.members] == [None, None]  # the group itself is unchanged
    with pytest.raises(SinkError, match=r"^sink 'archive' \(pipeline.yaml:30\): every member failed"):
        Failover(Broken(), Broken()).bind("archive/orders@3274e357", "pipeline.yaml:30").write_batch(
            frame(spark, [("a", 1)]), 0)
    counted = Failover(Broken(), hr.sinks.TestSink())
    counted.bind("archive/orders@3274e357").write_batch(frame(spark, [("a", 1)]), 0)
    assert counted.failovers == 1  # what the running (bound) copy counts, the user's group shows


# -- in a running pipeline ---------------------------------------------------------------------------

EVENTS, PER_BATCH = 6_000, 1_000


def clicks_pipeline(name: str, group: Failover) -> hr.Pipeline:
    p = hr.Pipeline(name)
    clicks = p.source("clicks", hr.sources.Generator("clicks", limit=EVENTS, rows_per_batch=PER_BATCH))
    clicks.select("user_id", "url", "event_time", name="slim").sink("archive", group)
    return p


def test_a_primary_that_cannot_start_fails_over_and_the_backup_has_every_row(spark, tmp_path, caplog):
    backup = str(tmp_path / "backup")
    group = Failover(hr.sinks.Files("/dev/null/archive", format="jsonl"), hr.sinks.Files(backup, format="jsonl"))
    name = f"failover_{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="headrace.sinks.failover"):
        result = clicks_pipeline(name, group).run(state_dir=str(tmp_path / "state"), progress="quiet")
    assert result.stopped_by == "input exhausted"
    assert Counter(event(r) for r in read_rows(backup, "jsonl")) == expected_events()
    assert group.failovers == result.batches and group.failovers_by_member == {"primary": result.batches}
    messages = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"sink 'archive' \(test_failover_sink.py:\d+\): member 'primary' cannot start, its batches go "
                        r"to the next member: SinkError: sink 'archive.primary' \(test_failover_sink.py:\d+\): cannot "
                        r"create the directory '/dev/null/archive': \[Errno 20\] Not a directory: '/dev/null/archive'; "
                        r"choose a writable path", messages[0]), messages[0]
    assert sum("failing over to 'backup'" in m for m in messages) == result.batches


def run_until(run: PipelineRun, batches: int) -> None:
    """Run until ``batches`` batches are done, then stop at a batch boundary."""
    def watch() -> None:
        while len(run.query.recentProgress) < batches and run.query.isActive:
            time.sleep(0.02)
        run.request_stop("test")
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    run.wait(until_exhausted=False)
    watcher.join(timeout=60)


def forget_last_commit(state: str, name: str) -> int:
    """Delete Spark's commit of the last batch, as a crash after the sink committed it would."""
    commits = Path(state) / name / "checkpoint" / "commits"
    last = max(int(f.name) for f in commits.iterdir() if f.name.isdigit())
    for leftover in (commits / str(last), commits / f".{last}.crc"):
        leftover.unlink(missing_ok=True)
    return last


def test_a_replayed_batch_the_backup_committed_is_not_written_again(spark, tmp_path):
    """The primary is down; the backup commits each batch. Spark replays the last batch after a
    crash: the group sees the backup committed it and skips it, so no row is written twice."""
    name, state, backup = f"failover_replay_{uuid.uuid4().hex[:8]}", str(tmp_path / "state"), str(tmp_path / "b")

    def group() -> Failover:
        return Failover(Broken(), hr.sinks.Files(backup, format="jsonl"))

    first = group()
    run_until(PipelineRun(clicks_pipeline(name, first), state_dir=state, progress="quiet").start(), 3)
    replayed = forget_last_commit(state, name)
    second = group()
    result = PipelineRun(clicks_pipeline(name, second), state_dir=state, progress="quiet").start().wait()
    assert result.stopped_by == "input exhausted"
    assert result.progress[0]["batchId"] == replayed
    assert Counter(event(r) for r in read_rows(backup, "jsonl")) == expected_events()
    assert first.failovers >= 3 and second.failovers == result.batches - 1  # the replayed batch is not written


def event(row: dict[str, Any]) -> tuple[str, str, str]:
    """A row as (user, url, event time to the millisecond: the precision Spark's JSON writer keeps)."""
    return row["user_id"], row["url"], row["event_time"][:23]


def expected_events() -> Counter:
    """Each generated event once, computed without headrace."""
    events = generate("clicks", 0, EVENTS).to_pydict()
    return Counter((user, url, moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}")
                   for user, url, moment in zip(events["user_id"], events["url"], events["event_time"]))


class Recording(SinkConnector):
    """Writes nothing; notes each batch written and each close in ``calls``, which its copies share."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def write_batch(self, df: Any, batch_id: int) -> None:
        run_batch(df)
        self.calls.append(f"write {batch_id}")

    def close(self) -> None:
        self.calls.append("close")


def test_a_run_closes_each_sink_and_each_member_of_a_group_once_its_query_has_stopped(spark, tmp_path):
    """A sink's connections (a producer, a client, a database connection) are closed when the run ends:
    ``close`` is called once, after the last batch, on a sink and on each member of a group."""
    alone, member = [], []
    p = hr.Pipeline(f"closing_{uuid.uuid4().hex[:8]}")
    clicks = p.source("clicks", hr.sources.Generator("clicks", limit=EVENTS, rows_per_batch=PER_BATCH))
    clicks.sink("alone", Recording(alone))
    clicks.sink("group", Failover(Broken(), Recording(member)))
    result = p.run(state_dir=str(tmp_path / "state"), progress="quiet")
    assert result.stopped_by == "input exhausted"
    writes = [f"write {n}" for n in range(result.batches)]
    assert alone == [*writes, "close"] and member == [*writes, "close"]
