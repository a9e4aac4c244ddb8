"""Run a pipeline: start its one streaming query, report its progress, stop it at a batch
boundary, and restart it from its checkpoint after a failure worth restarting.

Spark calls happen on the run's own thread. Signals (``headrace/runtime/signals.py``) only
ask for a stop (``request_stop``) or, the second time, stop the query from a thread of their
own (``halt``); a failure of the query is classified (``headrace/runtime/failures.py``) and
either restarted under the run's ``RestartPolicy`` or raised as one headrace error.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import os
import queue
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace import config
from headrace.contract import SourceContext, strict_read_failed
from headrace.environment import checkpoints, end_of_time, storage
from headrace.environment.admission import ADMISSION_FILE, AdmissionControl
from headrace.environment.checkpoints import pipeline_root, query_id, read_query_id
from headrace.environment.hdfs_lease import HdfsLease, LeaseLost, takes_hdfs_lease
from headrace.environment.lease import Lease
from headrace.environment.session import get_session, spark_log_file
from headrace.environment.user_modules import ship_user_modules
from headrace.errors import HeadraceError, PlanError
from headrace.plan.nodes import ScoreNode
from headrace.runtime import events
from headrace.runtime.compatibility import record_plan, verify_restart
from headrace.runtime.failures import classify, spark_trace
from headrace.runtime.progress import BatchLog, ProgressDisplay, summarise
from headrace.runtime.restarts import RestartPolicy
from headrace.runtime.signals import stop_on_signals
from headrace.spark.compiler import compile_plan
from headrace.spark.marked_counts import ExecutionStore
from headrace.spark.plan_checks import check_plan
from headrace.spark.score_lowering import recorded_version
from headrace.spark.specs import has_operators, stateful_steps, trigger_interval
from headrace.spark.state_operators import steps_of_state_operators
from headrace.spark.step_counts import same_count_as_input, same_count_as_output
from headrace.spark.writer import LOGGED_BATCH_ONLY, READ_AVAILABLE, counted_by_spark_store, start_query

HALT_TIMEOUT_S = 30.0  # how long a stop at once may take before the run gives up waiting for it


def default_state_dir() -> str:
    return config.STATE_DIR.get()


@dataclass
class RunResult:
    """What a finished run reports (``headrace/runtime/progress.py`` says what is counted)."""

    pipeline: str
    batches: int
    input_rows: int
    dead_letters: int
    late_rows_dropped: int
    stopped_by: str
    checkpoint: str
    elapsed_s: float = 0.0
    restarts: int = 0
    progress: list[dict[str, Any]] = field(default_factory=list, repr=False)  # Spark's report of each batch


class PipelineRun:
    """One run of a pipeline's query. ``start()``, then ``wait()``; ``request_stop()`` from
    anywhere (signal handler, another thread) drains it to a batch boundary."""

    def __init__(self, pipeline: Any, *, state_dir: str | None = None, master: str | None = None,
                 progress: str = "line", fresh: bool = False, trigger_interval: str | None = None,
                 restart_attempts: int | None = None, restart_window: Any = None, restart_backoff: Any = None,
                 drain: bool = False, backfill: bool = False) -> None:
        if _deferring.get():  # before anything, --fresh's deletion included
            raise RunDeferred(pipeline)
        self.pipeline = pipeline
        self.plan = pipeline.plan
        check_plan(self.plan)
        self.restart_policy = RestartPolicy.of(restart_attempts, restart_window, restart_backoff)
        self.state_dir = state_dir or default_state_dir()
        self.root = pipeline_root(self.state_dir, self.plan.name)
        self.checkpoint = storage.join(self.root, "checkpoint")
        # A remote state dir (hdfs://, s3a://) is reached through Spark's JVM, so what needs it
        # waits for the session (``start``); its run files are local, named after the query id.
        self.remote = storage.is_remote(self.root)
        self.run_dir = "" if self.remote else checkpoints.run_dir(self.root, self.plan.name, "")
        self._fresh = fresh
        # one driver per checkpoint: taken as the run starts, before --fresh deletes anything (on
        # HDFS, once the session runs: HDFS's own lease, checked before each batch's sinks commit)
        self.lease = None if self.remote else Lease(self.state_dir, self.plan.name)
        self.hdfs_lease = HdfsLease(self.state_dir, self.plan.name) if takes_hdfs_lease(self.state_dir) else None
        self.master = master
        self.display = ProgressDisplay(progress)
        self.trigger_interval = trigger_interval
        self.query: Any = None
        self.compiled: Any = None
        self.stop_reason = ""
        self.started_at = 0.0
        self.restarts = 0
        self.lenient_sources: frozenset[str] = frozenset()  # met a bad record while read strictly (_read_leniently)
        sources = [source.name for source in self.plan.sources()]
        self.batches = BatchLog(sources, same_count_as_input(self.plan), same_count_as_output(self.plan))
        self._execution_store: ExecutionStore | None = None  # where Spark keeps marked counts (marked_counts.py)
        self._spark: Any = None
        self._query_id = ""  # Spark's id of the query, kept in the checkpoint
        self._inbox: queue.SimpleQueue[dict[str, Any]] | None = None
        self._stop_asked = False
        self._halted = False
        self._halting: threading.Thread | None = None
        self.admission: AdmissionControl | None = None
        # a drain (``drain``): how the query it runs now ends (headrace/spark/writer.py), None otherwise
        self.draining = drain and not self.bounded()  # a bounded pipeline drains by running to its end
        self._ending: str | None = None
        self._operators_named = False
        if self.draining:
            refuse_drain(self.plan)
        # a backfill (``backfill``): what the sources hold when it starts, in bounded batches, then live
        self.backfilling = backfill and not self.bounded()  # a bounded pipeline reads only what it holds
        self.backfilled_to: int | None = None  # the last batch of the backfill, once it is done
        if backfill:
            refuse_backfill(self.plan, drain)

    @property
    def progress_log(self) -> list[dict[str, Any]]:
        """Spark's progress report of each batch so far, in batch order."""
        return self.batches.reports

    # -- life cycle -----------------------------------------------------------------------------
    def start(self) -> PipelineRun:
        """Check the checkpoint, start Spark and the query; a stop asked before the query starts
        leaves it unstarted (``wait`` then returns at once)."""
        self.started_at = time.time()
        if self._stop_asked:
            return self
        if self.lease is not None:
            self.lease.acquire()
        try:
            return self._start()
        except BaseException:
            self._release_lease()
            raise

    def _start(self) -> PipelineRun:
        if self._fresh and not self.remote:
            storage.delete_tree(self.root)
            self._fresh = False
        if not self.remote:
            end_of_time.refuse_drained(self.root, self.plan.name)
            verify_restart(self.plan, self.root)  # before Spark starts: refuse a checkpoint this plan cannot continue
        self._spark = get_session(self.master, spark_log_file(self.state_dir), self.plan.spark_packages())
        ship_user_modules(self._spark)  # before any of the pipeline's code is pickled for the workers
        if self.hdfs_lease is not None:
            self.hdfs_lease.acquire()
        if self.remote:  # the same checks and files, through the session's Hadoop file system API
            self._open_remote_state()
        os.makedirs(self.run_dir, exist_ok=True)
        for leftover in ("stop", "exhausted", ADMISSION_FILE):
            path = Path(self.run_dir) / leftover
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
        if self._stop_asked:  # asked while the leftovers went: mark it again
            self._mark_stop()
        if self.plan.batch_duration is not None:
            self.admission = AdmissionControl(self.plan.batch_duration, self.run_dir)
        self._query_id = self._query_id or query_id(self.checkpoint)
        if self.draining:  # an interrupted drain goes on with its logged end
            self._ending = LOGGED_BATCH_ONLY if end_of_time.pending_end(self.checkpoint) is not None else READ_AVAILABLE
        elif self.backfilling:
            self._ending = READ_AVAILABLE
        self._inbox = events.follow(self._spark, self._query_id,
                                    self._admit if self.admission is not None else None)
        try:
            self._start_query()
        except BaseException:
            events.unfollow(self._spark, self._query_id, self._inbox)
            raise
        return self

    def _open_remote_state(self) -> None:
        """For a state dir on HDFS or S3, once the session runs: forget the old checkpoint
        (``fresh``) with its local run files, refuse a checkpoint this plan cannot continue
        (before the query starts), and place the run files by the checkpoint's query id."""
        if self._fresh:
            old = read_query_id(self.checkpoint)
            if old is not None:
                shutil.rmtree(checkpoints.run_dir(self.root, self.plan.name, old), ignore_errors=True)
            storage.delete_tree(self.root)
            self._fresh = False
        end_of_time.refuse_drained(self.root, self.plan.name)
        verify_restart(self.plan, self.root)
        self._query_id = query_id(self.checkpoint)
        self.run_dir = checkpoints.run_dir(self.root, self.plan.name, self._query_id)

    def _admit(self, progress: dict[str, Any]) -> None:
        """Spark's progress report of a batch, as it arrives (``headrace/runtime/events.py``): the
        next batch's cap under adaptive admission."""
        assert self.admission is not None
        figures = summarise(progress)
        self.admission.batch_done(figures["input_rows"], figures["batch_ms"])

    def _start_query(self) -> None:
        """Compile the plan and start its query, unless a stop was asked meanwhile (no batch has
        run then: there is nothing to drain)."""
        try:
            if not self._stop_asked:
                self.compiled = compile_plan(self.plan, self._spark, self.run_dir, self.checkpoint,
                                             self.lenient_sources)
            if not self._stop_asked:
                record_plan(self.plan, self.root, trigger_interval(self.plan, self.trigger_interval))
                self.query = start_query(self.plan, self.compiled, self.checkpoint, self.run_dir,
                                         self.trigger_interval, self._ending,
                                         self.hdfs_lease.check if self.hdfs_lease is not None else None)
                self.batches.marks = self.compiled.lowering.marks
                if counted_by_spark_store(self.plan, self.compiled):
                    self._execution_store = ExecutionStore(self._spark._jsparkSession, str(self.query.id))
                self.display.started()
        except HeadraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - Spark refused the query: say why in one line
            raise classify(self.plan, exc).error from None

    def _add_model_versions(self, figures: dict[str, Any]) -> None:
        """The model version each score step scored the batch with (kept in the checkpoint)."""
        steps = [node.name for node in self.plan.nodes.values() if isinstance(node, ScoreNode)]
        versions = {step: recorded_version(self.checkpoint, step, figures["batch"]) for step in steps}
        figures["model_versions"] = {step: version for step, version in versions.items() if version is not None}

    def request_stop(self, reason: str = "stop requested") -> None:
        """Ask every source to hand out no new data; the query stops after the current batch."""
        self.stop_reason = self.stop_reason or reason
        self._stop_asked = True
        self._mark_stop()

    def halt(self, reason: str) -> bool:
        """Stop the query at once, from a thread of its own (the batch in flight runs again on the
        next start); False when there is no query to stop or it is being stopped already."""
        if self.query is None or self._halted:
            return False
        self.stop_reason, self._halted = reason, True
        halting = threading.Thread(target=self._stop_quietly, name="headrace-halt", daemon=True)
        halting.start()
        self._halting = halting  # started before the run's thread can see the stop and join it
        self._stop_asked = True
        return True

    def halted(self) -> bool:
        """Whether a stop at once has stopped the query."""
        return self._halting is not None and not self._halting.is_alive()

    def _mark_stop(self) -> None:
        if not self.run_dir:  # a remote state dir's run files are placed once the session runs
            return
        os.makedirs(self.run_dir, exist_ok=True)
        Path(self.run_dir, "stop").touch()

    @property
    def stopping(self) -> bool:
        return self._stop_asked or bool(self.run_dir) and os.path.exists(os.path.join(self.run_dir, "stop"))

    def bounded(self) -> bool:
        return all(source.connector.bounded for source in self.plan.sources())

    def drains(self) -> bool:
        """Whether every source hands out no new data once a stop is asked (headrace's Python
        sources do), so that a stop can wait for all they handed out (``settle``)."""
        return all(source.connector.drains_on_stop for source in self.plan.sources())

    def _end_of_batch(self) -> None:
        """A stop with a source that keeps handing out data (Spark's Kafka source): wait until
        the micro-batch running now, if any, has committed; the query then stops. Batches may
        follow each other with no pause (real-time mode's always do), so the wait ends when one
        more batch has reported progress, and a batch that started meanwhile is interrupted (it
        runs again at the next start)."""
        reported = _batch_id(self.query.lastProgress)
        while self._alive() and self.query.status.get("isTriggerActive"):
            if _batch_id(self.query.lastProgress) != reported:
                break
            time.sleep(0.05)
        self._collect()

    def between_batches(self) -> None:
        """Let each source whose query cannot see its end by itself look at where the query is
        (between micro-batches, and while one runs: what a source reads is logged before its batch)."""
        for source in self.plan.sources():
            source.connector.between_batches(SourceContext(self.run_dir, source.name, self.checkpoint))

    def exhausted(self) -> bool:
        folder = Path(self.run_dir) / "exhausted"
        return all((folder / source.name).exists() for source in self.plan.sources())

    def release_paced(self) -> None:
        """Offer the next micro-batch of the paced sources (the test kit's), all at once."""
        paced = [source.connector for source in self.plan.sources() if getattr(source.connector, "paced", False)]
        if paced:
            from headrace.connectors.scripted import release_step

            release_step(self.run_dir, paced)

    def poll(self) -> None:
        """Record and show every batch reported since the last poll."""
        if self._inbox is None:
            return
        while True:
            try:
                report = self._inbox.get_nowait()
            except queue.Empty:
                return
            if self._execution_store is not None:
                try:
                    self._execution_store.read(self.plan.name, int(report["batchId"]))
                except Exception:  # noqa: BLE001 - a figure of the batch: never a reason to fail the run
                    pass
            figures = self.batches.record(report)
            if not self.remote:
                self._add_model_versions(figures)
            self.display.batch(figures, self.batches.totals(), self.restarts)
            if not self._operators_named:
                self._name_state_operators()

    def _name_state_operators(self) -> None:
        """Note, once a run, which step each of Spark's stateful operators belongs to (the server's
        checkpoints tab and step drawers show each step's state by partition)."""
        self._operators_named = True
        try:
            named = steps_of_state_operators(self.query)
            if named:
                checkpoints.write_state_operators(self.root, named)
        except Exception:  # noqa: BLE001 - a label for the web UI: never a reason to fail a run
            pass

    def _collect(self) -> None:
        """Wait for the reports of every batch Spark has finished, and record them."""
        if self._spark is not None:
            events.deliver_pending(self._spark)
        self.poll()

    def settle(self) -> None:
        """Block until every offset the sources have handed out is processed and committed."""
        if trigger_interval(self.plan, None):
            return self._settle_timed()
        while self._alive():
            if self._process_all_available():
                break
        self._collect()

    def _process_all_available(self) -> bool:
        """Spark's ``processAllAvailable``, in a thread of its own while this one records each batch
        as it ends (the progress log, the server's live figures); False when the query failed."""
        done, failed = threading.Event(), threading.Event()

        def process() -> None:
            try:
                self.query.processAllAvailable()
            except Exception:  # noqa: BLE001 - the query failed: _alive() restarts it or raises
                failed.set()
            finally:
                done.set()

        threading.Thread(target=process, name="headrace-settle", daemon=True).start()
        while not done.wait(0.25):
            self.poll()
            # while a batch runs: a bounded source whose last files that batch took writes its end
            # now, so the next batch reads it at once (no batch without data, no wait in between)
            self.between_batches()
        return not failed.is_set()

    def _settle_timed(self) -> None:
        """``settle`` for a query in Spark's processing-time mode, which runs a micro-batch at
        every trigger and so is never idle for ``processAllAvailable``: wait for a micro-batch
        planned after now that found no offset beyond those it read."""
        since = time.time()
        while self._alive():
            self.poll()
            if any(_started_at(p) >= since and all(s.get("endOffset") == s.get("latestOffset")
                                                   for s in p.get("sources", []))
                   for p in self.progress_log):
                return
            time.sleep(0.05)

    def _release_lease(self) -> None:
        for lease in (self.lease, self.hdfs_lease):
            if lease is not None:
                lease.release()

    def _alive(self) -> bool:
        """Whether the query runs. A failed query is restarted when that can help and the
        restart policy allows it, and its failure raised otherwise. A driver that lost its lease
        on HDFS stops at once."""
        if self.hdfs_lease is not None and self.hdfs_lease.lost:
            self._stop_quietly()
            raise LeaseLost(self.hdfs_lease.lost)
        if self.query.isActive:
            return True
        if self._halted:
            return False
        error = self.query.exception()
        if error is None:  # stopped from outside (query.stop(), another thread)
            self.stop_reason = self.stop_reason or "query stopped"
            return False
        self._recover(error, self.query._jsq.exception().get())
        return bool(self.query.isActive)

    def _recover(self, exc: BaseException, java: Any) -> None:
        """Restart the failed query after its backoff, or raise its failure as one headrace error.
        A restart that fails to start for a reason worth a restart (a sink's server still out of
        reach) counts as one more failure under the same policy."""
        if self._read_leniently(exc, java):
            return
        failure = classify(self.plan, exc, java)
        self._collect()
        while True:
            if not failure.restartable or self.stopping:
                raise failure.error from None
            delay = self.restart_policy.next_delay(time.time())
            if delay is None:
                raise failure.giving_up(self.restart_policy.attempts, self.restart_policy.describe()) from None
            self.restarts += 1
            self.display.restart(self.restarts, self.restart_policy.describe(), delay, failure.error)
            if not self._pause(delay):
                return
            try:
                return self._start_query()
            except HeadraceError as error:
                failure = classify(self.plan, error)

    def _read_leniently(self, exc: BaseException, java: Any) -> bool:
        """After a bad record stopped a batch of sources read strictly (``SourceContext.strict``):
        start the query again at once from its checkpoint, those sources read keeping their dead
        letters for the rest of the run, so that the batch runs again and sends the record to
        them. Not a restart under the policy: nothing failed but the guess that no record is bad."""
        strict = set(self.compiled.lowering.strict_sources if self.compiled else ()) - self.lenient_sources
        if not strict or self.stopping or not strict_read_failed(spark_trace(exc, java)):
            return False
        self._collect()
        self.lenient_sources |= strict
        for source in strict:  # a bounded source that took its last files ends again once the batch has run
            (Path(self.run_dir) / "exhausted" / source).unlink(missing_ok=True)
        self._start_query()
        return True

    def _pause(self, seconds: float) -> bool:
        """Sleep ``seconds`` unless a stop is asked meanwhile; True when none was."""
        until = time.time() + seconds
        while not self.stopping and time.time() < until:
            time.sleep(min(0.1, max(0.0, until - time.time())))
        return not self.stopping

    def wait(self, until_exhausted: bool | None = None, max_seconds: float | None = None,
             on_settled: Callable[[PipelineRun], None] | None = None) -> RunResult:
        """Run until the input is exhausted (bounded pipelines by default), a stop is
        requested, or ``max_seconds`` pass; then stop at a batch boundary. A stop at once
        (``halt``, a second signal) ends in KeyboardInterrupt."""
        until_exhausted = self.bounded() if until_exhausted is None else until_exhausted
        # A timer, not a check in the loop: settle() blocks until a bounded input is exhausted.
        timer = None
        if max_seconds is not None:
            timer = threading.Timer(max_seconds, self.request_stop, args=(f"ran for {max_seconds} s",))
            timer.daemon = True
            timer.start()
        try:
            if self.backfilling:
                self._backfill()
            while self.query is not None and not self.stopping and self._alive():
                if until_exhausted:
                    self.release_paced()
                    self.settle()
                    if on_settled:
                        on_settled(self)
                else:
                    try:
                        self.query.awaitTermination(0.25)
                    except Exception:  # noqa: BLE001 - the query failed: _alive() restarts it or raises
                        continue
                    self.poll()
                self.between_batches()
                if self.exhausted():  # bounded input, or e.g. a socket whose peer closed the connection
                    self.settle()
                    self.stop_reason = self.stop_reason or "input exhausted"
                    break
                if until_exhausted:
                    time.sleep(0.05)
            if self.query is not None and self.stopping and not self._halted and self.query.isActive:
                self.settle() if self.drains() else self._end_of_batch()
        finally:
            if timer is not None:
                timer.cancel()
            self._finish()
        if self._halted:
            raise KeyboardInterrupt(self.stop_reason)
        return self.result()

    def _backfill(self) -> None:
        """A backfill: the query started reads what the sources held when it started, in bounded
        micro-batches (Spark's availableNow: as many as the sources' limits make) as fast as it
        can, and ends; then the live query starts on the same checkpoint, so it reads exactly the
        records that came after. A failure during the backfill restarts it under the restart
        strategy; a stop asked meanwhile ends the run (the next backfill goes on from there)."""
        self._until_ended(lambda: False)
        if self.query is None or self.stopping or self.query.isActive or self.query.exception() is not None:
            return
        self.backfilled_to = checkpoints.last_batch(self.checkpoint, checkpoints.COMMITS)
        self.stop_reason = ""  # the backfill's query ended as it should: the run goes on
        self.display.backfilled(self.backfilled_to)
        self._ending = None
        self._start_query()

    def wait_drained(self) -> RunResult:
        """A drain (``drain=True``): the query reads what the sources held when it started and ends
        by itself; then, when a step keeps state, the batch at the end of time is logged and run
        (``headrace/environment/end_of_time.py``); then the pipeline is marked drained. A stop
        asked meanwhile stops at a batch boundary, and draining again goes on from there."""
        end = end_of_time.pending_end(self.checkpoint) if self.query is not None else None
        try:
            if self.query is not None and self._ending == READ_AVAILABLE:
                self._until_ended(lambda: False)
                if not self.stopping and self._ended_by_itself() and stateful_steps(self.plan):
                    end = end_of_time.log_end(self.checkpoint)
                    if end is not None:
                        self._ending = LOGGED_BATCH_ONLY
                        self._start_query()
            if end is not None and not self.stopping:
                self._until_ended(lambda: self._ended_by_itself(end))
            if self.query is not None and not self.stopping and self._ended_by_itself(end):
                last = end if end is not None else checkpoints.last_batch(self.checkpoint, checkpoints.COMMITS)
                if last is None:
                    self.stop_reason = "nothing to drain: no batch has run"
                else:
                    end_of_time.mark_drained(self.root, last)
                    self.stop_reason = f"drained: every window fired, ended for good at batch {last}"
            elif self.query is not None and self.stopping and self.query.isActive:
                self._end_of_batch()
        finally:
            self._finish()
        if self._halted:
            raise KeyboardInterrupt(self.stop_reason)
        return self.result()

    def _until_ended(self, done: Callable[[], bool]) -> None:
        """Wait until the query ends (restarting it after a failure worth it), ``done()`` holds, or a stop is asked."""
        while not self.stopping and not done() and self._alive():
            try:
                self.query.awaitTermination(0.25)
            except Exception:  # noqa: BLE001 - the query failed: _alive() restarts it or raises
                continue
            finally:
                self.poll()
        self._collect()

    def _ended_by_itself(self, end: int | None = None) -> bool:
        """Whether the drain's query got to its end: its logged end committed, or (none logged)
        the query stopped without an error."""
        if end is not None:
            return (checkpoints.last_batch(self.checkpoint, checkpoints.COMMITS) or -1) >= end
        return not self.query.isActive and self.query.exception() is None

    def _finish(self) -> None:
        try:
            if self._halting is not None:
                self._halting.join(HALT_TIMEOUT_S)
            else:
                self._stop_quietly()
                self._collect()
            if self.query is None or not self.query.isActive:
                self._close_sinks()
        finally:
            if self._inbox is not None:
                events.unfollow(self._spark, self._query_id, self._inbox)
            self._release_lease()
            self.display.close()

    def result(self) -> RunResult:
        totals = self.batches.totals()
        return RunResult(self.plan.name, len(self.batches), totals["input_rows"], totals["dead_letters"],
                         totals["late_rows_dropped"], self.stop_reason, self.checkpoint,
                         round(time.time() - self.started_at, 3) if self.started_at else 0.0, self.restarts,
                         self.batches.reports)

    def _close_sinks(self) -> None:
        """Each sink's connections closed: the query that wrote through them has stopped."""
        for sink in self.plan.sinks():
            with contextlib.suppress(Exception):  # the run's outcome stands: its batches are committed
                sink.connector.close()

    def _stop_quietly(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()


def refuse_drain(plan: Any) -> None:
    """Raise for a pipeline a drain cannot end: in real-time mode (no micro-batch to log its end
    as), or with operators (an operator learns the end of its input from a bounded source's
    flush row, which a drain cannot give)."""
    from headrace.spark.real_time import REAL_TIME

    if plan.trigger == REAL_TIME:
        raise PlanError(f"pipeline {plan.name!r} runs in real-time mode, which has no micro-batch a drain could "
                        "end it with; stop it instead")
    if has_operators(plan):
        raise PlanError(f"pipeline {plan.name!r} runs operators, which learn that their input ended only from a "
                        "bounded source, not from a drain; stop it instead, or run it on bounded sources")


def refuse_backfill(plan: Any, drain: bool) -> None:
    """Raise for a pipeline a backfill cannot run: in real-time mode (Spark's availableNow
    runs micro-batches), or a backfill asked together with a drain."""
    from headrace.spark.real_time import REAL_TIME

    if drain:
        raise PlanError(f"pipeline {plan.name!r}: a backfill goes on live after the history, a drain ends the "
                        "pipeline for good; ask for one of them")
    if plan.trigger == REAL_TIME:
        raise PlanError(f"pipeline {plan.name!r} runs in real-time mode, which reads no history in bounded "
                        "micro-batches; run it without --backfill")


def _batch_id(progress: dict[str, Any] | None) -> int | None:
    return None if progress is None else int(progress["batchId"])


def _started_at(progress: dict[str, Any]) -> float:
    """When Spark started the micro-batch of a progress report, in seconds since the epoch."""
    stamp = progress["timestamp"].replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


class RunDeferred(BaseException):
    """Raised by a new run while the ``headrace`` command loads a file (``deferring_runs``): the
    file stops at its ``p.run()`` (``hr.run``, ``run_to_completion``...) and the command runs
    ``pipeline`` (or, for ``explain``, does not)."""

    def __init__(self, pipeline: Any) -> None:
        super().__init__(f"the run of pipeline {getattr(pipeline, 'name', pipeline)!r} is deferred")
        self.pipeline = pipeline


_deferring = contextvars.ContextVar("headrace_deferring_runs", default=False)


@contextlib.contextmanager
def deferring_runs() -> Iterator[None]:
    """While this is open, a run starts nothing: :class:`PipelineRun` raises :class:`RunDeferred`."""
    token = _deferring.set(True)
    try:
        yield
    finally:
        _deferring.reset(token)


def run(pipeline: Any, *, state_dir: str | None = None, master: str | None = None, progress: str = "line",
        fresh: bool = False, until_exhausted: bool | None = None, max_seconds: float | None = None,
        trigger_interval: str | None = None, handle_signals: bool = True, restart_attempts: int | None = None,
        restart_window: Any = None, restart_backoff: Any = None, drain: bool = False,
        backfill: bool = False) -> RunResult:
    """Run ``pipeline`` until its bounded input is exhausted, Ctrl-C / SIGTERM, or ``max_seconds``.

    Restarting with the same ``state_dir`` continues from the checkpoint exactly where the
    previous run stopped; ``fresh=True`` forgets it. A query that fails in a way worth
    restarting is started again from its checkpoint: up to ``restart_attempts`` times within
    ``restart_window``, after ``restart_backoff`` doubled at each restart (defaults: the
    ``HEADRACE_RESTART_*`` settings). With ``handle_signals``, the first Ctrl-C or SIGTERM
    stops at a batch boundary and a second stops at once (KeyboardInterrupt). ``drain`` ends an
    unbounded pipeline for good: it reads what the sources hold now, fires every open window and
    event-time timer, and marks the checkpoint drained (docs/runtime.md, "Draining a pipeline").
    ``backfill`` first reads what the sources hold now in bounded micro-batches, as fast as Spark
    can, then goes on live on the same checkpoint (docs/backfill.md).
    """
    runner = PipelineRun(pipeline, state_dir=state_dir, master=master, progress=progress, fresh=fresh,
                         trigger_interval=trigger_interval, restart_attempts=restart_attempts,
                         restart_window=restart_window, restart_backoff=restart_backoff, drain=drain,
                         backfill=backfill)
    with stop_on_signals(handle_signals) as signals:
        if handle_signals and signals.installed:
            signals.attach(runner)
        try:
            runner.start()
            if runner.draining:
                return runner.wait_drained()
            return runner.wait(until_exhausted=until_exhausted, max_seconds=max_seconds)
        finally:
            signals.detach(runner)
