"""Sessionisation into a lakehouse table: clicks from Kafka, each user's sessions (30 s of
inactivity closes one) upserted into a Delta table, exactly once.

    bash scripts/kafka.sh start               # a local broker on 127.0.0.1:9092
    bash scripts/fetch_jars.sh                # Kafka's and Delta's jars (or let Spark fetch them)
    headrace run examples/kafka_sessions_delta.py

Produce JSON clicks into the topic ``clicks`` (``{"user": "ada", "page": "/cart", "ts":
"2026-11-23T10:00:00Z"}``). When the watermark passes a session's end (its last click plus
30 s, plus 5 s for out-of-order clicks), one row per session lands in the table
``/tmp/headrace-sessions``: user, start, end, clicks and the last click's time. Read it with Spark
(``spark.read.format("delta").load(...)``) or any Delta reader. A crash anywhere leaves no
session missing or twice: each micro-batch is one Delta commit carrying the batch id, and a
batch Spark replays after a crash is skipped (docs/connectors.md, Delta Lake).
``tests/test_delta.py`` runs this file on generated clicks and compares the table with
sessions computed in plain Python.
"""

import os

import headrace as hr

SERVERS = os.environ.get("HEADRACE_EXAMPLE_KAFKA", "127.0.0.1:9092")
TOPIC = os.environ.get("HEADRACE_EXAMPLE_TOPIC", "clicks")
TABLE = os.environ.get("HEADRACE_EXAMPLE_DELTA", "/tmp/headrace-sessions")

pipeline = hr.Pipeline("sessions_to_delta")
clicks = pipeline.source("clicks", hr.sources.Kafka(TOPIC, servers=SERVERS,
                                                  schema="user string, page string, ts timestamp"),
                         event_time="ts", max_out_of_orderness="5s")
(clicks.key_by("user")
       .window(hr.Session("30s"))
       .aggregate(clicks=hr.count(), last_click=hr.max("ts"))
       .select("user", "window_start", "window_end", "clicks", "last_click")
       .sink("sessions", hr.sinks.Delta(TABLE, key=["user", "window_start"])))

if __name__ == "__main__":
    pipeline.run()
