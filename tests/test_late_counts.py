"""Late records dropped by Spark's own window operator are counted record by record, the same
through every front door (the fluent API, SQL, a pipeline file), and the windows are what plain
Python makes of the same micro-batches with the rules of docs/semantics.md and the shared
conformance reference: each micro-batch is judged against the watermark the batches before it
left (the largest event time seen less the out-of-orderness), and a record is dropped as late
when its every window ends at or before it."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

SIZE_MS, SLIDE_MS, DELAY_MS = 10_000, 5_000, 2_000
START_MS = 1_700_000_000_000


def out_of_order_batches() -> list[list[dict[str, Any]]]:
    """Eight micro-batches ten seconds of event time apart, a third of each batch's records from
    5 to 40 seconds back: several late records share a user and a window in a batch."""
    draw = random.Random(7)
    batches = []
    for number in range(8):
        now = START_MS + number * 10_000
        batches.append([{"user": draw.choice("abcde"),
                         "ts": now - (draw.randint(5_000, 40_000) if draw.random() < 0.3 else draw.randint(0, 4_000))}
                        for _ in range(60)])
    return batches


BATCHES = out_of_order_batches()


def window_starts(ts: int, size: int, slide: int) -> list[int]:
    last = ts - ts % slide
    return [start for start in range(last - size + slide, last + 1, slide) if start <= ts < start + size]


def expected(size: int, slide: int, judged_by_batch_before: bool = False) -> tuple[list[int], Counter[tuple[str, int]]]:
    """Plain Python: each batch's records dropped as late, and the count of each (user, window start)."""
    watermark, previous, seen = float("-inf"), float("-inf"), float("-inf")
    late, counts = [], Counter()
    for batch in BATCHES:
        judged_by = previous if judged_by_batch_before else watermark
        dropped = 0
        for record in batch:
            open_windows = [s for s in window_starts(record["ts"], size, slide) if s + size > judged_by]
            dropped += not open_windows
            counts.update((record["user"], start) for start in open_windows)
        late.append(dropped)
        seen = max(seen, max(record["ts"] for record in batch))
        previous, watermark = watermark, max(watermark, seen - DELAY_MS)
    return late, counts


def events(p: hr.Pipeline) -> Any:
    return p.source("events", TestSource(BATCHES, schema="user string, ts timestamp"), event_time="ts",
                    max_out_of_orderness=f"{DELAY_MS}ms")


def fluent(shape: Any) -> hr.Pipeline:
    p = hr.Pipeline("late_fluent")
    events(p).key_by("user").window(shape).aggregate(n=hr.count()).sink("out", TestSink())
    return p


def sql(window: str) -> hr.Pipeline:
    p = hr.Pipeline("late_sql")
    events(p)
    p.sql(f"SELECT user, window, count(*) AS n FROM events GROUP BY user, {window}", name="per_user").sink(
        "out", TestSink())
    return p


def pipeline_file(folder: Path) -> hr.Pipeline:
    path = folder / "late.yaml"
    path.write_text(f"""
pipeline: late_file
sources:
  events:
    type: TestSource
    batches: {json.dumps(BATCHES)}
    schema: "user string, ts timestamp"
    event_time: ts
    max_out_of_orderness: {DELAY_MS}ms
steps:
  - name: by_user
    from: events
    key_by: user
  - name: per_user
    from: by_user
    window:
      tumbling: {SIZE_MS}ms
      aggregate: {{n: count}}
sinks:
  out: {{type: TestSink, from: per_user}}
""")
    return hr.load_pipeline_file(str(path))


def run(p: hr.Pipeline, state: Path) -> tuple[PipelineRun, Any]:
    started = PipelineRun(p, state_dir=str(state), progress="quiet").start()
    return started, started.wait()


def windows_of(p: hr.Pipeline) -> Counter[tuple[str, int]]:
    sink = p.plan.nodes["out"].connector
    return Counter({(row["user"], int(row["window_start"].timestamp() * 1000)): row["n"] for row in sink.rows()})


