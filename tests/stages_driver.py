"""A driver process for tests/test_multi_stage.py: files -> a chain of three stateful steps ->
files, until SIGTERM.

    python tests/stages_driver.py '{"name": ..., "input": ..., "state_dir": ..., "out": ...}'

Each micro-batch reads one file. ``per_minute`` counts each user's events per minute; ``running``
(a process step) keeps each user's running total of those counts, its state; ``per_five`` takes
each user's peak running total and the minutes it saw per five minutes. The test kills this
process with SIGKILL and restarts it.
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr


class Running(hr.KeyedProcessFunction):
    total = hr.ValueState(default=0)

    def process(self, record, ctx):
        self.total.set(self.total.get() + record["count"])
        ctx.emit({"user": ctx.key, "running": self.total.get()})


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    events = p.source("events", hr.sources.Files(args["input"], "jsonl", "user string, ts long",
                                                  max_files_per_batch=1), event_time="ts")
    minutes = events.key_by("user").window(hr.Tumbling("1m"), name="per_minute").count()
    running = minutes.key_by("user").process(Running(), schema="user string, running long", name="running")
    fives = (running.key_by("user").window(hr.Tumbling("5m"), name="per_five")
             .aggregate(peak=hr.max("running"), minutes=hr.count()))
    fives.sink("out", hr.sinks.Files(args["out"], format="jsonl"))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
