"""A driver process for tests/test_postgres_cdc.py: PostgreSQL changes -> Files, until SIGTERM.

    python tests/postgres_cdc_driver.py '{"name": ..., "tables": [...], "dsn": ..., "slot": ...,
                                          "state_dir": ..., "out": ..., "max_records_per_batch": ...}'

The test run holds a local Spark session of its own, and the test kills this process with SIGKILL:
the pipeline runs here, in a process (group) of its own. On SIGTERM it stops at a batch boundary.
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    source = hr.sources.PostgresChanges(args["tables"], dsn=args["dsn"], slot=args["slot"],
                                        max_records_per_batch=args["max_records_per_batch"])
    (p.source("changes", source)
      .select("op", "table", "before", "after", "lsn", "commit_lsn", "xid")
      .sink("out", hr.sinks.Files(args["out"], format="jsonl")))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