@pytest.mark.parametrize("door", ["fluent", "sql", "pipeline file"])
def test_late_records_of_a_tumbling_window_are_counted_one_by_one_through_every_front_door(spark, tmp_path, door):
    p = {"fluent": lambda: fluent(hr.Tumbling(f"{SIZE_MS}ms")), "sql": lambda: sql("window(ts, '10 seconds')"),
         "pipeline file": lambda: pipeline_file(tmp_path)}[door]()
    late, counts = expected(SIZE_MS, SIZE_MS)
    assert sum(late) > 0 and any(n > 1 for n in Counter(late).values())  # the data has what it takes

    running, result = run(p, tmp_path / "state")

    assert windows_of(p) == counts
    assert [f["late_rows_dropped"] for f in running.batches.figures if f["input_rows"]] == late
    assert result.late_rows_dropped == sum(late)


@pytest.mark.parametrize("door", ["fluent", "sql"])
def test_a_sliding_windows_late_record_is_counted_once(spark, tmp_path, door):
    """A record counts as late once its every window has ended (Spark's operator drops each
    window's row, and counted a record once for each window it missed)."""
    p = (fluent(hr.Sliding(f"{SIZE_MS}ms", f"{SLIDE_MS}ms")) if door == "fluent"
         else sql("window(ts, '10 seconds', '5 seconds')"))
    late, counts = expected(SIZE_MS, SLIDE_MS)

    running, result = run(p, tmp_path / "state")

    assert windows_of(p) == counts
    assert [f["late_rows_dropped"] for f in running.batches.figures if f["input_rows"]] == late
    assert result.late_rows_dropped == sum(late)


def test_a_session_windows_late_records_are_counted_one_by_one(spark, tmp_path):
    """A record whose session would end at or before the watermark (t + gap, checked before it
    merges with any other) is late; the sessions themselves are tests/test_sql.py's."""
    gap_ms = 3_000
    watermark, seen, late = float("-inf"), float("-inf"), []
    for batch in BATCHES:
        late.append(sum(1 for record in batch if record["ts"] + gap_ms <= watermark))
        seen = max(seen, max(record["ts"] for record in batch))
        watermark = max(watermark, seen - DELAY_MS)
    p = hr.Pipeline("late_sessions")
    events(p)
    p.sql("SELECT user, session_window, count(*) AS n FROM events GROUP BY user, session_window(ts, '3 seconds')",
          name="sessions").sink("out", TestSink())

    running, result = run(p, tmp_path / "state")

    assert [f["late_rows_dropped"] for f in running.batches.figures if f["input_rows"]] == late
    assert result.late_rows_dropped == sum(late) > 0
    kept = sum(len(batch) for batch in BATCHES) - sum(late)
    assert sum(row["n"] for row in p.plan.nodes["out"].connector.rows()) == kept


def test_beside_another_stateful_step_an_sql_window_judges_by_the_batch_before(spark, tmp_path):
    """With two stateful steps, Spark judges a micro-batch's late rows against the watermark of
    the batch before (docs/semantics.md), and the SQL window's count follows it; the fluent
    window beside it runs on headrace's processor, which judges by the batch's own. The batches
    come from files, one a batch, so that each follows the one before with no batch between."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    for number, batch in enumerate(BATCHES):
        path = inbox / f"{number}.jsonl"
        path.write_text("".join(json.dumps(record) + "\n" for record in batch))
        os.utime(path, (START_MS // 1000 + number,) * 2)  # Spark takes the oldest file first
    late, counts = expected(SIZE_MS, SIZE_MS, judged_by_batch_before=True)
    processor_late, _ = expected(2 * SIZE_MS, 2 * SIZE_MS)
    p = hr.Pipeline("late_two_steps")
    stream = p.source("events", hr.sources.Files(str(inbox), schema="user string, ts timestamp", bounded=True,
                                                 max_files_per_batch=1),
                      event_time="ts", max_out_of_orderness=f"{DELAY_MS}ms")
    p.sql("SELECT user, window, count(*) AS n FROM events GROUP BY user, window(ts, '10 seconds')",
          name="per_user").sink("out", TestSink())
    stream.key_by("user").window(hr.Tumbling(f"{2 * SIZE_MS}ms")).count().sink("wider", TestSink())

    running, result = run(p, tmp_path / "state")

    assert windows_of(p) == counts
    assert [f["late_rows_dropped"] for f in running.batches.figures if f["input_rows"]] == [
        sql + processor for sql, processor in zip(late, processor_late)]
    assert result.late_rows_dropped == sum(late) + sum(processor_late)


def test_a_run_stopped_halfway_goes_on_judging_by_the_watermark_of_its_checkpoint(spark, tmp_path):
    """The second run's first batch is judged by the watermark the checkpoint holds for it."""
    p = fluent(hr.Tumbling(f"{SIZE_MS}ms"))
    late, counts = expected(SIZE_MS, SIZE_MS)
    first = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()

    def stop_after_three_batches(running: PipelineRun) -> None:
        if sum(1 for f in running.batches.figures if f["input_rows"]) >= 3:
            running.request_stop("test: halfway")

    first.wait(on_settled=stop_after_three_batches)
    second, _ = run(p, tmp_path / "state")

    per_batch = [f["late_rows_dropped"] for r in (first, second) for f in r.batches.figures if f["input_rows"]]
    assert per_batch == late and 3 <= sum(1 for f in first.batches.figures if f["input_rows"]) < len(BATCHES)
    assert windows_of(p) == counts


