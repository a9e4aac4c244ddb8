"""The server's driver processes: one per pipeline, each the leader of its own session (and
process group), so that one failing pipeline never takes another (or the server) down.

A driver that ends without being asked to is restarted from its checkpoint under the restart
strategy (``headrace/runtime/restarts.py``: by default 3 restarts within 10 minutes, waiting
1 s, then 2 s, then 4 s); one whose input ended (exit status 0) is finished. A driver leaves its
exit status in ``driver.exit`` beside its log (``headrace/server/driver.py``); none there means
it was killed. A killed driver's other processes (its ``headrace run`` when the leader alone was
killed, Spark's JVM, Spark's Python workers) get SIGKILL, and no other driver takes the
checkpoint until every one of them has ended: an old JVM could otherwise still commit a batch
beside the new driver. The drivers do not depend on the server: a server killed and started
again finds them in its registry and watches them again.

A request a driver would refuse (a drained checkpoint, a plan the checkpoint cannot continue, a
rescale with no keyed state) is refused at once (``preflight.py``), and so is a request that
makes no sense in the pipeline's status (409): none starts a driver to fail. A refusal only its
driver can find (a sink's own checks, a lease another process holds) ends the driver with
``REFUSED_EXIT_STATUS`` (``headrace/errors.py``): the pipeline fails at once with the driver's
error as its reason, and no further driver starts.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from headrace.environment.checkpoints import pipeline_root
from headrace.errors import REFUSED_EXIT_STATUS
from headrace.runtime.restarts import RestartPolicy
from headrace.server import preflight
from headrace.server.driver import end_session, session_processes
from headrace.server.operations import Operations
from headrace.server.pipeline_dirs import pipeline_roots
from headrace.server.registry import (
    DRAINING,
    FAILED,
    FINISHED,
    LIVE,
    PAUSED,
    RESCALING,
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
    Entry,
    Refused,
    Registry,
)
from headrace.server.standby_pool import NEEDS_COLD_START, StandbyPool, process_alive

PROGRESS_FILE = "progress.jsonl"  # each batch's figures, written by the driver (HEADRACE_PROGRESS_LOG)
DRIVER_LOG = "driver.log"  # what a driver prints, its last error included (headrace: ...)
ERROR_PREFIX = "headrace: "
NAME = re.compile(r"^[A-Za-z0-9_-]{1,100}$")
WATCH_EVERY_S = 0.25
SETTLE_AT_MOST_S = 12.0  # a driver started this long ago counts as settled, its first batch committed or not
ENDING_SESSION = "its driver ended; ending the driver's other processes before another driver takes its checkpoint"
SESSION_END_WAIT_S = 10.0  # how long a request waits for a dead driver's last processes to end after SIGKILL
# what a pipeline in each status that refuses a request can be asked instead
INSTEAD = {STOPPED: "it runs no driver; restart starts it again from its checkpoint",
           PAUSED: "it runs no driver; resume goes on from its checkpoint",
           FINISHED: "it runs no driver; restart runs it again from its checkpoint, remove forgets it",
           FAILED: "it runs no driver; restart starts it again from its checkpoint (its exceptions say why it "
                   "failed)",
           STOPPING: "wait until it has stopped", DRAINING: "wait until its drain has finished it",
           RESCALING: "wait until its rescale has started it again"}


class Supervisor:
    """Starts, watches, restarts and stops the drivers of the pipelines in ``registry``."""

    def __init__(self, registry: Registry, operations: Operations, state_dir: str, allowed: list[str],
                 policy: Callable[[], RestartPolicy] = RestartPolicy.of, standby: bool = False,
                 load_timeout_s: float = preflight.LOAD_TIMEOUT_S) -> None:
        self.registry, self.operations, self.state_dir = registry, operations, os.path.abspath(state_dir)
        self.load_timeout_s = load_timeout_s  # how long building a submitted file's plan may take
        self.standbys = StandbyPool(os.path.join(self.state_dir, "standby")) if standby else None
        self.allowed = [os.path.realpath(folder) for folder in allowed]
        self._policy, self._policies = policy, dict[str, RestartPolicy]()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._due: dict[str, float] = {}  # a restart waiting for its backoff: when it is due
        self._after_exit: dict[str, Callable[[Entry], None]] = {}  # what follows a driver asked to end
        self._log_from: dict[str, int] = {}  # where the running driver's lines begin in its log
        self._settling: dict[str, float] = {}  # when each driver not yet settled (see _settled) started
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="headrace-supervisor", daemon=True)

    # -- lifecycle of the supervisor ----------------------------------------------------------------

    def start(self) -> None:
        for entry in self.registry.all():
            if entry.status == RESCALING:  # its rescale ran in a server that has ended
                entry.status, entry.wanted = FAILED, False
                entry.reason = (f"the server ended during its rescale; headrace rescale {entry.name} N runs it "
                                f"again, headrace restart {entry.name} starts it from its checkpoint as it is")
                self.registry.put(entry)
        self._thread.start()

    def close(self) -> None:
        """Stop watching; the drivers go on running (an idle standby ends)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.standbys is not None:
            self.standbys.close()

    # -- requests -----------------------------------------------------------------------------------

    def submit(self, file: str, name: str | None, fresh: bool = False) -> tuple[Entry, bool]:
        """The pipeline of ``file`` started (or the one already running under that name and file);
        whether it was started now. ``fresh``: its checkpoint deleted first, to start over."""
        path = self._allowed_file(file)
        built = preflight.pipeline_name(path, self.load_timeout_s)
        name = name or built
        if not NAME.match(name):
            raise Refused(400, f"pipeline name {name!r} must be 1-100 letters, digits, _ or -")
        state_dir = os.path.join(self.state_dir, "pipelines", name)
        if self._running_already(name, path, fresh) is None:
            self._check_start(path, state_dir, built, name, fresh, "starting it")
        with self._lock:
            entry = self._running_already(name, path, fresh)
            if entry is not None:
                return entry, False
            previous = self.registry.get(name)
            entry = Entry(name, path, state_dir, STARTING, True,
                          submitted_at=previous.submitted_at if previous else time.time())
            self._await_session_end(previous)
            if fresh:
                self._forget_checkpoint(entry, built)
            self._policies[name] = self._policy()
            self._launch(entry)
            return entry, True

    def _running_already(self, name: str, path: str, fresh: bool) -> Entry | None:
        """The pipeline ``name`` when it runs ``path`` already; refused when it runs another file,
        or runs and is asked to start ``fresh``, or is being rescaled."""
        entry = self.registry.get(name)
        if entry is not None and entry.status == RESCALING:
            raise Refused(409, f"pipeline {name!r} is being rescaled; {INSTEAD[RESCALING]}")
        if entry is None or entry.status not in LIVE:
            return None
        if entry.file != path:
            raise Refused(409, f"pipeline {name!r} already runs {entry.file}; stop and remove it first, or "
                               "submit under another --name")
        if fresh:
            raise Refused(409, f"pipeline {name!r} is {entry.status}: a fresh start would delete the checkpoint "
                               f"its driver runs on; restart it with ?fresh=true (headrace restart {name} --fresh) "
                               "to stop it first")
        return entry

    def _check_start(self, path: str, state_dir: str, built: str, name: str, fresh: bool, what: str) -> None:
        """Refuse at once (409) a start its driver would refuse: its checkpoint was drained, or
        ``path``'s plan cannot continue it; a ``fresh`` start keeps no checkpoint."""
        if fresh:
            return
        root = pipeline_root(state_dir, built)
        preflight.refuse_drained([root], name)
        if preflight.has_checkpoint(root):
            preflight.refuse_incompatible(path, state_dir, f"{what} is refused", f"undo the change, or "
                                          f"{preflight.FRESH_HINT}", self.load_timeout_s)

    @staticmethod
    def _forget_checkpoint(entry: Entry, built: str) -> None:
        """A fresh start: the pipeline's checkpoint and the figures of its batches deleted."""
        preflight.start_fresh(entry.state_dir, built, also=(os.path.join(entry.state_dir, PROGRESS_FILE),))

    def stop(self, name: str, now: bool = False) -> Entry:
        """Ask the pipeline's driver to stop at a batch boundary (``now``: at once); it is not restarted."""
        self._refuse_when(name, "stop", FINISHED, FAILED)
        return self._end_driver(name, "stop requested", self._stopped, now=now)

    def drain(self, name: str) -> Entry:
        """Stop the pipeline's driver at a batch boundary, then end the pipeline for good with a
        driver of ``headrace run --drain``: what the sources hold now is read, every open window
        and timer fires, and the pipeline is finished. A driver killed meanwhile drains again."""
        with self._lock:
            entry = self.existing(name)
            if entry.status in (FINISHED, FAILED):
                raise Refused(409, f"pipeline {name!r} is {entry.status}; there is nothing to drain")
            self._refuse_when(name, "drain", RESCALING)
            _drain_mark(entry).touch()
            return self._end_driver(name, "drain requested", self._launch, status=DRAINING)

    def pause(self, name: str) -> Entry:
        """Stop consuming at a batch boundary, keeping the checkpoint: ``resume`` goes on from it."""
        self._refuse_when(name, "pause", STOPPED, FINISHED, FAILED, STOPPING, DRAINING, RESCALING)
        return self._end_driver(name, "pause requested", self._paused)

    def resume(self, name: str) -> Entry:
        """Start a paused pipeline again from its checkpoint (refused when its file changed in a
        way the checkpoint cannot follow)."""
        entry = self._paused_one(name)
        preflight.refuse_incompatible(entry.file, entry.state_dir, "resuming it is refused",
                                      f"undo the change, or {preflight.FRESH_HINT}", self.load_timeout_s)
        with self._lock:
            entry = self._paused_one(name)
            self._policies[name] = self._policy()
            self._launch(entry)
            return entry

    def _paused_one(self, name: str) -> Entry:
        entry = self.existing(name)
        if entry.status != PAUSED:
            raise Refused(409, f"pipeline {name!r} is {entry.status}, not paused")
        return entry

    def restart(self, name: str, fresh: bool = False) -> Entry:
        """Stop the pipeline's driver at a batch boundary, then start a new one from the checkpoint
        (``fresh``: with the checkpoint deleted, from the beginning of the input)."""
        entry = self._refuse_when(name, "restart", RESCALING)
        built = preflight.pipeline_name(entry.file, self.load_timeout_s)
        self._check_start(entry.file, entry.state_dir, built, name, fresh, "restarting it")

        def start_again(ended: Entry) -> None:
            if fresh:
                try:
                    self._forget_checkpoint(ended, built)
                except Refused as refused:  # another process took the checkpoint's lease meanwhile
                    ended.status, ended.wanted, ended.reason = FAILED, False, f"the fresh start failed: {refused}"
                    return
            self._launch(ended)

        with self._lock:
            entry = self._refuse_when(name, "restart", RESCALING)
            if not self._running(entry.pid):
                self._await_session_end(entry)
                if fresh:
                    self._forget_checkpoint(entry, built)
                self._policies[name] = self._policy()
                self._launch(entry)
                return entry
            return self._end_driver(name, "restart requested", start_again, status=RESTARTING)

    def upgrade(self, name: str, file: str) -> Entry:
        """Run ``file``'s pipeline in place of the running one, from its checkpoint, once the compatibility
        rules (``headrace explain --against-checkpoint``) allow it; otherwise refused, and the old one runs on."""
        path = self._allowed_file(file)
        entry = self._refuse_when(name, "upgrade", RESCALING)
        built, running = (preflight.pipeline_name(each, self.load_timeout_s) for each in (path, entry.file))
        if built != running:
            raise Refused(409, f"{file} builds pipeline {built!r}, not {running!r}: its checkpoint is another one; "
                               "submit it as a pipeline of its own")
        refused = f"the upgrade is refused, {entry.name!r} runs on"
        preflight.refuse_drained(pipeline_roots(entry), name)
        preflight.refuse_incompatible(path, entry.state_dir, refused, timeout_s=self.load_timeout_s)

        def take_over(ended: Entry) -> None:
            ended.file = path
            self._launch(ended)

        with self._lock:
            if self._running(entry.pid):
                return self._end_driver(name, f"upgrade to {path} requested", take_over, status=RESTARTING)
            entry.file = path
            return self.registry.put(entry)

    def rescale(self, name: str, partitions: int) -> Entry:
        """Stop the pipeline at a batch boundary, spread its keyed state over ``partitions``
        (``headrace rescale``, Spark's offline repartition), then start it again; a rescale that
        fails leaves the pipeline failed, its error among its exceptions and its checkpoint as it was.
        What ``headrace rescale`` would refuse is refused at once."""
        entry = self._refuse_when(name, "rescale", RESCALING, STOPPING, DRAINING)
        preflight.refuse_rescale(pipeline_roots(entry), name, partitions, self._running(entry.pid))
        return self._end_driver(name, f"rescale to {partitions} state partitions requested",
                                lambda ended: self._rescale(ended, partitions), status=STOPPING)

    def _refuse_when(self, name: str, action: str, *statuses: str) -> Entry:
        """The pipeline, unless it is in one of ``statuses``, where ``action`` makes no sense (409)."""
        entry = self.existing(name)
        if entry.status in statuses:
            raise Refused(409, f"cannot {action} pipeline {name!r}: it is {entry.status}; {INSTEAD[entry.status]}")
        return entry

    def _rescale(self, entry: Entry, partitions: int) -> None:
        """Rescale the stopped pipeline in a thread of its own (a Spark job: the watch goes on)."""
        entry.status, entry.wanted, entry.reason = RESCALING, True, f"rescaling its state to {partitions} partitions"

        def run() -> None:
            with open(os.path.join(entry.state_dir, DRIVER_LOG), "ab") as log:
                start = log.tell()
                done = subprocess.run([sys.executable, "-m", "headrace.cli", "rescale", entry.file, str(partitions),
                                       "--state-dir", entry.state_dir], stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, check=False,
                                      env={**os.environ, "PYSPARK_PYTHON": sys.executable})
            with self._lock:
                current = self.registry.get(entry.name)
                if current is None or current.status != RESCALING:
                    return  # removed or stopped meanwhile
                if done.returncode == 0:
                    self._launch(current)
                    return
                self._log_from[entry.name] = start
                current.last_exit = done.returncode
                self._record_error(current)
                current.status, current.wanted = FAILED, False
                current.reason = f"the rescale to {partitions} partitions failed (see its exceptions)"
                self.registry.put(current)

        threading.Thread(target=run, name=f"headrace-rescale-{entry.name}", daemon=True).start()

    def _end_driver(self, name: str, why: str, then: Callable[[Entry], None], *, now: bool = False,
                    status: str = STOPPING) -> Entry:
        """Ask the driver to stop (at a batch boundary unless ``now``), and do ``then`` once it has."""
        with self._lock:
            entry = self.existing(name)
            self._due.pop(name, None)
            if not self._running(entry.pid):
                self._await_session_end(entry)
                entry.pid = 0
                then(entry)
                return self.registry.put(entry)
            self._after_exit[name] = then
            entry.status, entry.reason = status, why
            self._signal(entry.pid, now)
            return self.registry.put(entry)

    @staticmethod
    def _stopped(entry: Entry) -> None:
        _drain_mark(entry).unlink(missing_ok=True)
        entry.status, entry.wanted, entry.reason = STOPPED, False, "stopped on request"

    @staticmethod
    def _paused(entry: Entry) -> None:
        _drain_mark(entry).unlink(missing_ok=True)
        entry.status, entry.wanted, entry.reason = PAUSED, False, "paused at a batch boundary; resume goes on"

    def remove(self, name: str) -> None:
        with self._lock:
            entry = self.existing(name)
            if entry.status in LIVE:
                raise Refused(409, f"pipeline {name!r} is {entry.status}; stop it first")
            self.registry.remove(name)

    def logs(self, name: str, lines: int) -> str:
        """The last ``lines`` lines of the pipeline's driver log (a line per batch, what its sinks print)."""
        return tail(os.path.join(self.existing(name).state_dir, DRIVER_LOG), lines)

    def existing(self, name: str) -> Entry:
        entry = self.registry.get(name)
        if entry is None:
            known = ", ".join(e.name for e in self.registry.all()) or "none"
            raise Refused(404, f"no pipeline {name!r} (the server has: {known})")
        return entry

    def restart_policy(self, name: str) -> RestartPolicy:
        """The restart strategy the pipeline's drivers are supervised under."""
        with self._lock:
            return self._policies.get(name) or self._policy()

    # -- checks before a start ----------------------------------------------------------------------

    def _await_session_end(self, entry: Entry | None) -> None:
        """Wait (a request's thread) until the processes of the pipeline's last driver, which has
        ended, have all ended too, sending them SIGKILL; refused when they do not end in time."""
        if entry is None or not entry.pid:
            return
        deadline = time.monotonic() + SESSION_END_WAIT_S
        while end_session(entry.pid):
            if time.monotonic() > deadline:
                raise Refused(409, f"the processes of pipeline {entry.name!r}'s last driver "
                                   f"({', '.join(map(str, session_processes(entry.pid)))}) have not ended "
                                   f"{SESSION_END_WAIT_S:g} s after SIGKILL; ask again once they have")
            time.sleep(0.02)

    def _allowed_file(self, file: str) -> str:
        try:
            path = os.path.realpath(file)
            os.fsencode(path)
        except (ValueError, UnicodeError):  # a NUL character, a lone surrogate
            raise Refused(400, f"{file!r} is not a path this machine can open") from None
        if not any(os.path.commonpath([path, folder]) == folder for folder in self.allowed):
            raise Refused(403, f"{file} is outside the directories this server runs files from "
                               f"({', '.join(self.allowed)}; headrace server --allow DIR adds one)")
        if not os.path.isfile(path):
            raise Refused(400, f"no file {file}")
        return path

    # -- drivers ------------------------------------------------------------------------------------

    def _launch(self, entry: Entry, cold: bool = False) -> None:
        """Start the pipeline's driver: a warm standby's when one is ready (and not ``cold``), else a new one."""
        os.makedirs(entry.state_dir, exist_ok=True)
        exit_file = os.path.join(entry.state_dir, "driver.exit")
        if os.path.exists(exit_file):
            os.remove(exit_file)
        log, progress = os.path.join(entry.state_dir, DRIVER_LOG), os.path.join(entry.state_dir, PROGRESS_FILE)
        self._log_from[entry.name] = os.path.getsize(log) if os.path.exists(log) else 0
        job = {"file": entry.file, "state_dir": entry.state_dir, "log": log, "progress_log": progress,
               "exit_file": exit_file}
        draining = _drain_mark(entry).exists()
        taken = None if cold or draining or self.standbys is None else self.standbys.take(job)
        child = taken[0] if taken is not None else None
        entry.reason = ("driver started" if taken is None else "a warm standby driver took it" if taken[1]
                        else "a standby driver, still warming up, took it")
        self._settling[entry.name] = time.time()
        if child is None:
            command = self._driver_command(entry, exit_file, draining)
            environment = {**os.environ, "PYSPARK_PYTHON": sys.executable, "HEADRACE_PROGRESS_LOG": progress}
            with open(log, "ab") as out:
                child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, env=environment)
        self._children[child.pid] = child
        entry.pid, entry.status, entry.wanted, entry.last_exit = child.pid, RUNNING, True, None
        if draining:
            entry.status, entry.reason = DRAINING, "draining: reading what its sources hold, then firing every window"
        self.registry.put(entry)

    @staticmethod
    def _driver_command(entry: Entry, exit_file: str, draining: bool) -> list[str]:
        """The command of a new driver: ``headrace run`` under ``headrace/server/driver.py``."""
        return [sys.executable, "-m", "headrace.server.driver", exit_file, "run", entry.file,
                "--state-dir", entry.state_dir, *(["--drain"] if draining else [])]

    @staticmethod
    def _signal(pid: int, now: bool) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
            if now:  # a second SIGTERM stops a run at once (headrace/runtime/signals.py)
                time.sleep(0.2)
                os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_S):
            with self._lock:
                if self.standbys is not None:
                    self.standbys.tend(quiet=self._settled())
                for entry in self.registry.all():
                    self._look_at(entry)
                    self.operations.settle(entry, functools.partial(
                        _last_report_at, os.path.join(entry.state_dir, PROGRESS_FILE), "started"))

    def _look_at(self, entry: Entry) -> None:
        due = self._due.get(entry.name)
        if due is not None:
            if time.time() >= due and entry.wanted:
                del self._due[entry.name]
                self._launch(entry)
            return
        if entry.status not in LIVE or self._running(entry.pid) or self._session_left(entry):
            return
        status = self._exit_status(entry)
        entry.last_exit, entry.pid = status, 0
        error = self._record_error(entry) if status not in (None, 0, NEEDS_COLD_START) else ""
        then = self._after_exit.pop(entry.name, None)
        if then is not None:
            then(entry)
        elif status == NEEDS_COLD_START and entry.wanted:  # a standby that could not take it
            self._launch(entry, cold=True)
        elif not entry.wanted:
            self._stopped(entry)
        elif status == 0:
            drained = _drain_mark(entry)
            entry.status, entry.wanted = FINISHED, False
            entry.reason = "drained: every window fired; it ended for good" if drained.exists() else "its input ended"
            drained.unlink(missing_ok=True)
        elif status == REFUSED_EXIT_STATUS:
            self._refused(entry, error)
        else:
            self._after_crash(entry, "killed" if status is None else f"exit status {status}")
        self.registry.put(entry)

    def _session_left(self, entry: Entry) -> bool:
        """Whether processes of the pipeline's driver, which has ended, are left: those get SIGKILL
        (looked at again on the next round), and the driver's end is handled once none is left."""
        left = end_session(entry.pid)
        if left and not entry.reason.startswith(ENDING_SESSION):
            entry.reason = f"{ENDING_SESSION} ({len(left)} left: Spark's JVM, Python workers)"
            self.registry.put(entry)
        return bool(left)

    def _settled(self) -> bool:
        """Whether every driver started lately has committed its first batch (or has been running
        for ``SETTLE_AT_MOST_S``, or ended): a new standby's JVM would no longer slow its start."""
        now = time.time()
        for name, started in list(self._settling.items()):
            entry = self.registry.get(name)
            batch_at = None if entry is None else _last_report_at(os.path.join(entry.state_dir, PROGRESS_FILE),
                                                                  "batch")
            if (entry is None or now - started >= SETTLE_AT_MOST_S or not self._running(entry.pid)
                    or (batch_at is not None and batch_at >= started)):
                del self._settling[name]
        return not self._settling

    def _running(self, pid: int) -> bool:
        child = self._children.get(pid)
        if child is not None:
            if child.poll() is None:
                return True
            del self._children[pid]
            return False
        return process_alive(pid)

    def _record_error(self, entry: Entry) -> str:
        """The error a failed driver printed last (``headrace: ...``), counted among the pipeline's
        exceptions; a driver that printed none (a crash of Python itself) counts as its exit."""
        try:
            with open(os.path.join(entry.state_dir, DRIVER_LOG), encoding="utf-8", errors="replace") as log:
                log.seek(self._log_from.get(entry.name, 0))
                printed = log.read()
        except FileNotFoundError:
            printed = ""
        errors = [line[len(ERROR_PREFIX):] for line in printed.splitlines() if line.startswith(ERROR_PREFIX)]
        error = errors[-1] if errors else f"the driver ended with exit status {entry.last_exit}"
        self.registry.add_exception(entry.name, error, time.time())
        return error

    @staticmethod
    def _exit_status(entry: Entry) -> int | None:
        try:
            with open(os.path.join(entry.state_dir, "driver.exit"), encoding="utf-8") as status:
                return int(status.read().strip())
        except (FileNotFoundError, ValueError):
            return None

    def _refused(self, entry: Entry, error: str) -> None:
        """The driver refused to run the pipeline as it is: failed at once, not restarted."""
        entry.status, entry.wanted = FAILED, False
        entry.reason = (f"refused: {error} (not restarted: running it again as it is would not help; fix the cause, "
                        "then restart it)")

    def _after_crash(self, entry: Entry, how: str) -> None:
        policy = self._policies.setdefault(entry.name, self._policy())
        delay = policy.next_delay(time.time())
        if delay is None:
            entry.status, entry.wanted = FAILED, False
            entry.reason = f"driver {how}; no restart left ({policy.describe()})"
            return
        entry.restarts += 1
        entry.status, entry.reason = RESTARTING, f"driver {how}; restarting from its checkpoint in {delay:g} s"
        self._due[entry.name] = time.time() + delay


