"""A driver process for tests/test_ml_learn.py: files -> a River model per user learning online ->
files, until SIGTERM. Each micro-batch reads one file. The test kills it with SIGKILL and restarts it.

    python tests/learn_driver.py '{"name": ..., "input": ..., "state_dir": ..., "out": ...}'
"""

from __future__ import annotations

from driver_process import driver_main
from river import linear_model

import headrace as hr


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    (p.source("events", hr.sources.Files(args["input"], "jsonl", "user string, x1 double, x2 double, clicked boolean, "
                                         "ts long", max_files_per_batch=1), event_time="ts")
     .key_by("user")
     .learn(lambda: linear_model.LogisticRegression(), label="clicked", features=["x1", "x2"])
     .sink("out", hr.sinks.Files(args["out"], format="jsonl")))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
