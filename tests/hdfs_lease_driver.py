"""A driver process for tests/test_hdfs.py's lease tests: files -> a step -> files, its state dir
on HDFS, until SIGTERM. Each micro-batch reads one file.

    python tests/hdfs_lease_driver.py '{"name": ..., "input": ..., "state_dir": "hdfs://...", "out": ...}'
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    (p.source("numbers", hr.sources.Files(args["input"], "jsonl", "n long", max_files_per_batch=1))
     .select("n", twice=hr.col("n") * 2)
     .sink("out", hr.sinks.Files(args["out"], format="jsonl")))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
