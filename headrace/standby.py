"""A warm standby driver of ``headrace server`` (on by default; ``--no-standby`` keeps none):
``python -m headrace.standby FOLDER``.

It does before any pipeline needs it what a driver's start costs most: it starts Spark's JVM and
session and Spark's Python worker daemon (a small Python job), writes ``FOLDER/session``, then
runs a small pipeline of its own to its end (a headrace source read by Spark's Python data
source, a keyed window on Spark's state store, a Files sink), whose first micro-batch
pays once for what every pipeline's first one pays on a new JVM (code compiled, classes
initialised, Python workers started with pyarrow), and writes ``FOLDER/ready``. A pipeline's first
batch then comes about three times sooner (docs/performance-log.md, Recovery). The warm-up waits while
``FOLDER/hold`` exists: the supervisor holds it while a driver it started has not settled.

The supervisor (``headrace/server/supervisor.py``) hands it a pipeline by writing
``FOLDER/assignment.json`` (the pipeline file, its state dir, its log, its progress log and the
file its exit status goes to): once it is ready, or while the warm-up pipeline runs, which then
stops at once, its micro-batch abandoned. From then on it is that pipeline's driver, exactly as
``headrace run FILE --state-dir DIR`` in a process of its own, its output going to the
pipeline's log.

A pipeline needs its connector packages (Kafka, Delta) in the JVM when it starts. The standby's
JVM starts, as any driver's, with every jar ``scripts/fetch_jars.sh`` fetched; a pipeline that
needs a package the folder lacks (Spark would fetch it as the session starts) is seen by a
thread as soon as the assignment arrives, and the standby then exits with ``NEEDS_COLD_START`` at
once; the supervisor starts an ordinary driver. Spark's own log stays in the standby's folder.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from typing import Any

from headrace.environment import jars
from headrace.server.driver import write_exit_status
from headrace.server.standby_pool import NEEDS_COLD_START

POLL_S = 0.02


def _start_session(folder: str) -> None:
    from headrace.environment.session import get_session

    spark = get_session(log_file=os.path.join(folder, "spark.log"))
    spark.sparkContext.parallelize(range(4), 2).map(lambda n: n + 1).count()  # starts the Python worker daemon


def _hold(folder: str, assigned: threading.Event) -> None:
    """Wait while ``FOLDER/hold`` exists (the supervisor's: a driver it started has not settled, and
    the warm-up pipeline would take the CPU its start needs), or until a pipeline is assigned."""
    while os.path.exists(os.path.join(folder, "hold")) and not assigned.wait(POLL_S):
        pass


def _warm_up(folder: str, assigned: threading.Event) -> None:
    """Run the warm-up pipeline to its end, or, once a pipeline is ``assigned``, stop it at once
    (its micro-batch abandoned); its files are removed. A warm-up that fails leaves the standby as
    it is (said in its log): it still saves a pipeline the session's start."""
    import headrace as hr
    from headrace.runtime.runner import PipelineRun

    work = os.path.join(folder, "warm-up")
    p = hr.Pipeline("standby_warm_up")
    clicks = p.source("clicks", hr.sources.Generator("clicks", limit=100, rows_per_batch=100, seed=1),
                      event_time="event_time", max_out_of_orderness="1s")
    clicks.key_by("user_id").window(hr.Tumbling("1s")).count().sink(
        "counts", hr.sinks.Files(os.path.join(work, "counts"), format="jsonl"))
    ended = threading.Event()
    try:
        run = PipelineRun(p, state_dir=os.path.join(work, "state"), progress="quiet").start()

        def stop_once_assigned() -> None:
            while not ended.is_set():
                if assigned.wait(POLL_S):  # at once: its batch on a new JVM would keep the pipeline waiting
                    if not run.halt("a pipeline was assigned to the standby"):
                        run.request_stop("a pipeline was assigned to the standby")
                    return

        threading.Thread(target=stop_once_assigned, name="headrace-standby-stop", daemon=True).start()
        run.wait()
    except KeyboardInterrupt:  # the halt above ends the run so
        if not assigned.is_set():
            raise
    except Exception as exc:  # noqa: BLE001 - see the docstring
        print(f"headrace: the standby's warm-up pipeline failed: {exc}", file=sys.stderr, flush=True)
    finally:
        ended.set()
        shutil.rmtree(work, ignore_errors=True)


def _assignment(folder: str) -> dict[str, str]:
    path = os.path.join(folder, "assignment.json")
    while not os.path.exists(path):
        time.sleep(POLL_S)
    with open(path, encoding="utf-8") as assigned:
        return dict(json.load(assigned))


def _needs_cold_start(job: dict[str, str], launched: dict[str, str]) -> bool:
    """Whether the pipeline needs connector packages this standby's JVM was not ``launched`` with
    (``jars.session_settings``: every fetched jar, when ``scripts/fetch_jars.sh`` fetched some)."""
    from headrace.cli import load_pipeline

    try:
        packages = load_pipeline(job["file"]).plan.spark_packages()
    except Exception:  # noqa: BLE001 - the run reports the error in the pipeline's log, as any driver would
        return False
    if not packages:
        return False
    fetched = jars.fetched()
    if not all(package.name in fetched for package in packages):
        return True  # Spark fetches the package as a new session starts
    return any(launched.get(key) != value for key, value in jars.session_settings(packages).items())


def _watch_assignment(folder: str, launched: dict[str, str], taken: list[dict[str, str]],
                      assigned: threading.Event) -> None:
    """Wait for the assignment; hand it back cold at once when the pipeline needs packages."""
    job = _assignment(folder)
    if _needs_cold_start(job, launched):
        write_exit_status(job["exit_file"], NEEDS_COLD_START)
        os._exit(NEEDS_COLD_START)  # the JVM, if it still starts, ends with this process (its stdin closes)
    taken.append(job)
    assigned.set()


def _redirect_output(job: dict[str, Any]) -> None:
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ["HEADRACE_PROGRESS_LOG"] = job["progress_log"]


def main(argv: list[str]) -> int:
    folder = argv[0]
    taken: list[dict[str, str]] = []
    assigned = threading.Event()  # set once a pipeline this standby can run is assigned (in ``taken``)
    launched = jars.session_settings(())  # the connector jars (and their settings) its JVM starts with
    threading.Thread(target=_watch_assignment, args=(folder, launched, taken, assigned), name="headrace-standby",
                     daemon=True).start()
    try:
        _start_session(folder)
        with open(os.path.join(folder, "session"), "w", encoding="utf-8"):
            pass
        _hold(folder, assigned)
        if not assigned.is_set():
            _warm_up(folder, assigned)
    except BaseException:
        if os.path.exists(os.path.join(folder, "assignment.json")):  # a pipeline waits for this standby:
            assigned.wait()  # (or the thread hands it back itself) a new driver must take it at once
            write_exit_status(taken[0]["exit_file"], NEEDS_COLD_START)
            return NEEDS_COLD_START
        raise
    with open(os.path.join(folder, "ready"), "w", encoding="utf-8"):
        pass
    assigned.wait()
    job = taken[0]
    _redirect_output(job)
    from headrace.cli import main as headrace_main

    status = headrace_main(["run", job["file"], "--state-dir", job["state_dir"]])
    write_exit_status(job["exit_file"], status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
