"""The PostgreSQL sink's staging: Spark's executors load a batch's rows into a staging table.

A batch's rows never pass through the driver. Each Spark task of the batch (``mapInArrow``)
opens its own connection and, in one transaction, deletes whatever an earlier attempt of
the same partition left in the staging table and ``COPY``\\ s its rows in, numbered by
partition and position (``_hr_part``, ``_hr_ord``), so a task Spark runs again (a lost
executor, a failed attempt) replaces its rows instead of adding to them. The driver then
moves the staged rows into the target in the transaction that records the batch id, and
drops the staging table there (``headrace/connectors/postgres.py``).

The staging table ``_hr_stage_<sink hash>_<batch id>`` is an ordinary UNLOGGED table (the
executors' connections must see it; it needs no WAL: a server crash empties it, and the
replayed batch stages its rows again). One left by a driver killed before its commit is
dropped when the sink starts (``drop_leftovers``) or when the batch is staged again.
A partition's rows are held in the task's memory while they are loaded, so a failed load
can be tried again (``retries`` of the sink).
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

PART_COLUMN, ORDER_COLUMN = "_hr_part", "_hr_ord"
STAGE_PREFIX = "_hr_stage_"
COPY_CHUNK_ROWS = 65_536


def stage_name(sink: str, batch_id: int) -> str:
    """The staging table of a sink's batch: short enough for PostgreSQL's 63-byte names.

    >>> stage_name("out/clicks@3274e357", 12)
    '_hr_stage_5bd4cd09deb5_12'
    """
    return f"{STAGE_PREFIX}{_sink_hash(sink)}_{batch_id}"


def _sink_hash(sink: str) -> str:
    return hashlib.sha1(sink.encode()).hexdigest()[:12]


def drop_leftovers(conn: Any, sink: str) -> int:
    """Drop the staging tables a killed driver of ``sink`` left behind; how many there were."""
    from psycopg import sql

    names = [row[0] for row in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() AND tablename LIKE %s",
        (f"{STAGE_PREFIX}{_sink_hash(sink)}\\_%",))]
    for name in names:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
    return len(names)


@dataclass(frozen=True)
class Stage:
    """The staging table of one batch: its name, the stream's columns and their PostgreSQL types."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]

    def create(self, conn: Any) -> None:
        """(Re)create the table empty: rows an earlier attempt of the batch staged are dropped."""
        from psycopg import sql

        definitions: list[Any] = [sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(t))
                                  for c, t in zip(self.columns, self.types)]
        definitions += [sql.SQL(f"{PART_COLUMN} integer NOT NULL"), sql.SQL(f"{ORDER_COLUMN} bigint NOT NULL")]
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(self.name)))
        conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(sql.Identifier(self.name),
                                                                     sql.SQL(", ").join(definitions)))

    def load_partition(self, conn: Any, partition: int, batches: list[Any], csv_ready: Callable[[Any], Any]) -> int:
        """In one transaction: replace the rows of ``partition`` with ``batches`` (Arrow); the rows loaded."""
        import pyarrow as pa
        import pyarrow.csv as pa_csv
        from psycopg import sql

        table = sql.Identifier(self.name)
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in (*self.columns, PART_COLUMN, ORDER_COLUMN))
        options = pa_csv.WriteOptions(include_header=False)
        loaded = 0
        with conn.transaction():
            # One loader per partition at a time (a speculative or retried task waits for the other).
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s), %s)", (self.name, partition))
            conn.execute(sql.SQL("DELETE FROM {} WHERE {} = %s").format(table, sql.Identifier(PART_COLUMN)),
                         (partition,))
            with conn.cursor() as cursor, cursor.copy(sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)")
                                                      .format(table, columns)) as copy_in:
                for batch in batches:
                    rows = csv_ready(pa.Table.from_batches([batch]))
                    rows = rows.append_column(PART_COLUMN, pa.array([partition] * rows.num_rows, pa.int32()))
                    rows = rows.append_column(ORDER_COLUMN, pa.array(range(loaded, loaded + rows.num_rows), pa.int64()))
                    for chunk in rows.to_batches(max_chunksize=COPY_CHUNK_ROWS):
                        buffer = io.BytesIO()
                        pa_csv.write_csv(chunk, buffer, options)
                        copy_in.write(buffer.getbuffer())
                    loaded += rows.num_rows
        return loaded


def load(df: Any, stage: Stage, load_one: Callable[[int, list[Any]], int]) -> int:
    """Run the batch ``df`` on Spark's executors, each task loading its partition with
    ``load_one(partition, arrow batches)``; the rows loaded in all. Reads every row, so the
    batch's stateful operators commit."""
    def load_partitions(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        rows = load_one(partition, [b for b in batches if b.num_rows])
        yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))

    return sum(row["rows"] for row in df.mapInArrow(load_partitions, "rows long").collect())
