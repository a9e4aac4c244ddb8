"""A warm standby driver for ``headrace server --standby``: ``python -m headrace.standby FOLDER``.

It starts what a driver's start costs most before any pipeline needs it: Spark's JVM and
session, and Spark's Python worker daemon (a small Python job). Then it writes ``FOLDER/ready``
and waits for ``FOLDER/assignment.json`` (written by the supervisor, ``headrace/server/supervisor.py``):
the pipeline file, its state dir, its log, its progress log and the file its exit status goes
to. From then on it is that pipeline's driver, exactly as ``headrace run FILE --state-dir DIR
--quiet`` in a process of its own, its output going to the pipeline's log.

A pipeline that needs connector packages (Kafka, Delta) needs them in the JVM when it starts,
which the standby's JVM did without: the standby then exits with ``NEEDS_COLD_START`` and the
supervisor starts an ordinary driver at once. Spark's own log stays in the standby's folder.
"""

from __future__ import annotations

import json
import os
import sys
import time

from headrace.server.driver import write_exit_status
from headrace.server.standby_pool import NEEDS_COLD_START

POLL_S = 0.02


def _warm(folder: str) -> None:
    from headrace.environment.session import get_session

    spark = get_session(log_file=os.path.join(folder, "spark.log"))
    spark.sparkContext.parallelize(range(4), 2).map(lambda n: n + 1).count()  # starts the Python worker daemon


def _assignment(folder: str) -> dict[str, str]:
    path = os.path.join(folder, "assignment.json")
    while not os.path.exists(path):
        time.sleep(POLL_S)
    with open(path, encoding="utf-8") as assigned:
        return dict(json.load(assigned))


def main(argv: list[str]) -> int:
    folder = argv[0]
    _warm(folder)
    with open(os.path.join(folder, "ready"), "w", encoding="utf-8"):
        pass
    job = _assignment(folder)
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ["HEADRACE_PROGRESS_LOG"] = job["progress_log"]
    from headrace.cli import load_pipeline
    from headrace.cli import main as headrace_main

    if load_pipeline(job["file"]).plan.spark_packages():
        write_exit_status(job["exit_file"], NEEDS_COLD_START)
        return NEEDS_COLD_START
    status = headrace_main(["run", job["file"], "--state-dir", job["state_dir"], "--quiet"])
    write_exit_status(job["exit_file"], status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
