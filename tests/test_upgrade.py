"""Upgrades: a changed pipeline restarts from its checkpoint when the change keeps its state
(stateless code, sinks), and is refused, before Spark starts, when it would not.

Refusals run without Spark: a stored plan and a checkpoint with one logged batch are all the
check reads. Allowed upgrades run on Spark: a keyed window is stopped part way, restarted
with the new code from a copy of its checkpoint, and must end with the uninterrupted output.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import headrace as hr
from headrace.cli import main
from headrace.environment.checkpoints import read_plan
from headrace.runtime.compatibility import check_restart, compare, plan_record, record_plan
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

FRESH = ("To go ahead, undo the change to continue from the checkpoint, run with --fresh (fresh=True in Python) to "
         "delete the checkpoint and start over from the beginning of the input, or give the pipeline a new name to "
         "start it afresh beside the old checkpoint.")


# -- refused upgrades (no Spark) -----------------------------------------------------------------------

def clicks(*, source: str = "events", seed: int = 0, limit: int | None = 10_000, key: str = "user_id",
           window: hr.windows.WindowShape | None = None, step: str = "per_10s", aggs: dict | None = None,
           with_window: bool = True, sink: str = "out") -> hr.Pipeline:
    p = hr.Pipeline("clicks")
    events = p.source(source, hr.sources.Generator("clicks", limit=limit, seed=seed, rows_per_batch=1000),
                      event_time="event_time", max_out_of_orderness="1s")
    if with_window:
        events = (events.key_by(key).window(window or hr.Tumbling("10s"), name=step)
                  .aggregate(**(aggs or {"n": hr.count()})))
    events.sink(sink, hr.sinks.Null())
    return p


def ran_with(tmp_path: Path, old: hr.Pipeline) -> str:
    """A state dir as if ``old`` had run a batch: its stored plan, and a logged offset."""
    root = tmp_path / old.name
    record_plan(old.plan, str(root))
    (root / "checkpoint" / "offsets").mkdir(parents=True)
    (root / "checkpoint" / "offsets" / "0").write_text("v1\n")
    return str(tmp_path)


def refusal(tmp_path: Path, old: hr.Pipeline, new: hr.Pipeline) -> str:
    state = ran_with(tmp_path, old)
    with pytest.raises(hr.IncompatibleCheckpoint) as refused:
        PipelineRun(new, state_dir=state, progress="quiet").start()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"pipeline 'clicks' cannot restart from its checkpoint in {state}/clicks/checkpoint: ")
    assert message.endswith(FRESH)
    return message


def where(pipeline: hr.Pipeline, step: str) -> str:
    return pipeline.plan.nodes[step].defined_at


@pytest.mark.fast
def test_an_unchanged_pipeline_restarts(tmp_path):
    aggs = {"top_url": hr.max("url"), "n": hr.count()}  # stored and read back in their order
    root = Path(ran_with(tmp_path, clicks(aggs=aggs))) / "clicks"
    verdict = check_restart(clicks(aggs=aggs).plan, str(root))
    assert verdict is not None and verdict.allowed
    assert {step.status for step in verdict.steps} == {"kept"}


@pytest.mark.fast
def test_a_renamed_stateful_step_is_refused(tmp_path):
    new = clicks(step="per_window")
    message = refusal(tmp_path, clicks(), new)
    assert ("stateful step 'per_10s' (window, test_upgrade.py:") in message
    assert ("is gone: stateful step 'per_window' took its place, but a stateful step's name is the identity of its "
            "saved state, so a rename would lose it; keep the name 'per_10s'. ") in message


@pytest.mark.fast
def test_a_removed_stateful_step_is_refused(tmp_path):
    old = clicks()
    message = refusal(tmp_path, old, clicks(with_window=False))
    assert (f"stateful step 'per_10s' (window, {where(old, 'per_10s')}) is gone: its saved state would be lost, "
            "and Spark cannot restart a query without a stateful step it had. ") in message


@pytest.mark.fast
def test_an_added_stateful_step_is_refused(tmp_path):
    new = clicks()
    message = refusal(tmp_path, clicks(with_window=False), new)
    assert (f"stateful step 'per_10s' (window, {where(new, 'per_10s')}) is new: Spark cannot add a stateful step "
            "to a query that has already run (it would find no state for it). ") in message


@pytest.mark.fast
def test_a_rekeyed_window_is_refused(tmp_path):
    new = clicks(key="url")
    message = refusal(tmp_path, clicks(), new)
    assert message == (
        f"pipeline 'clicks' cannot restart from its checkpoint in {tmp_path}/clicks/checkpoint: stateful step "
        f"'per_10s' (window, {where(new, 'per_10s')}) changed key fields user_id → url: its saved state was built "
        f"for the old settings. {FRESH}")


def bids_with_sellers() -> hr.Pipeline:
    p = hr.Pipeline("clicks")
    bids = p.source("bids", TestSource([[{"item": 1, "ts": 1_000}]], schema={"item": "long", "ts": "timestamp"}),
                    event_time="ts")
    sellers = p.source("sellers", TestSource([[{"item": 1, "at": 2_000}]], schema={"item": "long", "at": "timestamp"}),
                       event_time="at")
    bids.join(sellers, on="item", window=hr.Tumbling("10s"), name="paired").sink("out", hr.sinks.Null())
    return p


@pytest.mark.fast
def test_a_window_join_checkpoint_of_an_earlier_headrace_is_refused(tmp_path):
    """A window join's checkpoint written before window joins were Spark's own kept its records by the
    window's start, which Spark's window join cannot read: refused, naming the step."""
    state = ran_with(tmp_path, bids_with_sellers())
    stored = tmp_path / "clicks" / "plan.json"
    record = json.loads(stored.read_text())
    for node in record["nodes"]:
        node.pop("state_key", None)
    stored.write_text(json.dumps(record))
    new = bids_with_sellers()
    with pytest.raises(hr.IncompatibleCheckpoint) as refused:
        PipelineRun(new, state_dir=state, progress="quiet").start()
    assert (f"stateful step 'paired' (join, {where(new, 'paired')}) changed window join state by window start "
            "(an earlier headrace) → by window: its saved state was built for the old settings") in str(refused.value)


@pytest.mark.fast
def test_another_window_shape_is_refused(tmp_path):
    message = refusal(tmp_path, clicks(), clicks(window=hr.Session("10s")))
    assert "stateful step 'per_10s' (window, " in message
    assert ("changed window tumbling 10s → session gap 10s: its saved state was built for the old "
            "settings") in message


@pytest.mark.fast
def test_other_aggregates_are_refused(tmp_path):
    message = refusal(tmp_path, clicks(), clicks(aggs={"n": hr.count(), "last_url": hr.max("url")}))
    assert "stateful step 'per_10s' (window, " in message
    assert "changed aggregates n=count() → n=count(), last_url=max(url): its saved state" in message


@pytest.mark.fast
def test_other_emission_is_refused(tmp_path):
    p = clicks()
    q = hr.Pipeline("clicks")
    (q.source("events", hr.sources.Generator("clicks", limit=10_000, rows_per_batch=1000),
              event_time="event_time", max_out_of_orderness="1s")
      .key_by("user_id").window(hr.Tumbling("10s"), allowed_lateness="5s", accumulation="discarding", name="per_10s")
      .aggregate(n=hr.count()).sink("out", hr.sinks.Null()))
    message = refusal(tmp_path, p, q)
    assert ("changed allowed lateness none → 5s, accumulation accumulating → discarding, operator Spark's window "
            "operator → stateful processor: its saved state") in message


@pytest.mark.fast
def test_changed_generator_options_are_refused(tmp_path):
    old = clicks()
    message = refusal(tmp_path, old, clicks(seed=7))
    assert (f"source 'events' (Generator, {where(old, 'events')}) changed seed 0 → 7: the offsets in the checkpoint "
            "would point at other records. ") in message


@pytest.mark.fast
def test_a_renamed_source_is_refused(tmp_path):
    message = refusal(tmp_path, clicks(), clicks(source="clicks"))
    assert ("source 'events' (Generator, test_upgrade.py:") in message
    assert ("is gone: source 'clicks' took its place, but a source's name is the identity of its offsets in the "
            "checkpoint, so a rename would lose them; keep the name 'events'") in message


@pytest.mark.fast
def test_bounded_restarted_as_unbounded_is_refused(tmp_path):
    message = refusal(tmp_path, clicks(), clicks(limit=None))
    assert ("source 'events' (Generator, test_upgrade.py:") in message
    assert ("changed input bounded → unbounded: a bounded run and an unbounded one cannot share a checkpoint (a "
            "bounded run ends by firing every window at the end of time, after which every new record would be "
            "late)") in message


@pytest.mark.fast
def test_a_file_source_keeps_path_format_and_schema(tmp_path):
    def files(schema: str, fail_fast: bool) -> hr.Pipeline:
        p = hr.Pipeline("files")
        p.source("lines", hr.sources.Files(str(tmp_path), schema=schema, fail_fast=fail_fast)).sink("out",
                                                                                                   hr.sinks.Null())
        return p
    base = plan_record(files("word string", False).plan)
    assert compare(base, plan_record(files("word string", True).plan)).allowed
    changed = compare(base, plan_record(files("word string, n long", False).plan))
    assert [str(c) for c in changed.refused[0].changes] == ["schema word string → word string, n long"]


@pytest.mark.fast
def test_stateless_changes_and_new_sinks_are_allowed_without_spark():
    old = clicks()
    new = hr.Pipeline("clicks")
    events = new.source("events", hr.sources.Generator("clicks", limit=20_000, seed=0, rows_per_batch=5000),
                        event_time="event_time", max_out_of_orderness="1s")
    counts = (events.filter(hr.col("url") != "none", name="some_urls").key_by("user_id")
              .window(hr.Tumbling("10s"), name="per_10s").aggregate(n=hr.count()))
    counts.sink("out", hr.sinks.Null())
    counts.sink("audit", hr.sinks.Console())
    verdict = compare(plan_record(old.plan), plan_record(new.plan))
    assert verdict.allowed
    by_name = {step.name: step for step in verdict.steps}
    assert by_name["per_10s"].status == "kept"
    assert by_name["events"].status == "changed"  # limit and rows_per_batch: the offsets keep their meaning
    assert by_name["some_urls"].status == "new"
    assert by_name["audit"].status == "new" and "fresh identity" in by_name["audit"].why
    assert by_name["out"].status == "kept"  # a null sink has no commits to continue, whatever writes it


@pytest.mark.fast
def test_a_file_sink_that_would_change_writer_is_refused(tmp_path):
    def files(*extra: str) -> hr.Pipeline:
        p = hr.Pipeline("clicks")
        counts = (p.source("events", hr.sources.Generator("clicks", limit=10_000), event_time="event_time")
                  .key_by("user_id").window(hr.Tumbling("10s"), name="per_10s").count())
        counts.sink("files", hr.sinks.Files(str(tmp_path / "out"), format="jsonl"))
        for name in extra:
            counts.sink(name, hr.sinks.Null())
        return p
    message = refusal(tmp_path, files(), files("more"))
    assert ("sink 'files' (FileSink, test_upgrade.py:" in message
            and "changed writer Spark's json writer → per-batch commits: the batches it committed one way cannot be "
                "continued the other way (Spark's writer is used only for a pipeline's only sink); keep the sinks "
                "as they were, or point this sink somewhere new. " in message)


# -- explain --against-checkpoint (no Spark) -------------------------------------------------------

PIPELINE_FILE = '''
import os
import headrace as hr

p = hr.Pipeline("clicks")
events = p.source("events", hr.sources.Generator("clicks", limit=10_000, rows_per_batch=1000),
                  event_time="event_time", max_out_of_orderness="1s")
events = events.filter(hr.col("url") != "none", name="some_urls") if os.environ.get("HR_FILTER") else events
counts = events.key_by(os.environ.get("HR_KEY", "user_id")).window(hr.Tumbling("10s"), name="per_10s").count()
counts.sink("out", hr.sinks.Console())
'''


@pytest.mark.fast
def test_explain_against_checkpoint(tmp_path, capsys, monkeypatch):
    path = tmp_path / "clicks.py"
    path.write_text(PIPELINE_FILE)
    state = str(tmp_path / "state")
    assert main(["explain", str(path), "--against-checkpoint", "--state-dir", state]) == 0
    assert capsys.readouterr().out == (f"pipeline 'clicks' ({state}/clicks/checkpoint): no checkpoint with a batch "
                                       "in it: a run starts from the beginning\n")

    from headrace.cli import load_pipeline
    ran_with(Path(state), load_pipeline(str(path)))
    monkeypatch.setenv("HR_FILTER", "1")
    assert main(["explain", str(path), "--against-checkpoint", "--state-dir", state]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"restart of pipeline 'clicks' from {state}/clicks/checkpoint:"
    assert [line.split()[:4] for line in lines[1:-1]] == [
        ["source", "'events'", "(Generator)", "kept"], ["stateful", "step", "'per_10s'", "(window)"],
        ["sink", "'out'", "(Console)", "kept"], ["step", "'some_urls'", "(filter)", "new"],
        ["step", "'key_by'", "(key_by)", "changed:"]]
    assert lines[2].endswith("  kept")
    assert lines[-1] == "the restart keeps the offsets of every source and the state of every stateful step"

    monkeypatch.setenv("HR_KEY", "url")
    assert main(["explain", str(path), "--against-checkpoint", "--state-dir", state]) == 1
    text = capsys.readouterr().out
    assert "stateful step 'per_10s' (window)  refused, changed: key fields user_id → url" in text
    assert text.splitlines()[-1].startswith("the restart would be refused: pipeline 'clicks' cannot restart")

    assert main(["explain", str(path), "--against-checkpoint", "--state-dir", state, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["restart"] == "refused" and report["message"].endswith(FRESH)
    window = next(s for s in report["steps"] if s["name"] == "per_10s")
    assert window["refused"] and window["changes"] == [{"what": "key fields", "old": "user_id", "new": "url"}]


# -- allowed upgrades (Spark) ---------------------------------------------------------------------

SCHEMA = {"key": "string", "value": "long", "ts": "timestamp"}
BATCHES = [
    [{"key": "a", "value": 1, "ts": 1_000}, {"key": "b", "value": 2, "ts": 2_000}],
    [{"key": "a", "value": 3, "ts": 4_000}, {"key": "b", "value": 4, "ts": 11_000}],
    [{"key": "a", "value": 5, "ts": 12_000}, {"key": "a", "value": 6, "ts": 7_000}],
    # the restart comes here: window [0 s, 10 s) of key a is still open, its state in the checkpoint
    [{"key": "a", "value": 7, "ts": 8_000}, {"key": "z", "value": 100, "ts": 9_000}, {"key": "b", "value": 8,
                                                                                       "ts": 13_000}],
    [{"key": "z", "value": 200, "ts": 15_000}, {"key": "a", "value": 9, "ts": 21_000}],
]
FIRST_RUN_STEPS = 3


def times_ten_for_b(record: dict) -> dict:
    return {**record, "value": record["value"] * (10 if record["key"] == "b" else 1)}


def windows(upgrade: str = "") -> tuple[hr.Pipeline, dict[str, TestSink]]:
    """Counts and sums per key per 10 s; ``upgrade`` adds stateless steps or a sink."""
    p = hr.Pipeline("upgraded")
    events = p.source("events", TestSource(BATCHES, schema=SCHEMA), event_time="ts", max_out_of_orderness="5s")
    if upgrade == "steps":
        events = (events.filter(hr.col("key") != "z", name="no_z")
                  .map(times_ten_for_b, schema=SCHEMA, name="times_ten"))
    counts = (events.key_by("key").window(hr.Tumbling("10s"), name="per_10s")
              .aggregate(n=hr.count(), total=hr.sum("value")))
    sinks = {"out": TestSink()}
    counts.sink("out", sinks["out"])
    if upgrade == "sink":
        sinks["audit"] = TestSink()
        counts.sink("audit", sinks["audit"])
    return p, sinks


def rows(batches: dict[int, list[dict]]) -> list[tuple[str, int, int, int]]:
    """(key, window start in s, n, total) of every row."""
    return sorted((r["key"], int(r["window_start"].timestamp()), r["n"], r["total"])
                  for batch in batches.values() for r in batch)


UNINTERRUPTED = [("a", 0, 4, 17), ("a", 10, 1, 5), ("a", 20, 1, 9), ("b", 0, 1, 2), ("b", 10, 2, 12),
                 ("z", 0, 1, 100), ("z", 10, 1, 200)]


@pytest.fixture(scope="module")
def stopped_part_way(spark, tmp_path_factory):
    """The uninterrupted output, and a state dir stopped after three of the five batches."""
    folder = tmp_path_factory.mktemp("upgrade")
    whole, whole_sinks = windows()
    hr.testing.run_to_completion(whole, state_dir=str(folder / "whole"))
    assert rows(whole_sinks["out"].batches) == UNINTERRUPTED

    first, first_sinks = windows()
    steps: list[int] = []

    def stop_after_three(run: PipelineRun) -> None:
        steps.append(1)
        if len(steps) == FIRST_RUN_STEPS:
            run.request_stop("upgrade")
    run = PipelineRun(first, state_dir=str(folder / "parts"), progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=stop_after_three)
    assert not run.exhausted()
    return whole_sinks["out"].batches, str(folder / "parts"), first_sinks["out"].batches


def restart(stopped_part_way, tmp_path, upgrade: str) -> tuple[dict[str, TestSink], dict, str]:
    whole, parts, first_batches = stopped_part_way
    state = str(tmp_path / "state")
    shutil.copytree(parts, state)
    second, sinks = windows(upgrade)
    result = PipelineRun(second, state_dir=state, progress="quiet").start().wait(until_exhausted=True)
    assert result.stopped_by == "input exhausted"
    assert min(sinks["out"].batches) > max(first_batches)  # continued, not started over
    return sinks, {**first_batches, **sinks["out"].batches}, state


def test_added_filter_and_map_keep_the_window_state(stopped_part_way, tmp_path):
    sinks, out, state = restart(stopped_part_way, tmp_path, "steps")
    # The windows that span the restart count the records before it (a: 1 + 3 + 6 | 7; b: 4 | 8 × 10); the new
    # filter drops key z, the new map multiplies b's values after the restart.
    assert rows(out) == [("a", 0, 4, 17), ("a", 10, 1, 5), ("a", 20, 1, 9), ("b", 0, 1, 2), ("b", 10, 2, 84)]
    stored = read_plan(f"{state}/upgraded")  # the upgraded plan is the one stored now
    assert stored is not None and [n["name"] for n in stored["nodes"]][:4] == ["events", "events_event_time",
                                                                               "no_z", "times_ten"]


def test_added_sink_gets_the_output_after_the_restart(stopped_part_way, tmp_path):
    sinks, out, _ = restart(stopped_part_way, tmp_path, "sink")
    assert rows(out) == UNINTERRUPTED
    audit = sinks["audit"].batches
    assert audit == sinks["out"].batches and rows(audit)  # every batch since the restart, and only those


def test_a_refused_upgrade_leaves_the_checkpoint_as_it_was(stopped_part_way, tmp_path):
    _, parts, _ = stopped_part_way
    state = str(tmp_path / "state")
    shutil.copytree(parts, state)
    before = read_plan(f"{state}/upgraded")
    p = hr.Pipeline("upgraded")
    (p.source("events", TestSource(BATCHES, schema=SCHEMA), event_time="ts", max_out_of_orderness="5s")
      .key_by("key").window(hr.Tumbling("20s"), name="per_10s").aggregate(n=hr.count(), total=hr.sum("value"))
      .sink("out", TestSink()))
    with pytest.raises(hr.IncompatibleCheckpoint, match=r"changed window tumbling 10s → tumbling 20s"):
        PipelineRun(p, state_dir=state, progress="quiet").start()
    assert read_plan(f"{state}/upgraded") == before
    with pytest.raises(hr.IncompatibleCheckpoint):  # the old plan cannot be smuggled in either
        PipelineRun(p, state_dir=state, progress="quiet").start()


def counts(ttl: str | None) -> hr.Pipeline:
    p = hr.Pipeline("clicks")
    (p.source("events", hr.sources.Generator("clicks", limit=10_000, seed=0, rows_per_batch=1000))
     .key_by("user_id").aggregate(n=hr.count(), ttl=ttl, name="per_user").sink("out", hr.sinks.Null()))
    return p


@pytest.mark.fast
def test_adding_a_ttl_to_rolling_aggregates_is_refused_and_changing_it_is_allowed(tmp_path):
    message = refusal(tmp_path / "on", counts(None), counts("1h"))
    assert "stateful step 'per_user' (rolling aggregate" in message
    assert "changed ttl none → set" in message
    kept = compare(plan_record(counts("1h").plan), plan_record(counts("2h").plan))
    assert kept.allowed
    assert [str(c) for v in kept.steps if v.name == "per_user" for c in v.changes] == ["ttl_ms 3600000 → 7200000"]


@pytest.mark.fast
def test_a_window_moved_to_another_operator_is_refused():
    sliding = clicks(window=hr.Sliding("10s", "5s"))
    new = plan_record(sliding.plan)
    assert [n["operator"] for n in new["nodes"] if n["name"] == "per_10s"] == ["stateful processor"]
    old = json.loads(json.dumps(new))  # as an earlier headrace that ran sliding windows natively stored it
    next(n for n in old["nodes"] if n["name"] == "per_10s")["operator"] = "Spark's window operator"
    verdict = compare(old, new)
    assert not verdict.allowed
    assert "changed operator Spark's window operator → stateful processor" in verdict.message()


class _Count(hr.Operator):
    records = hr.InputPort()
    out = hr.OutputPort("n long")

    def process(self, record):
        self.out.emit({"n": 1})


class _Other(_Count):
    pass


def with_operator(operator: hr.Operator | None = None, partitions: int = 2, name: str = "count") -> hr.Pipeline:
    p = clicks(with_window=False, sink="raw")
    if operator is not None:
        events = p.plan.nodes["events_event_time"]
        handle = p.add_operator(name, operator, partitions=partitions)
        p.add_stream("in", hr.api.stream.Stream(p, events), handle.records)
        handle.out.stream(name="counted").sink("out", hr.sinks.Null())
    return p


@pytest.mark.fast
def test_an_operator_keeps_its_partitions_and_class_and_may_be_added(tmp_path):
    message = refusal(tmp_path / "a", with_operator(_Count()), with_operator(_Count(), partitions=3))
    assert "stateful step 'count' (operator _Count" in message and "partitions 2 → 3" in message
    message = refusal(tmp_path / "b", with_operator(_Count()), with_operator(_Other()))
    assert "kind operator _Count → operator _Other" in message
    message = refusal(tmp_path / "c", with_operator(_Count()), with_operator(None))
    assert "stateful step 'count' (operator _Count" in message
    assert "is gone: the state its instances saved beside the checkpoint would be lost" in message
    added = compare(plan_record(with_operator(None).plan), plan_record(with_operator(_Count()).plan))
    assert added.allowed, added.message()
