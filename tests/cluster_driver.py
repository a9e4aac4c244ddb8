"""A driver process for tests/test_cluster.py: runs one of its pipelines on a Spark standalone cluster.

The test run holds a local Spark session of its own (one per process), so a pipeline on the cluster
runs here, in a process of its own:

    python tests/cluster_driver.py '{"pipeline": "windows", "master": "spark://127.0.0.1:7077", ...}'

It runs until SIGTERM (a stop at the next batch boundary), then prints one JSON line on stdout:
``{"result": {...}, "master": ..., "app_id": ..., "executors": [...], "tasks": [...]}``: the run's
figures, and every executor and task attempt the driver had, as Spark's status store describes them
(an executor: active or not, why removed; a task: stage, partition, executor, status, error).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import headrace as hr

WINDOW_SCHEMA = "user string, n long, event_time timestamp"
ORDER_SCHEMA = "order_id long, user string, amount long"


def paced(keep: Callable[[dict[str, Any]], bool], delay_s: float) -> Callable[[dict[str, Any]], bool]:
    """``keep`` taking ``delay_s`` per record: a task runs long enough to be caught running."""
    def paced_keep(record: dict[str, Any]) -> bool:
        time.sleep(delay_s)
        return keep(record)
    return paced_keep


def has_user(record: dict[str, Any]) -> bool:
    return record["user"] is not None


def large(record: dict[str, Any]) -> bool:
    return record["amount"] > 1


def windows(args: dict[str, Any]) -> hr.Pipeline:
    """Kafka -> a Python filter -> per-user tumbling 1 s event-time windows, counted -> PostgreSQL,
    no key (inserts only: a batch written twice shows)."""
    p = hr.Pipeline(args["name"])
    # The test writes each batch of events to two partitions in turn, and a micro-batch may read one
    # partition further than the other (up to a write's 8.4 s of events): 10 s keeps every event on time.
    events = p.source("events", hr.sources.Kafka(args["topic"], schema=WINDOW_SCHEMA, servers=args["servers"]),
                      event_time="event_time", max_out_of_orderness="10s")
    (events.filter(paced(has_user, args["delay_s"]), name="has_user")
           .key_by("user")
           .window(hr.Tumbling("1s"), name="per_second")
           .count()
           .sink("db", hr.sinks.Postgres(args["table"], args["dsn"])))
    return p


def orders(args: dict[str, Any]) -> hr.Pipeline:
    """Kafka -> a Python filter and a select -> Kafka, with the transactional (exactly-once) sink."""
    p = hr.Pipeline(args["name"])
    (p.source("orders", hr.sources.Kafka(args["topic"], schema=ORDER_SCHEMA, servers=args["servers"]))
      .filter(paced(large, args["delay_s"]), name="large")
      .select("order_id", "user", "amount")
      .sink("out", hr.sinks.Kafka(args["out_topic"], args["servers"], key="user")))
    return p


PIPELINES = {"windows": windows, "orders": orders}


def executors(spark: Any) -> list[dict[str, Any]]:
    """Every executor this driver had (the driver itself left out), from Spark's status store."""
    jvm = spark.sparkContext._jvm
    listed = jvm.scala.jdk.javaapi.CollectionConverters.asJava(
        spark.sparkContext._jsc.sc().statusStore().executorList(False))
    found = []
    for summary in listed:
        if summary.id() == "driver":
            continue
        reason = summary.removeReason()
        found.append({"id": summary.id(), "host_port": summary.hostPort(), "active": summary.isActive(),
                      "remove_reason": reason.get() if reason.isDefined() else None,
                      "completed_tasks": summary.completedTasks(), "failed_tasks": summary.failedTasks()})
    return found


def tasks(spark: Any) -> list[dict[str, Any]]:
    """Every task attempt of the run: stage, stage attempt, partition index, executor, status and,
    for a failed one, the first line of its error."""
    sc = spark.sparkContext
    store, to_java = sc._jsc.sc().statusStore(), sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava
    found = []
    for stage in to_java(store.stageList(None, False, False, sc._gateway.new_array(sc._jvm.double, 0), None)):
        for task in to_java(store.taskList(stage.stageId(), stage.attemptId(), 100_000)):
            error = task.errorMessage()
            found.append({"stage": stage.stageId(), "stage_attempt": stage.attemptId(), "index": task.index(),
                          "executor": task.executorId(), "status": task.status(),
                          "error": error.get().splitlines()[0] if error.isDefined() else None})
    return found


def main() -> None:
    args = json.loads(sys.argv[1])
    pipeline = PIPELINES[args["pipeline"]](args)
    result = hr.run(pipeline, state_dir=args["state_dir"], master=args["master"], progress="quiet",
                    until_exhausted=False, restart_backoff="1s")
    from headrace.environment.session import get_session

    report = {"result": {"batches": result.batches, "input_rows": result.input_rows, "restarts": result.restarts,
                         "stopped_by": result.stopped_by},
              "master": get_session().sparkContext.master, "app_id": get_session().sparkContext.applicationId,
              "executors": executors(get_session()), "tasks": tasks(get_session())}
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
