"""What the server knows of each pipeline, kept in SQLite (``<state dir>/server.sqlite``) so that
a restarted server finds the pipelines it started, and their driver processes, again; and
``Refused``, a request the server turns down."""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

# A pipeline's status: what its driver is doing, as the supervisor last saw it.
STARTING, RUNNING, RESTARTING, STOPPING, STOPPED, PAUSED, FINISHED, FAILED, RESCALING, DRAINING = (
    "starting", "running", "restarting", "stopping", "stopped", "paused", "finished", "failed", "rescaling",
    "draining")
LIVE = (STARTING, RUNNING, RESTARTING, STOPPING, DRAINING)  # a driver runs, or is to run again if it ends


class Refused(Exception):
    """A request the server turns down: ``status`` is the HTTP status, the message one line."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def exception_key(message: str) -> str:
    """What makes two errors the same: the message without the record it names.

    >>> exception_key("step 'parse' (app.py:9) raised ValueError: bad amount (record: {'id': 7})")
    "step 'parse' (app.py:9) raised ValueError: bad amount"
    """
    return message.split(" (record: ", 1)[0]


@dataclass
class Entry:
    name: str
    file: str  # the pipeline's file, absolute
    state_dir: str  # the pipeline's own state dir (its checkpoint, its lease, its driver's log)
    status: str
    wanted: bool  # whether the pipeline should run: a driver that ends unasked is restarted
    pid: int = 0  # the driver's process, the leader of its process group (0: none)
    restarts: int = 0
    last_exit: int | None = None  # the last driver's exit status (None: killed, or none ended yet)
    reason: str = ""  # why the status is what it is, for the user
    submitted_at: float = 0.0
    updated_at: float = 0.0

    def public(self) -> dict[str, Any]:
        return asdict(self)


class Registry:
    """The pipelines, by name. Safe to use from the server's threads."""

    def __init__(self, path: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("""CREATE TABLE IF NOT EXISTS pipelines (
            name TEXT PRIMARY KEY, file TEXT NOT NULL, state_dir TEXT NOT NULL, status TEXT NOT NULL,
            wanted INTEGER NOT NULL, pid INTEGER NOT NULL, restarts INTEGER NOT NULL, last_exit INTEGER,
            reason TEXT NOT NULL, submitted_at REAL NOT NULL, updated_at REAL NOT NULL)""")
        self._db.execute("""CREATE TABLE IF NOT EXISTS exceptions (
            pipeline TEXT NOT NULL, key TEXT NOT NULL, message TEXT NOT NULL, count INTEGER NOT NULL,
            first_at REAL NOT NULL, last_at REAL NOT NULL, PRIMARY KEY (pipeline, key))""")

    def put(self, entry: Entry) -> Entry:
        entry.updated_at = time.time()
        values = asdict(entry)
        values["wanted"] = int(entry.wanted)
        with self._lock:
            self._db.execute(f"INSERT OR REPLACE INTO pipelines ({', '.join(values)}) "
                             f"VALUES ({', '.join('?' * len(values))})", tuple(values.values()))
        return entry

    def get(self, name: str) -> Entry | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM pipelines WHERE name = ?", (name,)).fetchone()
        return self._entry(row) if row else None

    def all(self) -> list[Entry]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM pipelines ORDER BY name").fetchall()
        return [self._entry(row) for row in rows]

    def remove(self, name: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM pipelines WHERE name = ?", (name,))
            self._db.execute("DELETE FROM exceptions WHERE pipeline = ?", (name,))

    def add_exception(self, pipeline: str, message: str, at: float) -> None:
        """Count ``message`` (a driver's error) once more: the same error (up to the record it names)
        is one entry, with its count, its first and last time and its last full message."""
        with self._lock:
            self._db.execute("INSERT INTO exceptions VALUES (?, ?, ?, 1, ?, ?) ON CONFLICT (pipeline, key) DO UPDATE "
                             "SET count = count + 1, message = excluded.message, last_at = excluded.last_at",
                             (pipeline, exception_key(message), message, at, at))

    def exception_count(self, pipeline: str) -> int:
        """How many errors the pipeline's drivers ended with, each occurrence counted."""
        with self._lock:
            (count,) = self._db.execute("SELECT COALESCE(SUM(count), 0) FROM exceptions WHERE pipeline = ?",
                                        (pipeline,)).fetchone()
        return int(count)

    def exceptions(self, pipeline: str) -> list[dict[str, Any]]:
        """The pipeline's errors, the latest first."""
        with self._lock:
            rows = self._db.execute("SELECT message, count, first_at, last_at FROM exceptions WHERE pipeline = ? "
                                    "ORDER BY last_at DESC", (pipeline,)).fetchall()
        return [{"message": message, "count": count, "first_at": first, "last_at": last}
                for message, count, first, last in rows]

    @staticmethod
    def _entry(row: tuple[Any, ...]) -> Entry:
        entry = Entry(*row)
        entry.wanted = bool(entry.wanted)
        return entry
