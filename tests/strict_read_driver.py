"""A driver process for the strict read's SIGKILL test (tests/test_files_native.py): JSON lines,
one file per micro-batch, nothing reading the dead letters but their count (so the source is read
strictly), through a projection into two JSON-lines Files sinks; until SIGTERM.

    python tests/strict_read_driver.py '{"name": ..., "state_dir": ..., "input": ..., "first": ...,
                                         "second": ..., "pause_file": ..., "pause_at": N}'

The first sink, once it has committed batch ``pause_at``, creates ``pause_file`` and waits: the
second sink and Spark's commit log have not taken the batch. The test kills the process group there.
"""

from __future__ import annotations

from typing import Any

from driver_process import driver_main
from sink_matrix_driver import PausingFiles

import headrace as hr


def pipeline(args: dict[str, Any]) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    numbers = p.source("numbers", hr.sources.Files(args["input"], format="jsonl", schema="n long, ts timestamp",
                                                   bounded=True, max_files_per_batch=1))
    tens = numbers.select("n", (hr.col("n") * 10).alias("tens"), "ts")
    tens.sink("first", PausingFiles(args["first"], args["pause_file"], args["pause_at"]))
    tens.sink("second", hr.sinks.Files(args["second"], format="jsonl"))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
