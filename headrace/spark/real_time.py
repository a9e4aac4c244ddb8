"""Spark's real-time mode (``trigger="real-time"``): long-running micro-batches whose stages all
run at once, records flowing through them as they arrive, for latencies of milliseconds.

Spark runs a query in real-time mode only when every physical operator and the sink are on its
allow-list (Kafka source, Kafka/foreach/console sinks, projections, filters, broadcast joins,
unions, the watermark and its streaming aggregates, in update mode). ``obstacles`` says, from the
plan and before Spark starts, why a pipeline cannot run that way
(``headrace/spark/real_time_obstacles.py``); ``explain()`` prints it for every pipeline, and a
real-time pipeline with any obstacle is refused when it is built.

A real-time pipeline writes through Spark's own Kafka writer, run by the executors: a record is
written as soon as it is computed, so there is no batch-wide transaction and the pipeline is
at-least-once (``hr.sinks.Kafka(..., exactly_once=False)``).
"""

from __future__ import annotations

from typing import Any

from headrace.errors import PlanError

MICRO_BATCH = "micro-batch"
REAL_TIME = "real-time"
TRIGGERS = (MICRO_BATCH, REAL_TIME)
# How long one of Spark's long-running batches lasts: records flow through it continuously, and
# its offsets and state are checkpointed when it ends (Spark's minimum, 5 s by default).
REAL_TIME_BATCH = "5 seconds"
# The sink formats Spark's real-time mode writes to, of those headrace has (Spark's Kafka writer).
WRITERS = ("kafka",)
# Spark's real-time mode checks stateful queries' checkpoints: only format version 2 (a
# checkpoint id per state store version) makes a re-run long batch safe.
STATE_SETTINGS = {"spark.sql.streaming.stateStore.checkpointFormatVersion": "2"}


def check_trigger(name: str, trigger: Any) -> str:
    if trigger not in TRIGGERS:
        raise PlanError(f"pipeline {name!r}: unknown trigger {trigger!r}; use {' or '.join(map(repr, TRIGGERS))}")
    return str(trigger)
