"""A driver process for tests/test_join_late_records.py: two folders of files (bids, auctions) ->
a join of the two streams -> its pairs to files (``args["pairs"]``) and its late records to files
(``args["out"]``), until SIGTERM. Each micro-batch reads one file of each folder. The test kills
this process with SIGKILL and restarts it.

    python tests/join_late_driver.py '{"name": ..., "input": ..., "state_dir": ..., "out": ..., "pairs": ...}'
"""

from __future__ import annotations

from pathlib import Path

from driver_process import driver_main
from test_join_late_records import sources

import headrace as hr


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    bids, auctions = sources(p, Path(args["input"]), bounded=False)
    joined = bids.join(auctions, on={"auction": "id"}, within=("-10s", "10s"), name="bids_auctions")
    joined.select("auction", "price", "bt", "seller", "at").sink("pairs", hr.sinks.Files(args["pairs"], format="jsonl"))
    joined.late_records().sink("late", hr.sinks.Files(args["out"], format="jsonl"))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
