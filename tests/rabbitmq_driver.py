"""A driver process for tests/test_rabbitmq_streams.py: a RabbitMQ stream -> Files, until SIGTERM.

    python tests/rabbitmq_driver.py '{"name": ..., "stream": ..., "url": ..., "state_dir": ..., "out": ...}'

The test run holds a local Spark session of its own, and the test kills this process with SIGKILL:
the pipeline runs here, in a process (group) of its own. On SIGTERM it stops at a batch boundary.
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr

SCHEMA = "order_id long, user string, amount long"


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    source = hr.sources.RabbitMQ(args["stream"], schema=SCHEMA, url=args["url"],
                                 max_records_per_batch=args["max_records_per_batch"])
    (p.source("orders", source)
      .select("order_id", "user", "amount", "rabbitmq_offset")
      .sink("out", hr.sinks.Files(args["out"], format="jsonl")))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
