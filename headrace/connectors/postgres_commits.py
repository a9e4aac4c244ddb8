"""The PostgreSQL sink's commit table: which batches each sink identity committed, to which table.

``headrace_sink_commits(sink, batch_id, committed_at, row_count, target)`` holds one record
per committed batch, written in the transaction that writes the batch's rows, so a record
exists exactly when its rows were committed. ``row_count`` and ``target`` (the table as the
sink names it) came later: records written before them hold nulls, read as "rows, into
this table" so that nothing they stand for is taken as lost without a word.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

COMMIT_TABLE = "headrace_sink_commits"
ADDED_COLUMNS = (("row_count", "bigint"), ("target", "text"))
_THIS_TARGET = "sink = %s AND (target = %s OR target IS NULL)"


def ensure_table(conn: Any, unique_violation: type[Exception]) -> None:
    """Create the commit table, or add the columns an older one lacks."""
    try:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {COMMIT_TABLE} ("
            "sink text NOT NULL, batch_id bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), "
            "row_count bigint, target text, PRIMARY KEY (sink, batch_id))")
    except unique_violation:
        pass  # another sink created it at the same moment
    present = {row[0] for row in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
        (COMMIT_TABLE,))}
    for column, kind in ADDED_COLUMNS:
        if column not in present:
            conn.execute(f"ALTER TABLE {COMMIT_TABLE} ADD COLUMN IF NOT EXISTS {column} {kind}")


def claim(conn: Any, sink: str, batch_id: int, rows: int, target: str) -> bool:
    """Record ``batch_id`` as committed, in the caller's transaction; False when it already is
    (a replay, or an earlier attempt whose commit went through although its answer was lost)."""
    return conn.execute(
        f"INSERT INTO {COMMIT_TABLE} (sink, batch_id, row_count, target) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING RETURNING batch_id", (sink, batch_id, rows, target)).fetchone() is not None


def is_recorded(conn: Any, sink: str, batch_id: int) -> bool:
    return conn.execute(f"SELECT 1 FROM {COMMIT_TABLE} WHERE sink = %s AND batch_id = %s",
                        (sink, batch_id)).fetchone() is not None


def has_rows(conn: Any, sink: str, target: str, besides: int | None) -> bool:
    """Whether ``sink`` committed rows into ``target`` in a batch other than ``besides``."""
    return bool(conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM {COMMIT_TABLE} WHERE {_THIS_TARGET} AND batch_id <> %s "
        "AND (row_count IS NULL OR row_count > 0))", (sink, target, -1 if besides is None else besides)
    ).fetchone()[0])


@dataclass(frozen=True)
class Committed:
    """What a sink's records say it committed into a table.

    >>> str(Committed(batches=3, rows=1500, uncounted=0, first=0, last=2))
    'batches 0-2 (3 batches, 1,500 rows)'
    >>> str(Committed(batches=2, rows=10, uncounted=1, first=4, last=7))
    'batches 4-7 (2 batches, 10 rows and the rows of 1 batch recorded without a count)'
    """

    batches: int
    rows: int
    uncounted: int
    first: int | None
    last: int | None

    def __str__(self) -> str:
        rows = f"{self.rows:,} rows"
        if self.uncounted:
            plural = "es" if self.uncounted > 1 else ""
            rows += f" and the rows of {self.uncounted} batch{plural} recorded without a count"
        span = f"batch {self.first}" if self.first == self.last else f"batches {self.first}-{self.last}"
        return f"{span} ({self.batches} batch{'es' if self.batches != 1 else ''}, {rows})"


def committed(conn: Any, sink: str, target: str, besides: int | None) -> Committed:
    """What ``sink`` committed into ``target``, leaving out batch ``besides`` (one being written)."""
    row = conn.execute(
        f"SELECT count(*), coalesce(sum(row_count), 0), count(*) FILTER (WHERE row_count IS NULL), "
        f"min(batch_id), max(batch_id) FROM {COMMIT_TABLE} WHERE {_THIS_TARGET} AND batch_id <> %s",
        (sink, target, -1 if besides is None else besides)).fetchone()
    return Committed(int(row[0]), int(row[1]), int(row[2]), row[3], row[4])


def forget(conn: Any, sink: str, target: str, besides: int | None) -> None:
    """Delete ``sink``'s records of batches committed into ``target`` (but ``besides``): their rows are gone."""
    conn.execute(f"DELETE FROM {COMMIT_TABLE} WHERE {_THIS_TARGET} AND batch_id <> %s",
                 (sink, target, -1 if besides is None else besides))
