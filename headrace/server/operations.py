"""Long operations on pipelines (submit, stop, pause, resume, restart, upgrade): each request that
is accepted gets an operation id at once, and the operation is done when what it asked for has
happened, as the supervisor sees it:

* stop: the pipeline is stopped; pause: it is paused; drain (a stop with drain): it is finished;
* submit, resume, restart, upgrade: a driver started for it has started its query (Spark took
  its plan and checkpoint) or committed a micro-batch, as its progress file reports after the
  request, or its input ended.

One that ends otherwise (the pipeline failed, or was stopped meanwhile) has failed, saying why.
Kept in the server's SQLite file beside the registry, so a restarted server still answers for them.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from headrace.server.registry import FAILED, FINISHED, PAUSED, STOPPED, Entry

RUNNING, DONE, FAILED_OPERATION = "running", "done", "failed"
AWAITED = {"stop": STOPPED, "pause": PAUSED, "drain": FINISHED}  # the status that ends these; the others await a batch


@dataclass
class Operation:
    id: str
    pipeline: str
    action: str
    status: str  # running, done or failed
    detail: str
    started_at: float
    ended_at: float | None = None

    def public(self) -> dict[str, Any]:
        return asdict(self)


class Operations:
    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("""CREATE TABLE IF NOT EXISTS operations (
            id TEXT PRIMARY KEY, pipeline TEXT NOT NULL, action TEXT NOT NULL, status TEXT NOT NULL,
            detail TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL)""")

    def begin(self, pipeline: str, action: str, asked_at: float) -> Operation:
        """An operation the supervisor accepted at ``asked_at`` (before it acted on it)."""
        operation = Operation(uuid.uuid4().hex[:12], pipeline, action, RUNNING, _awaiting(action), asked_at)
        self._put(operation)
        return operation

    def get(self, operation_id: str) -> Operation | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM operations WHERE id = ?", (operation_id,)).fetchone()
        return Operation(*row) if row else None

    def settle(self, entry: Entry, last_report_at: Callable[[], float | None]) -> None:
        """End the pipeline's running operations that what the supervisor sees now ends;
        ``last_report_at`` (read only when one is running): when a driver's query last started (a
        micro-batch of the driver that ran before the request does not end it)."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM operations WHERE pipeline = ? AND status = ?",
                                    (entry.name, RUNNING)).fetchall()
        reported = last_report_at() if rows else None
        for operation in map(lambda row: Operation(*row), rows):
            outcome = _outcome(operation, entry, reported)
            if outcome is not None:
                operation.status, operation.detail = outcome
                operation.ended_at = time.time()
                self._put(operation)

    def _put(self, operation: Operation) -> None:
        values = asdict(operation)
        with self._lock:
            self._db.execute(f"INSERT OR REPLACE INTO operations ({', '.join(values)}) "
                             f"VALUES ({', '.join('?' * len(values))})", tuple(values.values()))


def _awaiting(action: str) -> str:
    return f"until it is {AWAITED[action]}" if action in AWAITED else "until a new driver has started its query"


def _outcome(operation: Operation, entry: Entry, last_report_at: float | None) -> tuple[str, str] | None:
    """(status, detail) once ``operation`` has ended, else None."""
    if entry.status == FAILED:
        return FAILED_OPERATION, f"the pipeline failed: {entry.reason}"
    awaited = AWAITED.get(operation.action)
    if awaited is not None:
        if entry.status == awaited:
            return DONE, f"{entry.name} is {awaited}"
        if entry.status in (STOPPED, PAUSED, FINISHED) and not entry.wanted:
            return FAILED_OPERATION, f"the pipeline was {entry.status} first"
        return None
    if last_report_at is not None and last_report_at >= operation.started_at:
        return DONE, f"{entry.name}'s driver is under way"
    if entry.status == FINISHED:
        return DONE, f"{entry.name} finished: its input ended"
    if entry.status in (STOPPED, PAUSED) and not entry.wanted:
        return FAILED_OPERATION, f"the pipeline was {entry.status} before its driver was under way"
    return None
