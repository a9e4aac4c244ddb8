"""Several stateful steps in one pipeline (one Spark query): a window's results feed another
window, a process step feeds a window, with each step's watermark; what Spark cannot chain is
refused as the pipeline is built. See docs/windows.md ("Windows of windows")."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.engine.process_logic import ProcessLogic, ProcessState
from headrace.runtime.compatibility import compare, plan_record
from headrace.runtime.failures import classify
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, run_to_completion

S = 1_000
SCHEMA = {"user": "string", "ts": "long"}
# Batches of one-minute counts per user, then five-minute sums and maxima of those counts.
EVENTS = [
    [{"user": "a", "ts": 10 * S}, {"user": "a", "ts": 20 * S}, {"user": "b", "ts": 70 * S},
     {"user": "a", "ts": 130 * S}],                                              # watermark -> 130 s
    [{"user": "a", "ts": 250 * S}, {"user": "b", "ts": 290 * S}, {"user": "a", "ts": 310 * S}],  # -> 310 s
    [{"user": "a", "ts": 100 * S}],                                              # late for minute [60, 120)
]
# (user, start s, end s, count), by hand from EVENTS
MINUTES = [("a", 0, 60, 2), ("a", 120, 180, 1), ("a", 240, 300, 1), ("a", 300, 360, 1),
           ("b", 60, 120, 1), ("b", 240, 300, 1)]
# (user, start s, end s, total, top): the minutes above, by the five minutes their end - 1 µs is in
FIVES = [("a", 0, 300, 4, 2), ("a", 300, 600, 1, 1), ("b", 0, 300, 2, 1)]


def seconds(value: datetime.datetime) -> int:
    return int(value.timestamp())


def minute_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["user"], seconds(r["window_start"]), seconds(r["window_end"]), r["count"]) for r in rows)


def five_rows(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted((r["user"], seconds(r["window_start"]), seconds(r["window_end"]), r["total"], r["top"])
                  for r in rows)


def two_stages(name: str) -> tuple[hr.Pipeline, TestSink, TestSink]:
    p = hr.Pipeline(name)
    events = p.source("events", TestSource(EVENTS, schema=SCHEMA), event_time="ts")
    minutes = events.key_by("user").window(hr.Tumbling("1m"), name="per_minute").count()
    fives = (minutes.filter(hr.col("count") > 0).key_by("user")
             .window(hr.Tumbling("5m"), name="per_five").aggregate(total=hr.sum("count"), top=hr.max("count")))
    minute_sink, five_sink = TestSink(), TestSink()
    minutes.sink("minutes", minute_sink)
    fives.sink("fives", five_sink)
    return p, minute_sink, five_sink


def test_windows_of_windows_and_the_second_watermark(spark, tmp_path):
    p, minute_sink, five_sink = two_stages("stages_windows")
    seen: list[tuple[int, int]] = []  # (minute rows, five-minute rows) after each input step settles
    run_to_completion(p, state_dir=str(tmp_path),
                      on_step=lambda run: seen.append((len(minute_sink.rows()), len(five_sink.rows()))))
    assert minute_rows(minute_sink.rows()) == MINUTES
    assert five_rows(five_sink.rows()) == FIVES
    # The watermark at 130 s closed two minutes and held every five minutes back; at 310 s the
    # first five minutes closed in the same micro-batch as the minutes in them.
    assert seen[0] == (2, 0)
    assert seen[1] == (5, 2)
    assert set(minute_sink.rows()[0]) == {"user", "window_start", "window_end", "count"}  # no hidden column


class Running(hr.KeyedProcessFunction):
    """The running total of a user's minute counts, one record per minute result (at its time)."""

    total = hr.ValueState(default=0)

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        self.total.set(self.total.get() + record["count"])
        ctx.emit({"user": ctx.key, "running": self.total.get()})


