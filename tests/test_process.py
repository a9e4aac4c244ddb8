"""The keyed process step on Spark: declared state and timers of both domains, the test
clock, errors raised while records flow, plan checks, and recovery from a checkpoint."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import ProcessingTime, TestSink, TestSource, Watermark, run_to_completion

UTC = datetime.UTC
SCHEMA = {"user": "string", "amount": "long", "ts": "timestamp"}
OUTPUT = {"user": "string", "purchases": "long", "total": "long", "closed_at": "timestamp"}


class Sessions(hr.KeyedProcessFunction):
    """A user's purchases until 10 s of event time pass without one."""

    purchases = hr.ListState()
    deadline = hr.ValueState()

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        self.purchases.append(record["amount"])
        if self.deadline.exists():
            ctx.delete_event_time_timer(self.deadline.get())
        assert ctx.timestamp is not None
        self.deadline.set(ctx.timestamp + 10_000)
        ctx.register_event_time_timer(ctx.timestamp + 10_000)

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        amounts = self.purchases.get()
        ctx.emit({"user": ctx.key, "purchases": len(amounts), "total": sum(amounts), "closed_at": timer.datetime})
        self.purchases.clear()
        self.deadline.clear()


def at(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=UTC)


BATCHES: list[Any] = [
    [{"user": "ann", "amount": 5, "ts": 1_000}, {"user": "bob", "amount": 7, "ts": 2_000}],
    [{"user": "ann", "amount": 3, "ts": 6_000}],
    Watermark(12_500),  # bob's session (deadline 12 s) closes; ann's (16 s) stays open
    [{"user": "bob", "amount": 1, "ts": 14_000}, {"user": "ann", "amount": 2, "ts": 15_000}],
    Watermark(40_000),
    [{"user": "cat", "amount": 9, "ts": 41_000}],  # closed by the end of the input
]


def sessions_pipeline(name: str) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    purchases = p.source("purchases", TestSource(BATCHES, schema=SCHEMA), event_time="ts")
    out = TestSink()
    purchases.key_by("user").process(Sessions(), schema=OUTPUT, name="sessions").sink("out", out)
    return p, out


EXPECTED = [
    {"user": "bob", "purchases": 1, "total": 7, "closed_at": at(12_000)},
    {"user": "bob", "purchases": 1, "total": 1, "closed_at": at(24_000)},
    {"user": "ann", "purchases": 3, "total": 10, "closed_at": at(25_000)},
    {"user": "cat", "purchases": 1, "total": 9, "closed_at": at(51_000)},
]


def by_batch(sink: TestSink) -> list[list[dict[str, Any]]]:
    return [sorted(rows, key=lambda r: (r["closed_at"], r["user"])) for _, rows in sorted(sink.batches.items())
            if rows]


def test_event_time_timers_close_sessions_as_the_watermark_passes(spark, tmp_path):
    p, out = sessions_pipeline("process_sessions")
    run_to_completion(p, state_dir=str(tmp_path))
    assert by_batch(out) == [EXPECTED[:1], EXPECTED[1:3], EXPECTED[3:]]
    assert "stateful processor (transformWithStateInPandas, state per key, event-time timers" in p.explain()
    assert "process Sessions.process at test_process.py:" in p.explain()


class Reminder(hr.KeyedProcessFunction):
    """Remembers each user's pages for 5 s of processing time; reminds 2 s after the first one."""

    pages = hr.MapState(ttl="5s")
    reminded = hr.ValueState(default=False)

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        if not self.pages.contains(record["page"]) and len(self.pages) == 0:
            ctx.register_processing_time_timer(ctx.processing_time + 2_000)
        self.pages.put(record["page"], ctx.processing_time)
        ctx.emit({"user": ctx.key, "event": f"saw {sorted(self.pages.keys())}", "at": ctx.processing_time})

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        ctx.emit({"user": ctx.key, "event": f"remind {sorted(self.pages.keys())}", "at": timer.time})