# -- the watermark a micro-batch judges late rows by, read from the checkpoint (no JVM) ----------------

def write_log(checkpoint: Path, offsets: dict[int, int], commits: dict[int, int]) -> None:
    """Spark's offset log (each batch's watermark) and commit log (the next batch's), by batch id."""
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "commits").mkdir()
    for batch, watermark in offsets.items():
        (checkpoint / "offsets" / str(batch)).write_text(
            "v1\n" + json.dumps({"batchWatermarkMs": watermark, "batchTimestampMs": 0, "conf": {}}) + "\n{}\n")
    for batch, watermark in commits.items():
        (checkpoint / "commits" / str(batch)).write_text("v1\n" + json.dumps({"nextBatchWatermarkMs": watermark}))


@pytest.mark.fast
@pytest.mark.parametrize("committed, several, first", [
    (1, False, 3_000),  # batch 2 logged, not committed: Spark runs it again, with its own watermark
    (1, True, 2_000),   # ... judged by the batch before's
    (2, False, 4_000),  # batch 2 committed: batch 3 runs with the watermark Spark committed for it
    (2, True, 3_000),   # ... judged by batch 2's
])
def test_the_first_batch_of_a_run_is_judged_by_the_watermark_of_the_checkpoint(tmp_path, committed, several, first):
    from headrace.spark.late_counts import first_watermark_ms

    next_watermarks = {0: 2_000, 1: 3_000, 2: 4_000}
    write_log(tmp_path, {0: 0, 1: 2_000, 2: 3_000}, {n: next_watermarks[n] for n in range(committed + 1)})
    assert first_watermark_ms(str(tmp_path), several) == first
    assert first_watermark_ms(str(tmp_path / "fresh"), several) == 0


@pytest.mark.fast
def test_a_batch_planned_with_a_watermark_ahead_of_sparks_is_refused(tmp_path):
    """A file ahead of the watermark Spark logged for the batch would drop rows that are on time."""
    from headrace.spark.late_counts import PerBatch, prepare

    write_log(tmp_path, {0: 0, 1: 2_000}, {0: 2_000})
    prepare(str(tmp_path), several=False)  # batch 1 runs again, judged by 2 s
    PerBatch(str(tmp_path), several=False).check(1)
    (tmp_path / "offsets" / "1").write_text("v1\n" + json.dumps({"batchWatermarkMs": 1_500}) + "\n")
    with pytest.raises(hr.HeadraceError) as refused:
        PerBatch(str(tmp_path), several=False).check(1)
    assert str(refused.value) == (
        "micro-batch 1 was planned to drop the rows of windows ending at or before 2000000 µs as late, but Spark "
        "judges it by the watermark 1500000 µs: it would drop rows that are on time; restart the pipeline (its "
        "checkpoint gives the watermark again)")


@pytest.mark.fast
def test_a_pipeline_with_a_window_on_sparks_operator_commits_its_one_sink_per_batch(tmp_path):
    """The watermark each micro-batch judges late rows by reaches the query in foreachBatch, so a
    sink Spark's own writer would write alone commits per batch there; without such a window it
    stays Spark's."""
    from headrace.spark.specs import native_sink_format

    def files(windowed: bool) -> hr.Pipeline:
        p = hr.Pipeline("files_out")
        stream = events(p)
        if windowed:
            stream = stream.key_by("user").window(hr.Tumbling("10s")).count()
        stream.sink("out", hr.sinks.Files(str(tmp_path / "out"), format="jsonl"))
        return p

    assert native_sink_format(files(False).plan, files(False).plan.nodes["out"]) == "json"
    assert native_sink_format(files(True).plan, files(True).plan.nodes["out"]) is None
