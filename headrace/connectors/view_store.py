"""The serving store of queryable views: one SQLite file per run of a pipeline
(``<run dir>/views.sqlite``), written by the ``View`` sink (``headrace/connectors/view_sink.py``)
and read by the server (``headrace/server/views.py``).

A view keeps the last row of each key. Each micro-batch changes its view in one transaction
that also records the batch id and the watermark the batch ran with, so a replayed batch
(its id recorded already) changes nothing and a reader sees a whole batch or none of it.

Tables: ``views`` (a row per view: its key columns, last batch id, watermark) and ``rows``
(a row per view and key: the key's text, the row as a JSON object, the batch that last
changed it). A key's text is its columns' values as text, joined by ``|``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

STORE_FILE = "views.sqlite"
KEY_SEPARATOR = "|"
Row = tuple[str, dict[str, Any]]  # a key's text and its row
BUSY_TIMEOUT_S = 30.0  # how long a writer waits for another writer's transaction
_SCHEMA = """
CREATE TABLE IF NOT EXISTS views (view TEXT PRIMARY KEY, key_columns TEXT NOT NULL, batch_id INTEGER NOT NULL,
                                  watermark_ms INTEGER, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rows (view TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
                                 batch_id INTEGER NOT NULL, PRIMARY KEY (view, key));
CREATE INDEX IF NOT EXISTS rows_by_batch ON rows (view, batch_id);
"""


def store_path(run_dir: str) -> str:
    return os.path.join(run_dir, STORE_FILE)


@dataclass(frozen=True)
class AsOf:
    """Where a view stands: the last batch applied to it and the watermark that batch ran with
    (epoch milliseconds; None before the first batch with event time)."""

    view: str
    key_columns: tuple[str, ...]
    batch_id: int
    watermark_ms: int | None

    def public(self) -> dict[str, Any]:
        return {"view": self.view, "key_columns": list(self.key_columns), "batch_id": self.batch_id,
                "watermark_ms": self.watermark_ms}


class ViewWriter:
    """The writing side, used by the View sink on the driver."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def last_batch(self, view: str) -> int | None:
        row = self._db.execute("SELECT batch_id FROM views WHERE view = ?", (view,)).fetchone()
        return None if row is None else int(row[0])

    def apply(self, view: str, key_columns: tuple[str, ...], batch_id: int, watermark_ms: int | None,
              rows: Iterable[tuple[str, str]]) -> bool:
        """Apply a batch's ``(key, value)`` rows, in order (a key's last row wins), with the batch
        id and watermark, in one transaction; False (and nothing changed) when the view holds
        this batch already."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            last = self.last_batch(view)
            if last is not None and last >= batch_id:
                db.execute("ROLLBACK")
                return False
            db.executemany("INSERT INTO rows (view, key, value, batch_id) VALUES (?, ?, ?, ?) ON CONFLICT (view, key) "
                           "DO UPDATE SET value = excluded.value, batch_id = excluded.batch_id",
                           ((view, key, value, batch_id) for key, value in rows))
            db.execute("INSERT INTO views (view, key_columns, batch_id, watermark_ms, updated_at) VALUES "
                       "(?, ?, ?, ?, ?) ON CONFLICT (view) DO UPDATE SET batch_id = excluded.batch_id, "
                       "watermark_ms = excluded.watermark_ms, updated_at = excluded.updated_at",
                       (view, json.dumps(list(key_columns)), batch_id, watermark_ms, time.time()))
            db.execute("COMMIT")
            return True
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self._db.close()


class ViewReader:
    """The reading side: lookups, prefix scans and changes, each answer with the batch it is as of.
    Opened read-only; a reader never blocks the writer (SQLite's write-ahead log)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def exists(self) -> bool:
        return os.path.exists(self.path)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)

    def views(self) -> list[AsOf]:
        if not self.exists():
            return []
        with self._connect() as db:
            found = db.execute("SELECT view, key_columns, batch_id, watermark_ms FROM views ORDER BY view").fetchall()
        return [_as_of(row) for row in found]

    def as_of(self, view: str) -> AsOf | None:
        return next((found for found in self.views() if found.view == view), None)

    def lookup(self, view: str, key: str) -> tuple[AsOf, dict[str, Any] | None]:
        """The view's row of ``key`` (None when it has none) and the batch it is as of, read in one
        transaction."""
        with self._connect() as db:
            db.execute("BEGIN")
            as_of = _as_of_in(db, view)
            row = db.execute("SELECT value FROM rows WHERE view = ? AND key = ?", (view, key)).fetchone()
        return as_of, (json.loads(row[0]) if row else None)

    def scan(self, view: str, prefix: str, after: str | None, limit: int) -> tuple[AsOf, list[Row]]:
        """Up to ``limit`` rows whose key starts with ``prefix`` and sorts after ``after`` (None:
        from the first), by key."""
        with self._connect() as db:
            db.execute("BEGIN")
            as_of = _as_of_in(db, view)
            found = db.execute("SELECT key, value FROM rows WHERE view = ? AND key >= ? AND substr(key, 1, ?) = ? "
                               "AND (? IS NULL OR key > ?) ORDER BY key LIMIT ?",
                               (view, prefix, len(prefix), prefix, after, after, limit)).fetchall()
        return as_of, [(key, json.loads(value)) for key, value in found]

    def changed_since(self, view: str, after_batch: int) -> tuple[AsOf, list[Row]]:
        """The rows a batch after ``after_batch`` changed, as they are now, by key."""
        with self._connect() as db:
            db.execute("BEGIN")
            as_of = _as_of_in(db, view)
            found = db.execute("SELECT key, value FROM rows WHERE view = ? AND batch_id > ? ORDER BY key",
                               (view, after_batch)).fetchall()
        return as_of, [(key, json.loads(value)) for key, value in found]


def _as_of_in(db: sqlite3.Connection, view: str) -> AsOf:
    row = db.execute("SELECT view, key_columns, batch_id, watermark_ms FROM views WHERE view = ?",
                     (view,)).fetchone()
    if row is None:
        raise KeyError(view)
    return _as_of(row)


def _as_of(row: tuple[Any, ...]) -> AsOf:
    view, key_columns, batch_id, watermark_ms = row
    return AsOf(view, tuple(json.loads(key_columns)), int(batch_id), watermark_ms)
