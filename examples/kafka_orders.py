"""Orders from Kafka, totals per user and minute to Kafka, exactly once.

    bash scripts/kafka.sh start               # a local broker on 127.0.0.1:9092
    bash scripts/fetch_jars.sh                # Spark's Kafka connector (or let Spark fetch it)
    headrace run examples/kafka_orders.py

Produce JSON orders into the topic ``orders`` (``{"user": "ana", "amount": 12}``) and read
the totals with a ``read_committed`` consumer of ``order_totals``; values that are not such
JSON go to the topic ``orders_dead_letters``. Ctrl-C stops it between batches; the next
run continues from its checkpoint, and no total is written twice.
"""

import os

import headrace as hr

SERVERS = os.environ.get("HEADRACE_EXAMPLE_KAFKA", "127.0.0.1:9092")

pipeline = hr.Pipeline("kafka_orders", guarantee="exactly-once")
orders = pipeline.source("orders", hr.sources.Kafka("orders", servers=SERVERS, schema="user string, amount long",
                                                    metadata=["timestamp"]),
                         event_time="kafka_timestamp", max_out_of_orderness="5s")
(orders.key_by("user")
       .window(hr.Tumbling("1m"), name="per_minute")
       .aggregate(total=hr.sum("amount"), orders=hr.count())
       .sink("totals", hr.sinks.Kafka("order_totals", SERVERS, key="user")))
pipeline.dead_letters().sink("bad_orders", hr.sinks.Kafka("orders_dead_letters", SERVERS))