def tail(path: str, lines: int, block: int = 64 * 1024) -> str:
    """The last ``lines`` lines of the file at ``path`` ("" when there is none), read from its end: a
    driver's log grows by a line per batch."""
    try:
        with open(path, "rb") as log:
            end = start = log.seek(0, os.SEEK_END)
            data = b""
            while start > 0 and data.count(b"\n") <= lines:
                start = max(0, start - block)
                log.seek(start)
                data = log.read(end - start)
    except FileNotFoundError:
        return ""
    return "".join(data.decode("utf-8", errors="replace").splitlines(keepends=True)[-lines:])


def _drain_mark(entry: Entry) -> Path:
    """The file that says the pipeline drains: its next driver, a restarted one too, runs ``--drain``."""
    return Path(entry.state_dir, "drain.requested")


def _last_report_at(progress: str, kind: str) -> float | None:
    """When a driver last wrote a line of ``kind`` to its progress file: ``started`` (its query
    started) or ``batch`` (a micro-batch ended); None when none is in the file's last 64 KB."""
    try:
        with open(progress, "rb") as log:
            log.seek(max(0, os.path.getsize(progress) - 65536))
            lines = log.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            figures = json.loads(line)
        except ValueError:
            continue
        if isinstance(figures, dict) and kind in figures and isinstance(figures.get("at"), (int, float)):
            return float(figures["at"])
    return None
