"""Semantics of the stateful processors: nulls and integers in Python state, empty panes,
typed aggregates, the plan's schema is the runtime schema, every late drop counted."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, Watermark

SCHEMA = {"key": "string", "v": "long", "ts": "timestamp"}
UTC = datetime.UTC


def at(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=UTC)


def run(p: hr.Pipeline, tmp_path: Any) -> Any:
    run = PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start()
    return run.wait(until_exhausted=True)


def test_panes_keep_types_give_sql_empty_values_and_match_the_planned_schema(spark, tmp_path):
    batches = [
        [{"key": "a", "v": 1, "ts": 1_000}, {"key": "a", "v": None, "ts": 2_000}],  # an early pane of two
        Watermark(15_000),  # on time: nothing new, but on_time_empty="fire" gives an empty pane
        [{"key": "a", "v": 7, "ts": 3_000}],  # too late, no late output attached: dropped and counted
    ]
    p = hr.Pipeline("pane_semantics")
    out = TestSink()
    result = (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
              .window(hr.Tumbling("10s"), trigger=hr.AfterWatermark(early=hr.EveryN(2), on_time_empty="fire"),
                      accumulation="discarding")
              .aggregate(total=hr.sum("v"), n=hr.count(), low=hr.min("ts"), high=hr.max("ts"), avg=hr.mean("v")))
    result.sink("out", out)
    planned = dict(p.plan.nodes[result.node.name].schema)
    assert planned == {"key": "string", "window_start": "timestamp", "window_end": "timestamp",
                       "pane_kind": "string", "pane_index": "long", "total": "long", "n": "long",
                       "low": "timestamp", "high": "timestamp", "avg": "double"}
    outcome = run(p, tmp_path)
    rows = sorted(out.rows(), key=lambda r: r["pane_index"])
    assert [list(r) for r in rows] == [list(planned)] * 2  # the runtime columns are the plan's, in its order
    early, on_time = rows
    assert (early["pane_kind"], early["total"], early["n"], early["avg"]) == ("early", 1, 2, 1.0)
    assert isinstance(early["total"], int)
    assert (early["low"], early["high"]) == (at(1_000), at(2_000))
    assert (on_time["pane_kind"], on_time["n"]) == ("on_time", 0)
    assert on_time["total"] is on_time["low"] is on_time["high"] is on_time["avg"] is None  # as SQL's
    assert outcome.late_rows_dropped == 1


def test_a_late_record_missing_several_sliding_windows_counts_once(spark, tmp_path):
    batches = [[{"key": "a", "v": 1, "ts": 30_000}], [{"key": "a", "v": 2, "ts": 1_000}]]
    p = hr.Pipeline("sliding_late_count")
    (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
     .window(hr.Sliding("10s", "2s"), trigger=hr.AfterWatermark(early=hr.EveryN(5)))
     .count().sink("out", TestSink()))
    assert run(p, tmp_path).late_rows_dropped == 1


def test_a_plain_sliding_window_counts_each_late_record_once(spark, tmp_path):
    # Watermark 30 s after the first batch. 1 s misses all five of its windows: late, once.
    # 25 s misses [16, 26), [18, 28) and [20, 30) but still counts in [22, 32) and [24, 34).
    batches = [[{"key": "a", "v": 1, "ts": 30_000}],
               [{"key": "a", "v": 2, "ts": 1_000}, {"key": "a", "v": 3, "ts": 25_000}]]
    p = hr.Pipeline("plain_sliding_late_count")
    out = TestSink()
    (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
     .window(hr.Sliding("10s", "2s")).count().sink("out", out))
    assert run(p, tmp_path).late_rows_dropped == 1
    counts = {(r["window_start"], r["window_end"]): r["count"] for r in out.rows()}
    assert counts == {(at(s), at(s + 10_000)): 2 if s < 26_000 else 1 for s in range(22_000, 32_000, 2_000)}


def test_a_sliding_window_emitting_updates_counts_each_late_record_once(spark, tmp_path):
    """emit="updates" on sliding windows: each batch emits the windows it changed (Spark's
    update mode), and a late record counts once however many windows it missed."""
    batches = [[{"key": "a", "v": 1, "ts": 30_000}],
               [{"key": "a", "v": 2, "ts": 1_000}, {"key": "a", "v": 3, "ts": 25_000}]]
    p = hr.Pipeline("sliding_updates_late_count")
    out = TestSink()
    (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
     .window(hr.Sliding("10s", "2s")).count(emit="updates").sink("out", out))
    assert "output mode update" in p.explain()
    assert run(p, tmp_path).late_rows_dropped == 1
    rows = [(r["window_start"], r["window_end"], r["count"]) for r in out.rows()]
    assert list(out.rows()[0]) == ["key", "window_start", "window_end", "count"]
    first = [(at(s), at(s + 10_000), 1) for s in range(22_000, 32_000, 2_000)]
    second = [(at(s), at(s + 10_000), 2) for s in (22_000, 24_000)]  # 25 s updates the two windows still open
    assert sorted(rows) == sorted(first + second)


class Types(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.emit({"key": ctx.key, "kind": type(record["v"]).__name__, "v": record["v"]})


def test_process_functions_get_none_and_int_not_nan_and_float(spark, tmp_path):
    batches = [[{"key": "a", "v": 5, "ts": 1_000}, {"key": "a", "v": None, "ts": 2_000},
                {"key": "a", "v": 2**53 + 1, "ts": 3_000}]]
    p = hr.Pipeline("process_types")
    out = TestSink()
    (p.source("events", TestSource(batches, schema=SCHEMA), event_time="ts").key_by("key")
     .process(Types(), schema={"key": "string", "kind": "string", "v": "long"}).sink("out", out))
    run(p, tmp_path)
    assert sorted((r["kind"], r["v"]) for r in out.rows()) == sorted(
        [("int", 5), ("NoneType", None), ("int", 2**53 + 1)])


ROLLING = {"key": "string", "v": "long", "pause_s": "double"}


def pause(record: dict[str, Any]) -> dict[str, Any]:
    """Holds the micro-batch that carries it, so the next one starts later in processing time."""
    import time

    time.sleep(record["pause_s"] or 0)
    return record


def rolling_pipeline(name: str, ttl: Any, reduce: bool = False) -> tuple[hr.Pipeline, TestSink]:
    batches = [
        [{"key": "a", "v": 1, "pause_s": None}, {"key": "a", "v": None, "pause_s": None}],
        [{"key": "b", "v": 2**53 + 1, "pause_s": 2.5}],  # a quiet 2.5 s for key a
        [{"key": "c", "v": 5, "pause_s": None}],  # a's timeout fires here (no record of a)
        [{"key": "a", "v": 3, "pause_s": None}],
    ]
    p = hr.Pipeline(name)
    out = TestSink()
    keyed = p.source("events", TestSource(batches, schema=ROLLING)).map(pause, schema=ROLLING).key_by("key")
    if reduce:
        keyed.reduce(lambda acc, r: {**r, "v": (acc["v"] or 0) + (r["v"] or 0)}, ttl=ttl, name="totals") \
            .sink("out", out)
    else:
        keyed.aggregate(n=hr.count(), total=hr.sum("v"), ttl=ttl, name="totals").sink("out", out)
    return p, out


def test_rolling_aggregates_forget_keys_quiet_for_their_ttl(spark, tmp_path):
    p, out = rolling_pipeline("rolling_ttl", "2s")
    assert "transformWithStateInPandas, Spark's state TTL" in p.explain()
    assert "output mode update, a micro-batch every 1 second at least (Spark's processing-time mode)" in p.explain()
    run(p, tmp_path)
    assert [(r["key"], r["n"], r["total"]) for r in out.rows()] == [
        ("a", 2, 1), ("b", 1, 2**53 + 1), ("c", 1, 5), ("a", 1, 3)]  # a starts again from nothing
    assert isinstance(out.rows()[1]["total"], int)


def test_rolling_aggregates_without_ttl_keep_every_key(spark, tmp_path):
    p, out = rolling_pipeline("rolling_no_ttl", None)
    run(p, tmp_path)
    assert [(r["key"], r["n"], r["total"]) for r in out.rows()] == [
        ("a", 2, 1), ("b", 1, 2**53 + 1), ("c", 1, 5), ("a", 3, 4)]


def test_a_reduce_with_ttl_forgets_quiet_keys_and_keeps_nulls_and_integers(spark, tmp_path):
    p, out = rolling_pipeline("reduce_ttl", "2s", reduce=True)
    run(p, tmp_path)
    assert [(r["key"], r["v"]) for r in out.rows()] == [("a", 1), ("b", 2**53 + 1), ("c", 5), ("a", 3)]


class Summary(hr.AggregateFunction):
    def create(self) -> int:
        return 0

    def add(self, acc: int, record: dict[str, Any]) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b

    def result(self, acc: int) -> dict[str, Any]:
        return {"n": acc}


@pytest.mark.fast
def test_a_window_result_named_like_a_column_the_window_adds_is_refused_when_built():
    """Every shape and window function: a result field named like a key, a window bound or (when
    the window has them) a pane column is refused naming the step, its line and the column; the
    planned columns are exactly the documented ones."""
    import inspect
    import re

    import pytest

    p = hr.Pipeline("collisions")
    keyed = p.source("events", TestSource([], schema=SCHEMA), event_time="ts").key_by("key")

    def refused(column: str, fix: str, build: Any, line: str = r"\d+") -> None:
        with pytest.raises(hr.PlanError) as caught:
            build()
        message = str(caught.value)
        assert re.fullmatch(rf"step '\w+' \(test_stateful_semantics\.py:{line}\): the [a-z ]+'s output field "
                            rf"'{column}' collides with a column the window adds \(its output starts with "
                            rf"[a-z_, ]+\); {re.escape(fix)}", message), message

    shapes = [hr.Tumbling("1s"), hr.Sliding("2s", "1s"), hr.Session("1s"), hr.Count(2), hr.Global()]
    for shape in shapes:
        trigger = hr.CountTrigger(2) if isinstance(shape, hr.Global) else None
        windowed = keyed.window(shape, trigger=trigger)
        line = str(inspect.currentframe().f_lineno - 1)  # type: ignore[union-attr]  # where the window is
        for column in ("key", "window_start", "window_end"):
            refused(column, f"rename {column!r} in schema=",
                    lambda w=windowed, c=column: w.process(lambda k, b, rs: [], schema={c: "string"}), line)
            refused(column, f"rename {column!r} in schema=",
                    lambda w=windowed, c=column: w.aggregate_with(Summary(), schema={c: "long"}))
        if isinstance(shape, (hr.Count, hr.Global)):  # count and global windows add the pane columns
            refused("pane_kind", "rename 'pane_kind' in schema=",
                    lambda w=windowed: w.process(lambda k, b, rs: [], schema={"pane_kind": "string"}))
    refused("pane_index", "rename 'pane_index' in schema=",
            lambda: keyed.window(hr.Tumbling("1s"), allowed_lateness="1s").process(
                lambda k, w, rs: [], schema={"pane_index": "long"}))
    with pytest.raises(hr.PlanError, match=r"step 'window_\d+' \(test_stateful_semantics\.py:\d+\): the aggregate "
                                           r"pane_kind=.* would replace the output column 'pane_kind'"):
        keyed.window(hr.Tumbling("1s"), trigger=hr.AfterWatermark(early=hr.EveryN(2))).aggregate(
            pane_kind=hr.count())
    # a window's results reduced by a later window: their bounds meet the later window's
    counts = keyed.window(hr.Tumbling("1s")).count()
    refused("window_start", "rename that field before the window (select or with_columns)",
            lambda: counts.key_by("key").window(hr.Tumbling("2s")).reduce(lambda a, r: a))

    # what each window adds, as docs/windows.md lists it
    def planned(result: Any) -> list[str]:
        return [name for name, _ in p.plan.nodes[result.node.name].schema]

    default = keyed.window(hr.Tumbling("1s")).process(lambda k, w, rs: [], schema={"pane_kind": "string"})
    assert planned(default) == ["key", "window_start", "window_end", "pane_kind"]  # the user's field
    early = keyed.window(hr.Tumbling("1s"), trigger=hr.AfterWatermark(early=hr.EveryN(2)))
    assert planned(early.process(lambda k, w, rs: [], schema={"x": "long"})) == [
        "key", "window_start", "window_end", "pane_kind", "pane_index", "x"]
    assert planned(keyed.window(hr.Sliding("2s", "1s")).aggregate_with(Summary(), schema={"n": "long"})) == [
        "key", "window_start", "window_end", "n"]


def test_the_micro_batch_model_counts_each_late_record_once_tumbling_and_sliding(tmp_path):
    """A conformance case of the micro-batch model (Spark's) with a record that missed every window
    it belongs to: the run counts it once, for a tumbling window (Spark's operator) and a sliding
    one (the processor); a record that still reaches an open sliding window is no late drop. The
    expected panes and drops are worked out by hand from the windows and watermarks below."""
    from headrace.testing.conformance import check

    def event(value: int, t: int) -> dict[str, Any]:
        return {"key": "a", "value": value, "event_time": t}

    end = {"marker": "end_batch"}
    # W after each batch (delay 0): 20 s, 20 s, 40 s, 41 s. Batch 2 is judged against 20 s.
    batches = [event(1, 20_000), end, event(2, 3_000), event(3, 17_000), end, event(4, 40_000), end,
               event(5, 41_000), end]

    def case(window: dict[str, Any], output: list[tuple[int, int, int, int]], dropped: list[int]) -> dict[str, Any]:
        semantics = {"window": window, "watermark": {"delay_ms": 0, "scope": "global"}, "allowed_lateness_ms": 0,
                     "trigger": {"type": "event_time", "early": None, "on_time_empty_pane": "skip"},
                     "accumulation_mode": "accumulating", "output_mode": "append"}
        return {"id": f"late_count_{window['kind']}", "watermark_model": "micro_batch", "semantics": semantics,
                "input": batches, "expected_dropped": [e for e in batches if e.get("value") in dropped],
                "expected_output": [{"key": "a", "window_start": s, "window_end": e, "kind": "on_time", "pane": 0,
                                     "aggregate": {"sum": total, "count": n}, "at": 0} for s, e, total, n in output]}

    # tumbling 10 s: 3 s missed [0, 10 s), 17 s missed [10 s, 20 s); batch 4 (W 40 s) closes [20 s, 30 s)
    tumbling = case({"kind": "tumbling", "size_ms": 10_000}, [(20_000, 30_000, 1, 1)], dropped=[2, 3])
    # sliding 10 s every 5 s: 3 s missed both its windows; 17 s missed [10 s, 20 s) but counts in
    # [15 s, 25 s); batch 4 closes [15 s, 25 s) and [20 s, 30 s)
    sliding = case({"kind": "sliding", "size_ms": 10_000, "slide_ms": 5_000},
                   [(15_000, 25_000, 4, 2), (20_000, 30_000, 1, 1)], dropped=[2])
    for conformance_case in (tumbling, sliding):
        assert check(conformance_case, str(tmp_path / conformance_case["id"]), strict=False) == []