def test_processing_time_timers_and_ttl_follow_the_test_clock(spark, tmp_path):
    schema = {"user": "string", "page": "string"}
    batches: list[Any] = [
        ProcessingTime(1_000),
        [{"user": "ann", "page": "home"}, {"user": "bob", "page": "cart"}],
        ProcessingTime(2_000),
        [{"user": "ann", "page": "shop"}],
        ProcessingTime(3_500),   # both reminders are due (3 s)
        ProcessingTime(7_500),   # every page seen (at 1 s and 2 s) has expired: a new reminder is set
        [{"user": "ann", "page": "faq"}],
    ]
    p = hr.Pipeline("process_clock")
    out = TestSink()
    (p.source("visits", TestSource(batches, schema=schema)).key_by("user")
     .process(Reminder(), schema={"user": "string", "event": "string", "at": "long"}).sink("out", out))
    assert "no event time: timers are checked when their key runs" in p.explain()
    run_to_completion(p, state_dir=str(tmp_path))
    assert by_time(out) == [
        [{"user": "ann", "event": "saw ['home']", "at": 1_000}, {"user": "bob", "event": "saw ['cart']", "at": 1_000}],
        [{"user": "ann", "event": "saw ['home', 'shop']", "at": 2_000}],
        [{"user": "ann", "event": "remind ['home', 'shop']", "at": 3_000},
         {"user": "bob", "event": "remind ['cart']", "at": 3_000}],
        [{"user": "ann", "event": "saw ['faq']", "at": 7_500}],
    ]


def by_time(sink: TestSink) -> list[list[dict[str, Any]]]:
    return [sorted(rows, key=lambda r: r["user"]) for _, rows in sorted(sink.batches.items()) if rows]


class Fragile(hr.KeyedProcessFunction):
    seen = hr.ValueState(default=0)

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        self.seen.set(self.seen.get() + 1)
        ctx.emit({"user": ctx.key, "n": "one" if record["amount"] > 5 else self.seen.get()})


def test_an_output_that_does_not_fit_stops_the_pipeline_naming_step_key_and_record(spark, tmp_path):
    p = hr.Pipeline("process_fails")
    (p.source("purchases", TestSource([[{"user": "ann", "amount": 9, "ts": 1_000}]], schema=SCHEMA))
     .key_by("user").process(Fragile(), schema={"user": "string", "n": "long"}, name="count_them")
     .sink("out", TestSink()))
    with pytest.raises(hr.StepFunctionError) as error:
        run_to_completion(p, state_dir=str(tmp_path))
    message = str(error.value)
    assert message.startswith("step 'count_them' (Fragile.process at test_process.py:")
    assert ("emitted field 'n' = 'one' (str), which does not fit its declared type long (record: {'n': 'one', "
            "'user': 'ann'}) (key: 'ann', record: {'amount': 9, 'ts': Timestamp('1970-01-01 00:00:01'), 'user': "
            "'ann'})") in message


@pytest.mark.fast
def test_the_plan_refuses_updating_steps_around_a_process_step():
    p = hr.Pipeline("process_plan")
    keyed = p.source("purchases", TestSource([], schema=SCHEMA), event_time="ts").key_by("user")
    processed = keyed.process(Sessions(), schema=OUTPUT, name="sessions")
    with pytest.raises(hr.PlanError, match=r"step 'n' \(test_process.py:\d+\): it reads the results of process "
                                           r"step 'sessions' \(test_process.py:\d+\), and this step is a rolling "
                                           r"aggregate, which emits updates \(Spark's update mode\)"):
        processed.key_by("user").count(name="n")
    p = hr.Pipeline("process_plan")
    keyed = p.source("purchases", TestSource([], schema=SCHEMA), event_time="ts").key_by("user")
    keyed.process(Sessions(), schema=OUTPUT, name="sessions").sink("out", TestSink())
    keyed.count(name="running").sink("counts", TestSink())
    with pytest.raises(hr.PlanError, match=r"step 'sessions' \(test_process.py:\d+\): a process step cannot share "
                                           r"pipeline 'process_plan' with step 'running' .*which emits updates"):
        p.explain()


def rows(sink: TestSink) -> list[str]:
    return sorted(json.dumps(r, default=str, sort_keys=True) for r in sink.rows())


def test_a_process_step_restarts_from_its_checkpoint_exactly(spark, tmp_path):
    whole, whole_out = sessions_pipeline("process_whole")
    run_to_completion(whole, state_dir=str(tmp_path / "whole"))

    state = str(tmp_path / "parts")
    first, out = sessions_pipeline("process_parts")
    run = PipelineRun(first, state_dir=state, progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=lambda r: len(r.progress_log) >= 3 and r.request_stop("test"))
    assert not run.exhausted()
    second, out_after = sessions_pipeline("process_parts")
    second.plan.nodes["out"].connector.batches.update(out.batches)  # the same sink, across the restart
    PipelineRun(second, state_dir=state, progress="quiet").start().wait(until_exhausted=True)

    assert rows(out_after) == rows(whole_out) == sorted(json.dumps(r, default=str, sort_keys=True) for r in EXPECTED)

