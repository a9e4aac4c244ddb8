"""Warm standby drivers of ``headrace server`` (on by default; ``--no-standby`` keeps none): one
driver process kept ready, its Spark JVM, session and Python worker daemon started
(``headrace/standby.py``), which the supervisor hands the next pipeline to start, a restart after a
crash above all; a standby still running its warm-up pipeline takes it too. The
supervisor starts a new standby once the drivers it started have settled (their first batch
committed), not at once: two JVMs starting together on a small machine would slow the restart
the first one is for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from headrace.server.driver import end_session

NEEDS_COLD_START = 75  # a standby's exit status: the pipeline needs connector packages its JVM lacks
RETRY_AFTER_S = 12.0  # how long after a standby died while starting the next one starts


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


class StandbyPool:
    """At most one standby at a time, under ``folder`` (one sub-folder per standby)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._current: tuple[subprocess.Popen[bytes], str] | None = None
        self._retry_at = 0.0
        self._made = 0
        os.makedirs(folder, exist_ok=True)
        self._end_leftovers()

    def tend(self, quiet: bool) -> None:
        """Start a standby when none is there and the machine is ``quiet`` (no driver the supervisor
        started is still starting); while it is not, hold the standby's warm-up pipeline. The
        supervisor calls it as it watches."""
        if self._current is not None and self._current[0].poll() is not None:
            self._current = None  # a standby that died (its start failed): start another later
            self._retry_at = time.time() + RETRY_AFTER_S
        if self._current is not None:
            hold = os.path.join(self._current[1], "hold")
            if quiet and os.path.exists(hold):
                os.remove(hold)
            elif not quiet and not os.path.exists(hold):
                open(hold, "w", encoding="utf-8").close()
        if self._current is None and quiet and time.time() >= self._retry_at:
            self._made += 1
            place = os.path.join(self.folder, f"{os.getpid()}-{self._made}")
            os.makedirs(place, exist_ok=True)
            with open(os.path.join(place, "standby.log"), "ab") as log:
                child = subprocess.Popen([sys.executable, "-m", "headrace.standby", place], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "PYSPARK_PYTHON": sys.executable})
            with open(os.path.join(place, "pid"), "w", encoding="utf-8") as out:
                out.write(str(child.pid))
            self._current = (child, place)

    def take(self, job: dict[str, str]) -> tuple[subprocess.Popen[bytes], bool] | None:
        """The standby, now running ``job`` (see ``headrace/standby.py``), and whether it was ready
        (else it stops its warm-up pipeline first); None when there is none with its Spark session
        up. One whose JVM still starts is left to start, for the next pipeline: the restarts of a
        pipeline that keeps crashing then take a warm standby every other time, where each would
        otherwise wait for a JVM."""
        if self._current is None:
            return None
        child, place = self._current
        if child.poll() is not None or not os.path.exists(os.path.join(place, "session")):
            return None
        ready = os.path.exists(os.path.join(place, "ready"))
        temporary = os.path.join(place, "assignment.json.tmp")
        with open(temporary, "w", encoding="utf-8") as out:
            json.dump(job, out)
        os.replace(temporary, os.path.join(place, "assignment.json"))
        self._current = None
        return child, ready

    def close(self) -> None:
        """End the idle standby (a standby running a pipeline is that pipeline's driver, and goes on)."""
        if self._current is not None:
            self._end(self._current[0].pid)
            self._current = None

    def _end_leftovers(self) -> None:
        """End the idle standbys a server killed before left behind."""
        for place in os.listdir(self.folder):
            pid_file = os.path.join(self.folder, place, "pid")
            assigned = os.path.exists(os.path.join(self.folder, place, "assignment.json"))
            if os.path.exists(pid_file) and not assigned:
                with open(pid_file, encoding="utf-8") as kept:
                    pid = int(kept.read().strip() or 0)
                if process_alive(pid):
                    self._end(pid)

    @staticmethod
    def _end(pid: int) -> None:
        """End an idle standby: every process of its session, its JVM and Spark's Python worker
        daemon (a process group of its own) included."""
        end_session(pid)
