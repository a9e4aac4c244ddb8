"""A driver process for tests/test_ml_score.py: files -> a score step -> files, until SIGTERM.
Each micro-batch reads one file. The test kills it with SIGKILL and restarts it.

    python tests/score_driver.py '{"name": ..., "input": ..., "registry": ..., "state_dir": ..., "out": ...}'
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    (p.source("points", hr.sources.Files(args["input"], "jsonl", "id long, x double, y double", max_files_per_batch=1))
     .score(args["registry"])
     .sink("out", hr.sinks.Files(args["out"], format="jsonl")))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
