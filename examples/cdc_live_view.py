"""A live view of a database in Redis: PostgreSQL's changes to ``orders`` (inserts, updates,
deletes) keep, per customer, the number of orders and their total amount in a Redis hash.

    bash scripts/services.sh        # PostgreSQL with wal_level=logical and wal2json, Redis
    headrace run examples/cdc_live_view.py

The table needs ``REPLICA IDENTITY FULL`` so that an update or delete carries the old row:

    CREATE TABLE orders (id bigint PRIMARY KEY, customer text, amount bigint);
    ALTER TABLE orders REPLICA IDENTITY FULL;

Each change becomes a signed delta (an insert adds its order, a delete takes it away, an
update moves the amount, and the order from one customer to another), summed per customer;
each micro-batch upserts the customers it changed into the hashes ``live:orders:<customer>``
(fields ``customer``, ``orders``, ``amount``) in one MULTI/EXEC with its batch id, so the
view is exact after any crash. ``HGETALL live:orders:ada`` reads it; it always equals
``SELECT count(*), sum(amount) FROM orders WHERE customer = 'ada'`` as of the last batch.
``tests/test_postgres_cdc.py`` runs this file and compares the view with that query.
"""

import json
import os

import headrace as hr

DSN = os.environ.get("HEADRACE_EXAMPLE_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
TABLE = os.environ.get("HEADRACE_EXAMPLE_TABLE", "orders")
PREFIX = os.environ.get("HEADRACE_EXAMPLE_PREFIX", "live:orders")


def deltas(change: dict) -> list[dict]:
    """What one change does to its customers' figures: minus the old row, plus the new one."""
    out = []
    if change["before"] is not None and change["op"] != "insert":
        old = json.loads(change["before"])
        out.append({"customer": old["customer"], "orders": -1, "amount": -old["amount"]})
    if change["after"] is not None:
        new = json.loads(change["after"])
        out.append({"customer": new["customer"], "orders": 1, "amount": new["amount"]})
    return out


pipeline = hr.Pipeline("orders_live_view")
changes = pipeline.source("changes", hr.sources.PostgresChanges(TABLE, dsn=DSN, slot=f"live_{TABLE}"))
(changes.flat_map(deltas, schema={"customer": "string", "orders": "long", "amount": "long"})
        .key_by("customer")
        .aggregate(orders=hr.sum("orders"), amount=hr.sum("amount"))
        .sink("view", hr.sinks.Redis(key_prefix=PREFIX, key="customer")))

if __name__ == "__main__":
    pipeline.run()