def test_a_processor_window_then_a_process_step_then_a_window(spark, tmp_path):
    p = hr.Pipeline("stages_process")
    events = p.source("events", TestSource(EVENTS, schema=SCHEMA), event_time="ts")
    minutes = (events.key_by("user")  # an early trigger: the window runs on the stateful processor
               .window(hr.Tumbling("1m"), trigger=hr.AfterWatermark(early=hr.EveryN(100)), name="per_minute")
               .count())
    running = minutes.key_by("user").process(Running(), schema={"user": "string", "running": "long"},
                                             name="running")
    peaks = running.key_by("user").window(hr.Tumbling("5m"), name="peaks").aggregate(peak=hr.max("running"))
    sink = TestSink()
    peaks.sink("peak_rows", sink)
    assert "lowered as: stateful processor" in p.explain()
    run_to_completion(p, state_dir=str(tmp_path))
    # running totals: a 2, 3, 4 in [0, 5m) and 5 in [5m, 10m); b 1, 2 in [0, 5m)
    got = sorted((r["user"], seconds(r["window_start"]), r["peak"]) for r in sink.rows())
    assert got == [("a", 0, 4), ("a", 300, 5), ("b", 0, 2)]


class Shifted(hr.KeyedProcessFunction):
    """Each purchase, emitted at its event time plus 50 s."""

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        assert ctx.timestamp is not None
        ctx.emit({"user": ctx.key, "amount": record["amount"]}, timestamp=ctx.timestamp + 50 * S)


def test_a_process_step_emitting_with_timestamps_then_a_join_then_a_window(spark, tmp_path):
    p = hr.Pipeline("stages_timestamps")
    purchases = [[{"user": "a", "amount": 5, "ts": 5 * S}, {"user": "b", "amount": 7, "ts": 20 * S}],
                 [{"user": "a", "amount": 1, "ts": 65 * S}]]
    teams = p.table("teams", [{"user": "a", "team": "red"}, {"user": "b", "team": "red"}])
    shifted = (p.source("purchases", TestSource(purchases, schema={"user": "string", "amount": "long", "ts": "long"}),
                        event_time="ts")
               .key_by("user").process(Shifted(), schema={"user": "string", "amount": "long"}, name="shifted"))
    totals = (shifted.join(teams, on="user").key_by("team")
              .window(hr.Tumbling("1m"), name="per_team").aggregate(total=hr.sum("amount")))
    sink = TestSink()
    totals.sink("totals", sink)
    run_to_completion(p, state_dir=str(tmp_path))
    # at 55 s, 70 s and 115 s: b's purchase moved into the second minute, a's second stayed there
    got = sorted((r["team"], seconds(r["window_start"]), r["total"]) for r in sink.rows())
    assert got == [("red", 0, 5), ("red", 60, 8)]


def test_a_chain_restarts_from_its_checkpoint_with_the_same_output(spark, tmp_path):
    state = str(tmp_path / "state")
    first, minutes, fives = two_stages("stages_restart")
    run = PipelineRun(first, state_dir=state, progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=lambda r: r.request_stop("test"))  # after the first step
    assert not run.exhausted()
    assert five_rows(fives.rows()) == []
    second, minutes_after, fives_after = two_stages("stages_restart")
    minutes_after.batches.update(minutes.batches)  # the same sinks, across the restart
    fives_after.batches.update(fives.batches)
    PipelineRun(second, state_dir=state, progress="quiet").start().wait(until_exhausted=True)
    assert minute_rows(minutes_after.rows()) == MINUTES
    assert five_rows(fives_after.rows()) == FIVES


