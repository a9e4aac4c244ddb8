"""Run a pipeline: start its one streaming query, show progress, stop at a batch boundary,
restart from its checkpoint."""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace import config
from headrace.errors import HeadraceError, PipelineFailed, raised_inside
from headrace.runtime.compatibility import record_plan, verify_restart
from headrace.runtime.progress import ProgressDisplay
from headrace.runtime.session import get_session
from headrace.spark.compiler import compile_plan
from headrace.spark.specs import check_plan, trigger_interval
from headrace.spark.writer import start_query


def default_state_dir() -> str:
    return config.STATE_DIR.get()


@dataclass
class RunResult:
    """What a finished run reports."""

    pipeline: str
    batches: int
    input_rows: int
    dead_letters: int
    late_rows_dropped: int
    stopped_by: str
    checkpoint: str
    elapsed_s: float = 0.0
    progress: list[dict[str, Any]] = field(default_factory=list, repr=False)


class PipelineRun:
    """One run of a pipeline's query. ``start()``, then ``wait()``; ``request_stop()`` from
    anywhere (signal handler, another thread) drains it to a batch boundary."""

    def __init__(self, pipeline: Any, *, state_dir: str | None = None, master: str | None = None,
                 progress: str = "line", fresh: bool = False, trigger_interval: str | None = None) -> None:
        self.pipeline = pipeline
        self.plan = pipeline.plan
        check_plan(self.plan)
        root = Path(state_dir or default_state_dir()) / self.plan.name
        self.checkpoint = str(root / "checkpoint")
        self.run_dir = str(root / "run")
        if fresh:
            shutil.rmtree(root, ignore_errors=True)
        self.master = master
        self.display = ProgressDisplay(progress)
        self.trigger_interval = trigger_interval
        self.query: Any = None
        self.compiled: Any = None
        self.stop_reason = ""
        self.started_at = 0.0
        self.progress_log: list[dict[str, Any]] = []

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> PipelineRun:
        root = str(Path(self.checkpoint).parent)
        verify_restart(self.plan, root)  # before Spark starts: refuse a checkpoint this plan cannot continue
        spark = get_session(self.master)
        os.makedirs(self.run_dir, exist_ok=True)
        for leftover in ("stop", "exhausted"):
            path = Path(self.run_dir) / leftover
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        try:
            self.compiled = compile_plan(self.plan, spark, self.run_dir)
            record_plan(self.plan, root)
            self.started_at = time.time()
            self.query = start_query(self.plan, self.compiled, self.checkpoint, self.run_dir, self.trigger_interval)
        except HeadraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - Spark refused the query: say so in one line
            raise translate_failure(self.plan.name, exc) from None
        return self

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask every source to hand out no new data; the query stops after the current batch."""
        self.stop_reason = self.stop_reason or reason
        os.makedirs(self.run_dir, exist_ok=True)
        Path(self.run_dir, "stop").touch()

    @property
    def stopping(self) -> bool:
        return os.path.exists(os.path.join(self.run_dir, "stop"))

    def bounded(self) -> bool:
        return all(source.connector.bounded for source in self.plan.sources())

    def exhausted(self) -> bool:
        folder = Path(self.run_dir) / "exhausted"
        return all((folder / source.name).exists() for source in self.plan.sources())

    def release_paced(self) -> None:
        """Offer the next micro-batch of each paced source (the test kit's sources)."""
        for source in self.plan.sources():
            if getattr(source.connector, "paced", False):
                source.connector.release(self.run_dir, source.name)

    def poll(self) -> None:
        """Record and show every progress report since the last poll; raise if the query failed."""
        last = self.progress_log[-1]["batchId"] if self.progress_log else -1
        for progress in self.query.recentProgress:
            if progress.get("batchId", -1) > last:
                self.progress_log.append(progress)
                self.display.update(progress)
                last = progress["batchId"]
        if not self.query.isActive:
            self._raise_failure()

    def settle(self) -> None:
        """Block until every offset the sources have handed out is processed and committed."""
        if trigger_interval(self.plan, None):
            return self._settle_timed()
        try:
            self.query.processAllAvailable()
        except Exception as exc:  # noqa: BLE001 - Spark raises its own wrapper types
            self._stop_quietly()
            raise translate_failure(self.plan.name, exc) from None
        self.poll()

    def _settle_timed(self) -> None:
        """``settle`` for a query in Spark's processing-time mode, which runs a micro-batch at
        every trigger and so is never idle for ``processAllAvailable``: wait for a micro-batch
        planned after now that found no offset beyond those it read."""
        since = time.time()
        while True:
            self.poll()
            done = [p for p in self.progress_log
                    if _started_at(p) >= since and all(s.get("endOffset") == s.get("latestOffset")
                                                       for s in p.get("sources", []))]
            if done:
                return
            time.sleep(0.05)

    def wait(self, until_exhausted: bool | None = None, max_seconds: float | None = None,
             on_settled: Callable[[PipelineRun], None] | None = None) -> RunResult:
        """Run until the input is exhausted (bounded pipelines by default), a stop is
        requested, or ``max_seconds`` pass; then stop at a batch boundary."""
        until_exhausted = self.bounded() if until_exhausted is None else until_exhausted
        deadline = None if max_seconds is None else time.time() + max_seconds
        try:
            while not self.stopping:
                if not self.query.isActive:  # stopped from outside (query.stop(), another thread)
                    self._raise_failure()
                    self.stop_reason = self.stop_reason or "query stopped"
                    break
                if until_exhausted:
                    self.release_paced()
                    self.settle()
                    if on_settled:
                        on_settled(self)
                    if self.exhausted():
                        self.settle()
                        self.stop_reason = self.stop_reason or "input exhausted"
                        break
                    time.sleep(0.05)
                else:
                    self.query.awaitTermination(0.25)
                    self.poll()
                    if self.exhausted():  # e.g. a socket whose peer closed the connection
                        self.settle()
                        self.stop_reason = self.stop_reason or "input exhausted"
                        break
                if deadline is not None and time.time() > deadline:
                    self.request_stop(f"ran for {max_seconds} s")
            if self.stopping:
                self.settle()
        finally:
            self._stop_quietly()
            self.display.close()
        return self.result()

    def result(self) -> RunResult:
        totals = self.display.totals
        return RunResult(self.plan.name, len(self.progress_log), totals["input_rows"], totals["dead_letters"],
                         totals["late_rows_dropped"], self.stop_reason, self.checkpoint,
                         round(time.time() - self.started_at, 3), self.progress_log)

    def _stop_quietly(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()

    def _raise_failure(self) -> None:
        error = self.query.exception()
        if error is not None:
            raise translate_failure(self.plan.name, error)


def translate_failure(pipeline: str, exc: BaseException) -> HeadraceError:
    """Turn Spark's wrapped failure back into the headrace error raised inside it."""
    if isinstance(exc, HeadraceError):
        return exc
    text = str(exc)
    inner = raised_inside(text)
    if inner is not None:
        return inner
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return PipelineFailed(f"pipeline {pipeline!r} failed: {first}")


def _started_at(progress: dict[str, Any]) -> float:
    """When Spark started the micro-batch of a progress report, in seconds since the epoch."""
    stamp = progress["timestamp"].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def run(pipeline: Any, *, state_dir: str | None = None, master: str | None = None, progress: str = "line",
        fresh: bool = False, until_exhausted: bool | None = None, max_seconds: float | None = None,
        trigger_interval: str | None = None, handle_signals: bool = True) -> RunResult:
    """Run ``pipeline`` until its bounded input is exhausted, Ctrl-C / SIGTERM, or ``max_seconds``.

    Restarting with the same ``state_dir`` continues from the checkpoint exactly where the
    previous run stopped; ``fresh=True`` forgets it.
    """
    runner = PipelineRun(pipeline, state_dir=state_dir, master=master, progress=progress, fresh=fresh,
                         trigger_interval=trigger_interval)
    previous: dict[signal.Signals, Any] = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        def on_signal(signum: int, _frame: Any) -> None:
            runner.request_stop(f"signal {signal.Signals(signum).name}")
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
    try:
        runner.start()
        return runner.wait(until_exhausted=until_exhausted, max_seconds=max_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
