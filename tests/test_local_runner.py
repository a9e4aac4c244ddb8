"""The local runner (``headrace.testing.run_locally``): pipelines run in plain Python, no JVM.
Expected outputs are written by hand or from plain-Python reasoning in each test."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import headrace as hr
from headrace.errors import PlanError, StepFunctionError
from headrace.testing import ProcessingTime, TestSink, TestSource, Watermark, run_locally
from headrace.testing.conformance import LOCAL, check

pytestmark = pytest.mark.fast

CASES = json.loads((Path(__file__).resolve().parent / "conformance" / "cases.json").read_text())
UTC = datetime.UTC
SCHEMA = {"key": "string", "value": "long", "ts": "timestamp"}


def at(ms: int) -> datetime.datetime:
    return datetime.datetime(1970, 1, 1, tzinfo=UTC) + datetime.timedelta(milliseconds=ms)


def events(*batches: list[tuple[str | None, int | None, int]] | Watermark | ProcessingTime) -> TestSource:
    return TestSource([b if isinstance(b, (Watermark, ProcessingTime)) else
                       [{"key": k, "value": v, "ts": t} for k, v, t in b] for b in batches], schema=SCHEMA)


@pytest.mark.parametrize("case", CASES, ids=[f"{c['id']}[{c['watermark_model']}]" for c in CASES])
def test_conformance_case(case, tmp_path):
    assert check(case, str(tmp_path), runner=LOCAL) == []


def test_filters_follow_sql_and_python_functions_run_per_record():
    p = hr.Pipeline("stateless")
    stream = p.source("in", events([("a", 1, 0), ("b", None, 0), ("c", 5, 0)]))
    kept = stream.filter(hr.col("value") > 0)  # a null value compares to null: dropped
    doubled = kept.with_columns(twice=hr.col("value") * 2, half=hr.col("value") / 2)
    doubled.sink("out", TestSink())
    stream.filter(lambda r: r["key"] != "a").map(lambda r: {"key": r["key"].upper()}, schema={"key": "string"}) \
        .sink("upper", TestSink())
    stream.flat_map(lambda r: [{"key": r["key"]}] * 2, schema={"key": "string"}).sink("twice", TestSink())
    out = run_locally(p)
    assert [(r["key"], r["twice"], r["half"]) for r in out["out"]] == [("a", 2, 0.5), ("c", 10, 2.5)]
    assert out["upper"] == [{"key": "B"}, {"key": "C"}]
    assert [r["key"] for r in out["twice"]] == ["a", "a", "b", "b", "c", "c"]


def test_map_batches_with_pandas_and_arrow():
    p = hr.Pipeline("batches")
    stream = p.source("in", events([("a", 1, 0), ("b", 2, 0)], [("c", 3, 0)]))

    def add_one(frame):
        frame["value"] = frame["value"] + 1
        return frame

    stream.map_batches(add_one, format="pandas").sink("pandas", TestSink())
    stream.map_batches(lambda batch: batch.slice(0, 1)).sink("arrow", TestSink())
    out = run_locally(p)
    assert [r["value"] for r in out["pandas"]] == [2, 3, 4]
    assert [r["key"] for r in out["arrow"]] == ["a", "c"]
    assert out["pandas"][0]["ts"] == at(0)


def test_rolling_counts_emit_the_keys_each_batch_touched():
    p = hr.Pipeline("rolling")
    p.source("in", events([("a", 1, 0), ("b", 2, 0), ("a", 3, 0)], [("a", None, 0)])).key_by("key") \
        .aggregate(n=hr.count(), total=hr.sum("value"), mean=hr.mean("value")).sink("out", TestSink())
    assert run_locally(p)["out"] == [{"key": "a", "n": 2, "total": 4, "mean": 2.0},
                                     {"key": "b", "n": 1, "total": 2, "mean": 2.0},
                                     {"key": "a", "n": 3, "total": 4, "mean": 2.0}]


def test_a_batch_is_judged_against_the_watermark_the_batches_before_it_left():
    # batch 1 moves the watermark to 5000 - 1000 = 4000 only after it; the record at 500 in the
    # same batch is on time, the one at 600 in batch 2 is late (its window [0, 1000) ended)
    p = hr.Pipeline("watermark")
    windows = p.source("in", events([("a", 1, 5000), ("a", 1, 500)], [("a", 1, 600)]), event_time="ts",
                       max_out_of_orderness=1000).key_by("key").window(hr.Tumbling(1000), name="w")
    counts = windows.aggregate(n=hr.count())
    counts.sink("out", TestSink())
    counts.late_records().sink("late", TestSink())
    out = run_locally(p)
    assert sorted((r["window_start"], r["n"]) for r in out["out"]) == [(at(0), 1), (at(5000), 1)]
    assert [(r["step"], r["key"], r["event_time"], r["window_end"]) for r in out["late"]] == [
        ("w", "a", at(600), at(1000))]
    assert json.loads(out["late"][0]["record"])["value"] == 1


def test_windows_of_windows_and_early_panes():
    p = hr.Pipeline("two_stage")
    first = p.source("in", events([("a", 1, 0), ("a", 2, 1500), ("a", 3, 2500)]), event_time="ts") \
        .key_by("key").window(hr.Tumbling(1000), name="first").aggregate(n=hr.count())
    first.key_by("key").window(hr.Tumbling(2000), name="second").aggregate(windows=hr.count(), sum_n=hr.sum("n")) \
        .sink("out", TestSink())
    assert sorted((r["window_start"], r["windows"], r["sum_n"]) for r in run_locally(p)["out"]) == [
        (at(0), 2, 2), (at(2000), 1, 1)]


def test_count_windows_fire_by_records_per_key():
    p = hr.Pipeline("counts")
    p.source("in", events([("a", 1, 0), ("b", 5, 0), ("a", 2, 0)], [("a", 3, 0), ("a", 4, 0)])).key_by("key") \
        .window(hr.Count(2)).aggregate(total=hr.sum("value")).sink("out", TestSink())
    assert [(r["key"], r["total"], r["pane_index"]) for r in run_locally(p)["out"]] == [("a", 3, 0), ("a", 7, 1)]


class Tally(hr.KeyedProcessFunction):
    seen = hr.ValueState(default=0)

    def process(self, record, ctx):
        self.seen.set(self.seen.get() + 1)
        ctx.register_event_time_timer(ctx.timestamp + 1000)

    def on_timer(self, timer, ctx):
        ctx.emit({"key": ctx.key, "n": self.seen.get(), "at": timer.time})


def test_process_timers_fire_when_the_watermark_passes_them_and_at_the_end():
    p = hr.Pipeline("process")
    p.source("in", events([("a", 1, 0), ("a", 1, 100)], [("b", 1, 1500)], [("a", 1, 1600)]), event_time="ts") \
        .key_by("key").process(Tally(), schema={"key": "string", "n": "long", "at": "long"}).sink("out", TestSink())
    # after batch 2 the watermark is 1500: a's timers at 1000 and 1100 fire (a seen twice);
    # a's third record then sets 2600, fired at the end with b's 2500
    assert run_locally(p)["out"] == [{"key": "a", "n": 2, "at": 1000}, {"key": "a", "n": 2, "at": 1100},
                                     {"key": "b", "n": 1, "at": 2500}, {"key": "a", "n": 3, "at": 2600}]


def test_dedupe_keeps_the_first_record_of_a_key_within_the_bound():
    p = hr.Pipeline("dedupe")
    p.source("in", events([("a", 1, 0), ("a", 2, 100)], [("a", 3, 5000)], [("a", 4, 9000)]), event_time="ts") \
        .dedupe("key", within=2000).sink("out", TestSink())
    # a is remembered until a batch runs with the watermark at 0 + 2000 or past: batch 2 runs with
    # 100 (5000 dropped), the batch without data after it with 5000 forgets a, and 9000 is a new first
    assert [r["value"] for r in run_locally(p)["out"]] == [1, 4]


def test_table_join_and_union():
    p = hr.Pipeline("joins")
    table = p.table("weights", [{"key": "a", "weight": 2}], schema={"key": "string", "weight": "long"})
    first = p.source("in", events([("a", 1, 0), ("b", 1, 0)]))
    second = p.source("more", events([("a", 5, 0)]))
    first.union(second).join(table, on="key", how="left").sink("out", TestSink())
    assert sorted((r["key"], r["value"], r["weight"]) for r in run_locally(p)["out"]) == [
        ("a", 1, 2), ("a", 5, 2), ("b", 1, None)]


def test_a_user_function_that_raises_stops_the_run_naming_the_step_and_the_record():
    p = hr.Pipeline("raises")
    p.source("in", events([("a", 1, 0)])).map(lambda r: 1 / 0, schema={"key": "string"}, name="divide") \
        .sink("out", TestSink())
    with pytest.raises(StepFunctionError, match=r"step 'divide' \(.*\) raised ZeroDivisionError: .*'key': 'a'"):
        run_locally(p)


def test_what_the_local_runner_cannot_run_is_refused_before_running():
    p = hr.Pipeline("refused")
    ran = []
    stream = p.source("in", events([("a", 1, 0)])).map(lambda r: ran.append(r) or r, schema=SCHEMA)
    stream.filter(hr.expr("value > 1"), name="by_sql").sink("out", TestSink())
    with pytest.raises(PlanError, match=r"step 'by_sql' \(.*\): the local runner cannot run it: the SQL expression "
                                        r".*; run it on Spark with headrace.testing.run_to_completion"):
        run_locally(p)
    assert ran == []


def test_a_source_other_than_the_test_source_is_refused():
    p = hr.Pipeline("generator")
    p.source("gen", hr.sources.Generator("words", limit=5)).sink("out", TestSink())
    with pytest.raises(PlanError, match=r"step 'gen' .*reads Generator, and the local runner reads only "
                                        r"headrace.testing.TestSource; run it on Spark"):
        run_locally(p)


def test_a_run_imports_nothing_of_pyspark():
    script = textwrap.dedent("""
        import sys
        import headrace as hr
        from headrace.testing import TestSink, TestSource, run_locally
        p = hr.Pipeline("no_spark")
        source = TestSource([[{"key": "a", "ts": 0}]], schema={"key": "string", "ts": "timestamp"})
        p.source("in", source, event_time="ts").key_by("key").window(hr.Tumbling(1000)).count().sink("o", TestSink())
        assert [r["count"] for r in run_locally(p)["o"]] == [1]
        print(sorted(m for m in sys.modules if m.split(".")[0] == "pyspark"))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_example_of_docs_testing_md_runs_as_written():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "testing.md").read_text()
    code = doc.split("## Testing without a JVM", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {"__name__": "docs_testing_local"}
    exec(compile(code, "docs/testing.md", "exec"), namespace)
    namespace["test_counts_without_a_jvm"]()
