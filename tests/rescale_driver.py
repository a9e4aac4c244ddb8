"""A driver process for the rescale-then-SIGKILL test (tests/test_rescale.py): JSON lines, one file
per micro-batch, a keyed running total per record (a process step: keyed state to rescale) into
two JSON-lines Files sinks (so each writes a directory per batch); until SIGTERM.

    python tests/rescale_driver.py '{"name": ..., "state_dir": ..., "input": ..., "out": ..., "copy": ...}'
"""

from __future__ import annotations

from typing import Any

from driver_process import driver_main

import headrace as hr

SCHEMA = {"key": "string", "total": "long"}


class RunningTotal(hr.KeyedProcessFunction):
    total = hr.ValueState(default=0)

    def process(self, record, ctx):
        self.total.set(self.total.get() + record["v"])
        ctx.emit({"key": ctx.key, "total": self.total.get()})


def pipeline(args: dict[str, Any]) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    totals = (p.source("numbers", hr.sources.Files(args["input"], format="jsonl", schema="key string, v long",
                                                   max_files_per_batch=1))
              .key_by("key").process(RunningTotal(), schema=SCHEMA))
    totals.sink("out", hr.sinks.Files(args["out"], format="jsonl"))
    totals.sink("copy", hr.sinks.Files(args["copy"], format="jsonl"))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