def test_sigkill_of_a_chain_then_restart_gives_the_uninterrupted_output(tmp_path):
    """Three stateful steps in one query (minute counts, a process step's running totals, five-minute
    peaks) survive a SIGKILL of the driver's process group: the output equals the one computed here
    in plain Python. Each file is a micro-batch of one minute's events, so each micro-batch closes
    one minute per user and the process step sees one record per user and batch; the last file's
    event at 1 hour closes every window before it."""
    import json
    from collections import defaultdict
    from pathlib import Path

    from driver_process import KilledRun

    minutes = 6
    files = [[{"user": user, "ts": (60 * minute + second) * S} for user in ("a", "b")[: 1 + minute % 2]
              for second in range(5, 5 + (minute * 7 + len(user)) % 4 + 1)] for minute in range(minutes)]
    files.append([{"user": "z", "ts": 3600 * S}])
    folder = tmp_path / "input"
    folder.mkdir()
    for number, records in enumerate(files):
        write_in_order(folder / f"part-{number:02d}.jsonl", "".join(json.dumps(r) + "\n" for r in records), number)
    counts: dict[tuple[str, int], int] = defaultdict(int)  # (user, minute) -> events
    for records in files[:-1]:
        for record in records:
            counts[record["user"], record["ts"] // (60 * S)] += 1
    running: dict[str, int] = defaultdict(int)
    peaks: dict[tuple[str, int], tuple[int, int]] = {}  # (user, five-minute start s) -> (peak, minutes)
    for user, minute in sorted(counts, key=lambda key: (key[1], key[0])):
        running[user] += counts[user, minute]
        peak, seen = peaks.get((user, minute // 5 * 300), (0, 0))
        peaks[user, minute // 5 * 300] = (max(peak, running[user]), seen + 1)
    expected = sorted((user, start, peak, seen) for (user, start), (peak, seen) in peaks.items())

    args = {"name": "stages_killed", "input": str(folder), "state_dir": str(tmp_path / "state"),
            "out": str(tmp_path / "out")}
    run = KilledRun(Path(__file__).resolve().parent / "stages_driver.py", args, tmp_path / "driver.log")
    run.kill_after(4)
    assert run.committed() < len(files), "the driver should have been killed mid-stream"
    run.restart_until("every five minutes written", lambda: len(run.written()) >= len(expected))
    got = sorted((r["user"], seconds(datetime.datetime.fromisoformat(r["window_start"])), r["peak"], r["minutes"])
                 for r in run.written())
    assert got == expected


# -- explain and what the plan refuses --------------------------------------------------------------

@pytest.mark.fast
def test_explain_says_where_each_watermark_comes_from():
    p, _, _ = two_stages("stages_explain")
    lines = p.explain().splitlines()
    marks = [line.strip() for line in lines if line.strip().startswith("watermark:")]
    assert marks == [
        "watermark: the event-time declaration 'events_event_time' (field 'ts', max out-of-orderness 0 ms)",
        "watermark: the results of window 'per_minute' (Spark's watermark after it; each result at its window's "
        "end - 1 µs)",
    ]


def events(p: hr.Pipeline, name: str = "events") -> hr.KeyedStream:
    return p.source(name, TestSource([], schema=SCHEMA), event_time="ts").key_by("user")


def refused(pattern: str) -> Any:
    return pytest.raises(hr.PlanError, match=pattern)


@pytest.mark.fast
def test_what_spark_cannot_chain_is_refused_with_the_reason():
    p = hr.Pipeline("stages_refused")
    minutes = events(p).window(hr.Tumbling("1m"), name="per_minute").count()
    where = r"\(test_multi_stage.py:\d+\)"
    with refused(rf"^step 'again' {where}: it reads the results of window 'per_minute' {where}, and this step "
                 r"emits updates \(Spark's update mode\), and Spark runs stateful steps one after another in one "
                 r"query only in append mode \(use emit='final'\); sink those results and continue in another "
                 r"pipeline$"):
        minutes.key_by("user").window(hr.Tumbling("5m"), name="again").count(emit="updates")
    updating = events(p, "more").window(hr.Tumbling("1m"), name="updating").count(emit="updates")
    with refused(rf"^step 'after' {where}: it reads the results of window 'updating' {where}, which emits "
                 r"updates \(Spark's update mode\)"):
        updating.key_by("user").window(hr.Tumbling("5m"), name="after").count()
    late = events(p, "late").window(hr.Tumbling("1m"), allowed_lateness="10s", name="lateness").count()
    with refused(rf"^step 'after_late' {where}: it reads the results of window 'lateness' {where}, which has "
                 r"allowed lateness: its late panes come after the watermark passed their window, and Spark refuses "
                 r"to hand a later stateful step rows older than the watermark"):
        late.key_by("user").window(hr.Tumbling("5m"), name="after_late").count()
    with refused(rf"^step 'total' {where}: it reads the results of window 'per_minute' {where}, and this step is "
                 "a rolling aggregate"):
        minutes.key_by("user").sum("count", name="total")
    with refused(rf"^step 'sql_total' {where}: it reads the results of window 'per_minute' {where}, and this "
                 r"step is an SQL query, and headrace carries the event time of results into and out of fluent "
                 "steps only"):
        p.sql("SELECT user, sum(`count`) AS n FROM per_minute GROUP BY user", name="sql_total")
    with refused(rf"^step 'redeclared' {where}: it reads the results of window 'per_minute' {where}, through the "
                 rf"event-time declaration 'again_time' {where}: a watermark declared again after a stateful step"):
        (minutes.with_event_time("window_start", name="again_time").key_by("user")
         .window(hr.Tumbling("5m"), name="redeclared").count())


@pytest.mark.fast
def test_a_stream_without_event_time_after_a_stateful_step_says_why():
    p = hr.Pipeline("stages_untimed")
    minutes = events(p).window(hr.Tumbling("1m"), name="per_minute").count()
    mapped = minutes.map(lambda r: {"user": r["user"], "n": r["count"]}, schema={"user": "string", "n": "long"},
                         name="rename")
    with refused(r"^step 'five' \(test_multi_stage.py:\d+\): the stream from 'key_by_2' has no event time: step "
                 r"'rename' \(test_multi_stage.py:\d+\) drops the event time of the results of window 'per_minute': "
                 "Spark cannot follow a watermark through a Python step"):
        mapped.key_by("user").window(hr.Tumbling("5m"), name="five").count()
    pairs = events(p, "more").window(hr.Count(2), name="pairs").count()
    with refused(r"^step 'timed' \(test_multi_stage.py:\d+\): the stream from 'key_by_4' has no event time: the "
                 r"results of window 'pairs' \(test_multi_stage.py:\d+\) carry no event time: its panes fire by "
                 "count, not by the watermark"):
        pairs.key_by("user").window(hr.Tumbling("5m"), name="timed").count()
    # count windows of count windows need no event time: Spark runs them in one query
    pairs.key_by("user").window(hr.Count(2), name="pairs_of_pairs").aggregate(n=hr.sum("count"))


@pytest.mark.fast
def test_a_restart_is_refused_when_the_chain_changes():
    old, _, _ = two_stages("stages_compat")
    swapped = hr.Pipeline("stages_compat")
    source = swapped.source("events", TestSource(EVENTS, schema=SCHEMA), event_time="ts")
    first = source.key_by("user").window(hr.Tumbling("1m"), name="per_five").count()
    second = first.key_by("user").window(hr.Tumbling("5m"), name="per_minute").aggregate(
        total=hr.sum("count"), top=hr.max("count"))
    first.sink("minutes", TestSink())
    second.sink("fives", TestSink())
    verdict = compare(plan_record(old.plan), plan_record(swapped.plan))
    assert not verdict.allowed
    message = verdict.message()
    assert ("stateful step 'per_minute' (window, test_multi_stage.py:" in message
            and "changed stateful steps it reads the results of none → per_five" in message), message
    assert "changed stateful steps it reads the results of per_minute → none" in message
    alone = hr.Pipeline("stages_compat")
    alone_minutes = (alone.source("events", TestSource(EVENTS, schema=SCHEMA), event_time="ts")
                     .key_by("user").window(hr.Tumbling("1m"), name="per_minute").count())
    alone_minutes.sink("minutes", TestSink())
    gone = compare(plan_record(old.plan), plan_record(alone.plan)).message()
    assert "stateful step 'per_five' (window, test_multi_stage.py:" in gone and "is gone" in gone


# -- emit(timestamp=) -----------------------------------------------------------------------------

class Emits(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.emit({"n": record["n"]})
        ctx.emit({"n": record["n"]}, timestamp=datetime.datetime(1970, 1, 1, 0, 1, tzinfo=datetime.UTC))
        if record["n"] < 0:
            ctx.emit({"n": 0}, timestamp="soon")


@pytest.mark.fast
def test_emit_takes_a_timestamp_in_milliseconds_or_a_datetime():
    logic = ProcessLogic("emits", Emits(), (("n", "long"),), True, "Emits.process", timed=True)
    rows = logic.run(ProcessState(), [("k", 5_000, {"n": 1})], watermark=None, now=0)
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    assert rows == [(1, epoch + datetime.timedelta(seconds=5)), (1, epoch + datetime.timedelta(minutes=1))]
    with pytest.raises(hr.StepFunctionError, match=r"emit\(timestamp=...\) takes epoch milliseconds \(int\) or a "
                                                   r"datetime, got 'soon'"):
        logic.run(ProcessState(), [("k", 5_000, {"n": -1})], watermark=None, now=0)


@pytest.mark.fast
def test_a_result_behind_the_watermark_fails_naming_the_step():
    p = hr.Pipeline("stages_behind")
    running = events(p).process(Running(), schema={"user": "string", "running": "long"}, name="running")
    running.key_by("user").window(hr.Tumbling("1m"), name="per_minute").count().sink("out", TestSink())
    spark_says = ("[EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED] Previous node emitted a row with "
                  "eventTime=5000000 which is older than current_watermark_value=9000")
    failure = classify(p.plan, RuntimeError(spark_says))
    assert not failure.restartable
    assert str(failure.error) == (
        "step 'running' (test_multi_stage.py:" + p.plan.nodes["running"].defined_at.split(":")[1] + "): a result "
        "was emitted at an event time at or behind the watermark (event time 5000 ms, watermark 9000 ms), and "
        "Spark refuses to hand such a row to a later stateful step; a process step must emit with timestamp= "
        "later than ctx.watermark (e.g. max(ctx.timestamp, ctx.watermark + 1))")


# -- a window over a window's results, by Python functions, into several sinks ----------------------

# Batches of (user, ts ms): 1 s sliding counts every 1 s... the second batch's first record is late
# (all its sliding windows ended at or before the watermark, 6.5 s, that the first batch left).
NESTED = [
    [{"user": "a", "ts": 100}, {"user": "a", "ts": 900}, {"user": "b", "ts": 1_500}, {"user": "a", "ts": 2_200},
     {"user": "a", "ts": 3_700}, {"user": "b", "ts": 6_500}],
    [{"user": "a", "ts": 1_200}, {"user": "b", "ts": 6_900}, {"user": "a", "ts": 7_100}],
    [{"user": "a", "ts": 9_300}, {"user": "b", "ts": 12_000}],
]


def sliding_then_tumbling(batches: list[list[dict[str, Any]]], size: int, slide: int, outer: int) -> list[tuple]:
    """Plain Python: per user, sliding counts (``size``/``slide`` ms; a record whose windows all
    ended at or before the maximum event time of the batches before it is late), then per
    ``outer`` ms tumbling window of those counts' ends - 1 µs: (user, start s, windows, total)."""
    counts: dict[tuple[str, int], int] = {}
    watermark = -1
    for batch in batches:
        for record in batch:
            starts = range(record["ts"] // slide * slide, record["ts"] - size, -slide)
            if all(start + size <= watermark for start in starts):
                continue  # late
            for start in starts:
                counts[record["user"], start] = counts.get((record["user"], start), 0) + 1
        watermark = max([watermark, *(r["ts"] for r in batch)])
    outer_windows: dict[tuple[str, int], list[int]] = {}
    for (user, start), n in counts.items():
        end_us = (start + size) * 1_000 - 1  # the result's event time, in µs
        outer_windows.setdefault((user, end_us // (outer * 1_000) * outer), []).append(n)
    return sorted((user, start // 1_000, len(ns), sum(ns)) for (user, start), ns in outer_windows.items())


def summed(user: str, bounds: tuple[int, int], records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # a default window adds no pane columns: a result may be called pane_kind
    return [{"windows": len(records), "total": sum(r["count"] for r in records), "pane_kind": "sum"}]


SUMMED = {"windows": "long", "total": "long", "pane_kind": "string"}


def nested_rows(rows: list[dict[str, Any]]) -> list[tuple]:
    assert all(r["pane_kind"] == "sum" for r in rows)
    return sorted((r["user"], seconds(r["window_start"]), r["windows"], r["total"]) for r in rows)


def test_a_window_process_step_over_window_results_gets_every_result(spark, tmp_path):
    """The results a window emits when the watermark passes them are behind that watermark; the
    window after it takes them (as Spark's chained operators do), drops only what was late for the
    first window, and no late record or internal column reaches a sink, Spark's own file writer
    included."""
    import json

    expected = sliding_then_tumbling(NESTED, 2_000, 1_000, 4_000)
    assert len(expected) == 6 and sum(total for *_, total in expected) == 2 * (len(sum(NESTED, [])) - 1)
    outputs = {}
    for sink in (TestSink(), hr.sinks.Files(str(tmp_path / "out"), "jsonl")):
        p = hr.Pipeline("stages_nested")
        counts = (p.source("events", TestSource(NESTED, schema=SCHEMA), event_time="ts").key_by("user")
                  .window(hr.Sliding("2s", "1s"), name="sliding").count())
        nested = counts.key_by("user").window(hr.Tumbling("4s"), name="outer").process(
            summed, schema=SUMMED)
        nested.sink("out", sink)
        run = PipelineRun(p, state_dir=str(tmp_path / type(sink).__name__), progress="quiet")
        assert run.start().wait(until_exhausted=True).late_rows_dropped == 1
        if isinstance(sink, TestSink):
            rows = sink.rows()
        else:
            assert "Spark's own json streaming sink" in p.explain()
            rows = [json.loads(line) for path in sorted((tmp_path / "out").glob("part-*.json"))
                    for line in path.read_text().splitlines() if line]
            for row in rows:
                row["window_start"] = datetime.datetime.fromisoformat(row["window_start"])
        assert {tuple(row) for row in rows} == {tuple(dict(p.plan.nodes["outer"].schema))}
        outputs[type(sink).__name__] = nested_rows(rows)
    assert outputs == {"TestSink": expected, "FileSink": expected}


def test_a_window_of_windows_into_two_sinks_beside_dead_letters(spark, tmp_path):
    """Files in (two unparseable lines among them) -> 1 s counts -> a 3 s window process step over
    them -> a test sink and a file sink; the dead letters -> a test sink. Each against plain Python."""
    import json

    files = [[{"user": "a", "ts": 200}, "not json", {"user": "b", "ts": 700}, {"user": "a", "ts": 1_300}],
             [{"user": "a", "ts": 2_500}, {"user": "b", "ts": 2_900}, '{"user": "c", "ts": "soon"}'],
             [{"user": "a", "ts": 4_100}, {"user": "b", "ts": 5_600}, {"user": "a", "ts": 8_000}]]
    folder = tmp_path / "in"
    folder.mkdir()
    for number, lines in enumerate(files):
        text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
        write_in_order(folder / f"part-{number}.jsonl", text, number)
    good = [[line for line in lines if isinstance(line, dict)] for lines in files]
    expected = sliding_then_tumbling(good, 1_000, 1_000, 3_000)  # a tumbling window is a sliding one
    bad = sorted(line for lines in files for line in lines if isinstance(line, str))

    p = hr.Pipeline("stages_two_sinks")
    events = p.source("events", hr.sources.Files(str(folder), "jsonl", schema=SCHEMA, bounded=True),
                      event_time="ts")
    seconds_counts = events.key_by("user").window(hr.Tumbling("1s"), name="per_second").count()
    nested = seconds_counts.key_by("user").window(hr.Tumbling("3s"), name="per_three").process(summed, schema=SUMMED)
    rows, letters = TestSink(), TestSink()
    nested.sink("rows", rows)
    nested.sink("files", hr.sinks.Files(str(tmp_path / "out"), "jsonl"))
    p.dead_letters().sink("letters", letters)
    run_to_completion(p, state_dir=str(tmp_path / "state"))
    written = [json.loads(line) for path in sorted((tmp_path / "out").glob("batch-*/part-*.json"))
               for line in path.read_text().splitlines() if line]
    for row in written:
        row["window_start"] = datetime.datetime.fromisoformat(row["window_start"])
    columns = {tuple(dict(p.plan.nodes["per_three"].schema))}
    assert {tuple(r) for r in rows.rows()} == {tuple(r) for r in written} == columns
    assert nested_rows(rows.rows()) == nested_rows(written) == expected
    assert sorted(r["raw"] for r in letters.rows()) == bad
