"""Fraud alerts in milliseconds: payments from Kafka, large or blocked-country payments to
Kafka, in Spark's real-time mode.

    bash scripts/kafka.sh start               # a local broker on 127.0.0.1:9092
    bash scripts/fetch_jars.sh                # Spark's Kafka connector (or let Spark fetch it)
    headrace explain examples/kafka_fraud_alerts.py   # "trigger: real-time ..."
    headrace run examples/kafka_fraud_alerts.py

Produce JSON payments into the topic ``payments`` (``{"card": "c1", "amount": 2500.0,
"country": "XX"}``); each alert reaches the topic ``fraud_alerts`` a few milliseconds later
(docs/performance.md, "Kafka"). Every step is a column expression or a broadcast join, the
steps Spark's real-time mode runs; the sink is Spark's Kafka writer, so the pipeline is
at-least-once (a long batch cut short by a crash is written again).
"""

import os

import headrace as hr

SERVERS = os.environ.get("HEADRACE_EXAMPLE_KAFKA", "127.0.0.1:9092")

pipeline = hr.Pipeline("fraud_alerts_realtime", trigger="real-time")
countries = pipeline.table("risky_countries", rows=[{"country": "XX", "risk": "blocked"},
                                                    {"country": "YY", "risk": "watched"}])
payments = pipeline.source("payments", hr.sources.Kafka("payments", servers=SERVERS,
                                                        schema="card string, amount double, country string"))
(payments.join(countries, on="country", how="left")
         .filter((hr.col("amount") > 1000) | (hr.col("risk") == "blocked"))
         .select("card", "amount", "country", "risk")
         .sink("alerts", hr.sinks.Kafka("fraud_alerts", SERVERS, key="card", exactly_once=False)))
