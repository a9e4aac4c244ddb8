"""Processing time outside tests is the micro-batch's timestamp: process-step timers and
window early firings (``hr.AfterDelay``) fire when an operator instance runs after it."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink

UTC = datetime.UTC


def run_two_files(p: hr.Pipeline, inbox: Path, state: Path, first: str, second: str) -> int:
    """Run ``p`` on one file, then on a second one; returns the wall clock at the start (ms)."""
    (inbox / "1.jsonl").write_text(first)
    started = int(datetime.datetime.now(tz=UTC).timestamp() * 1000)
    run = PipelineRun(p, state_dir=str(state), progress="quiet").start()
    run.settle()
    (inbox / "2.jsonl").write_text(second)
    run.settle()
    run.request_stop("test")
    run.wait()
    return started


class Stamp(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.register_processing_time_timer(ctx.processing_time + 1)
        ctx.emit({"user": ctx.key, "event": "record", "at": ctx.processing_time})

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        ctx.emit({"user": ctx.key, "event": "timer", "at": timer.time})


def test_outside_tests_processing_time_is_the_micro_batch_time(spark, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    p = hr.Pipeline("process_wall_clock")
    out = TestSink()
    (p.source("visits", hr.sources.Files(str(inbox), schema={"user": "string"})).key_by("user")
     .process(Stamp(), schema={"user": "string", "event": "string", "at": "long"}).sink("out", out))
    started = run_two_files(p, inbox, tmp_path / "state", '{"user": "ann"}\n', '{"user": "ann"}\n')
    (first,), (timer, second) = [rows for _, rows in sorted(out.batches.items()) if rows]
    assert first["event"] == "record" and started - 60_000 < first["at"] < started + 600_000
    assert timer == {"user": "ann", "event": "timer", "at": first["at"] + 1}  # due when ann's instance ran again
    assert second["event"] == "record" and second["at"] > first["at"]


def test_outside_tests_an_early_firing_after_a_delay_uses_the_micro_batch_time(spark, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    p = hr.Pipeline("window_wall_clock")
    out = TestSink()
    (p.source("visits", hr.sources.Files(str(inbox), schema={"user": "string", "n": "long", "ts": "long"}),
              event_time="ts")
     .key_by("user")
     .window(hr.Tumbling("1h"), trigger=hr.AfterWatermark(early=hr.AfterDelay("1ms")))
     .aggregate(total=hr.sum("n"))
     .sink("out", out))
    run_two_files(p, inbox, tmp_path / "state", '{"user": "ann", "n": 1, "ts": 1000}\n',
                  '{"user": "ann", "n": 2, "ts": 2000}\n')
    # the pane opened by the first file is due 1 ms later: it fires when ann's instance runs again
    assert [(r["user"], r["pane_kind"], r["total"]) for r in out.rows()] == [("ann", "early", 1)]
