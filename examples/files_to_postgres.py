"""Orders from JSON-lines files to PostgreSQL, exactly once; bad lines go to a dead-letter table.

    mkdir -p /tmp/orders && echo '{"order_id": 1, "amount": 9.5, "ts": "2026-01-01T10:00:00Z"}' > /tmp/orders/a.jsonl
    echo 'not json' >> /tmp/orders/a.jsonl
    headrace run examples/files_to_postgres.py

Files added to /tmp/orders while it runs are picked up; Ctrl-C stops it at a batch
boundary and the next run continues where it stopped.
"""

import os

import headrace as hr

DSN = os.environ.get("HEADRACE_EXAMPLE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")

pipeline = hr.Pipeline("orders_to_postgres", guarantee="exactly-once")
orders = pipeline.source("orders", hr.sources.Files(os.environ.get("HEADRACE_EXAMPLE_INPUT", "/tmp/orders"),
                                                    format="jsonl",
                                                    schema={"order_id": "long", "amount": "double",
                                                            "ts": "timestamp"}))
big = orders.filter(hr.col("amount") > 0).with_columns(amount_cents=(hr.col("amount") * 100).cast("long"))
big.sink("orders_table", hr.sinks.Postgres("orders", dsn=DSN, key="order_id"))
pipeline.dead_letters().sink("bad_orders", hr.sinks.Postgres("orders_dead_letters", dsn=DSN))
