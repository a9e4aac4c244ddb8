"""PostgreSQL change data capture's Spark data source (``headrace_postgres_changes``): batches of WAL
positions, each peeked from the replication slot and decoded (how it works:
``headrace/connectors/postgres_cdc.py``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from headrace.connectors.file_formats.values import BadValue, iso_us
from headrace.connectors.postgres import DEFAULT_DSN
from headrace.connectors.postgres_cdc import (
    BATCH_ROWS,
    IDLE_ADVANCE_BYTES,
    METADATA,
    NO_TABLES,
    OPS,
    PROBE_ROWS,
    SLOT_BUSY_WAIT_S,
    ChangeDecoder,
    default_slot,
    ensure_slot,
    lsn_int,
    lsn_text,
    postgres_connect,
    postgres_peek,
    psycopg_module,
    slot_error,
    slot_position,
)
from headrace.connectors.spark_readers import broker as spark_broker
from headrace.errors import SourceError

# ----------------------------------------------------------------------------------------
# Spark Python data source.

class ChangesReader(spark_broker.Reader, default_name="changes"):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.tables: list[str] = json.loads(options.get("tables", "[]"))
        self.dsn = options.get("dsn", DEFAULT_DSN)
        self.slot = options.get("slot") or default_slot(self.source)
        self.where = f"source {self.source!r}"
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None or self._conn.closed:
            self._conn = postgres_connect(self.dsn, self.where)
        return self._conn

    def initialOffset(self) -> dict:
        return {"lsn": ensure_slot(self._connection(), self.where, self.dsn, self.slot)}

    def end_offset(self, start: dict, cap: int | None) -> dict:
        after = lsn_int(start["lsn"])
        end = self._plan_by_position(after) if cap is None else self._plan(after, cap)
        return start if end is None else {"lsn": lsn_text(end)}

    def _plan_by_position(self, after: int) -> int | None:
        """Without a record cap, the next batch reads every transaction committed so far: its end is
        the last commit position the slot has, found by a peek whose output holds only the
        transactions' begin and commit rows (no table's changes), about 8 times cheaper than one
        with the changes; so the changes are decoded once, by the batch. A short peek first checks
        that a change of the chosen tables is pending."""
        psycopg = psycopg_module()
        try:
            probe = postgres_peek(self._connection(), self.slot, "lsn::text, substr(data, 12, 1)", None, PROBE_ROWS,
                          self.tables)
            pending = _change_pending(probe, after) or len(probe) >= PROBE_ROWS
            commits = postgres_peek(self._connection(), self.slot, "lsn::text", None, None, NO_TABLES)
        except psycopg.Error as exc:
            raise slot_error(self.where, self.slot, self.dsn, "cannot read", exc) from None
        last = max((lsn_int(lsn) for (lsn,) in commits), default=after)
        if last <= after:
            return None
        return last if pending or last - after >= IDLE_ADVANCE_BYTES else None  # pass other tables' WAL at times

    def _plan(self, after: int, budget: int | None) -> int | None:
        """The commit position up to which the next batch reads (at most ``budget`` changes, whole
        transactions), or None when there is nothing to read: walks the slot's pending commits."""
        psycopg = psycopg_module()
        cap = None if budget is None else 3 * budget + 1000  # output rows: changes plus begin and commit rows
        while True:
            try:
                rows = postgres_peek(self._connection(), self.slot, "lsn::text, substr(data, 12, 1)", None, cap,
                             self.tables)
            except psycopg.Error as exc:
                raise slot_error(self.where, self.slot, self.dsn, "cannot read", exc) from None
            count = pending = 0
            end = last = None
            for lsn, action in rows:
                if action in OPS:
                    pending += 1
                elif action == "C":
                    position = lsn_int(lsn)
                    if position <= after:
                        pending = 0
                        continue
                    if budget is not None and count and count + pending > budget:
                        return end
                    count += pending
                    pending = 0
                    last = position
                    if count:
                        end = position
                    if budget is not None and count >= budget:
                        return end
            if cap is None or len(rows) < cap:
                if end is None and last is not None and last - after >= IDLE_ADVANCE_BYTES:
                    return last  # an empty batch that lets the slot pass WAL of other tables
                return end
            cap *= 4

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        if lsn_int(end["lsn"]) <= lsn_int(start["lsn"]):
            return []
        return [spark_broker.PositionRange(start["lsn"], end["lsn"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, spark_broker.PositionRange)
        psycopg = psycopg_module()
        after, upto = lsn_int(partition.after), lsn_int(partition.upto)
        conn = postgres_connect(self.dsn, self.where, autocommit=False)
        decoder = ChangeDecoder(self.schema)
        try:
            self._check_slot(conn, after)
            taken: list[tuple[str, str]] = []  # the current transaction's changes: (data, lsn)
            xid: int | None = None
            commit_us: int | None = None
            with conn.cursor(name="hr_changes") as cursor:
                cursor.itersize = BATCH_ROWS
                try:
                    postgres_peek(conn, self.slot, "lsn::text, data", partition.upto, None, self.tables, cursor)
                    for lsn, data in cursor:
                        head = data[11:12]
                        if head == "B":
                            taken, xid, commit_us = [], None, None
                            try:
                                begin = json.loads(data)
                                xid, commit_us = begin.get("xid"), iso_us(begin["timestamp"])
                            except (ValueError, KeyError, BadValue):
                                pass  # each change carries them too
                        elif head == "C":
                            position = lsn_int(lsn)
                            if after < position <= upto:
                                for raw, change_lsn in taken:
                                    decoder.add(raw, change_lsn, lsn, commit_us, xid)
                                if len(decoder) >= BATCH_ROWS:
                                    yield from decoder.batches()
                            taken = []
                        elif head != "M":  # a logical message: not captured
                            taken.append((data, lsn))
                except psycopg.Error as exc:
                    raise slot_error(self.where, self.slot, self.dsn, "cannot read", exc) from None
            yield from decoder.batches()
        finally:
            conn.close()

    def _check_slot(self, conn: Any, after: int) -> None:
        """A batch starting at ``after`` finds the slot there or before it, or its changes are gone."""
        found = slot_position(conn, self.slot)
        conn.rollback()
        if found is None:
            raise SourceError(f"{self.where}: the replication slot {self.slot!r} is gone (dropped?), and with it "
                              "the changes this pipeline had not read yet; start the pipeline afresh (fresh=True) "
                              "to read from a new slot")
        if lsn_int(found[2]) > after:
            raise SourceError(f"{self.where}: the replication slot {self.slot!r} was advanced to {found[2]}, past "
                              f"this batch's start {lsn_text(after)}, by something other than this pipeline (does "
                              "another pipeline read the same slot? give each its own slot=): the changes in "
                              "between are gone; start this pipeline afresh (fresh=True)")

    def commit(self, end: dict) -> None:
        """Spark committed the batches up to ``end``: let the slot pass them."""
        psycopg = psycopg_module()
        try:
            conn = self._connection()
            found = slot_position(conn, self.slot)
            if found is not None and lsn_int(found[2]) < lsn_int(end["lsn"]):
                _advance(conn, self.slot, end["lsn"])
        except psycopg.Error as exc:
            raise slot_error(self.where, self.slot, self.dsn, "cannot advance", exc) from None

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()


def _change_pending(rows: Sequence[tuple[str, str]], after: int) -> bool:
    """Whether peeked ``(lsn, action)`` rows hold a change that commits after ``after``."""
    pending = False
    for lsn, action in rows:
        if action in OPS:
            pending = True
        elif action == "C":
            if pending and lsn_int(lsn) > after:
                return True
            pending = False
    return False


def _advance(conn: Any, slot: str, lsn: str) -> None:
    psycopg = psycopg_module()
    deadline = time.monotonic() + SLOT_BUSY_WAIT_S
    while True:
        try:
            conn.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (slot, lsn))
            return
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class PostgresChangesDataSource(spark_broker.DataSource, short_name="headrace_postgres_changes", reader=ChangesReader,
                                metadata=METADATA):
    """Spark data source ``headrace_postgres_changes``; options as produced by ``PostgresChanges.options()``."""
