"""PostgreSQL change data capture: the inserts, updates and deletes of chosen tables, read from a
logical replication slot (output plugin wal2json) with ``pg_logical_slot_peek_changes``.

**Offsets.** ``{"lsn": "0/16B3748"}``: a commit position, the LSN where a transaction's commit
record ends (what PostgreSQL reports for the commit and takes in ``pg_replication_slot_advance``).
Spark logs the end offset before the batch runs; the batch reads the changes of the transactions
whose commit position lies in (start, end], peeking at the slot up to ``end`` (nothing is
consumed), so a replayed batch reads exactly the same changes, in commit order. The slot advances
to a batch's end only in ``commit``, which Spark calls once it has committed the batch: until then
the server keeps the WAL, and after a crash the changes are there to read again. Exactly-once while
the slot lives.

**The slot.** Created by the source when missing (before the query starts), at the server's
current position: a new pipeline reads the changes committed after that point, and a pipeline
restarted from its checkpoint goes on from there. Its name is ``slot=``, else ``headrace_<source
name>``: two pipelines on one database need slots of their own. A slot keeps the WAL it has not
passed, so drop it when the pipeline is retired: :func:`drop_slot`, or
``SELECT pg_drop_replication_slot('<slot>')``. The server needs ``wal_level=logical`` and the
wal2json plugin (``scripts/postgres_logical.sh`` sets both up on the local cluster).

**Records.** One row per change: ``op`` (insert, update, delete), ``table`` (``schema.table``),
``before`` and ``after`` (JSON objects, column name to value, as text), ``lsn`` (the change's own
LSN), ``commit_lsn`` (its transaction's commit position, the offset), ``commit_time`` (a timestamp,
fit for event time) and ``xid``. ``after`` is null on deletes. ``before`` is the old row as the
table's REPLICA IDENTITY gives it: its key columns by default (on updates and deletes), the whole
old row with ``REPLICA IDENTITY FULL``; null on inserts. With ``schema=`` the row also has those
columns, typed, taken from ``after`` (from ``before`` on deletes). A change that cannot be decoded
or typed goes to the dead letters, its LSN as position. Truncates and logical messages are not
captured; a table without a primary key needs ``REPLICA IDENTITY FULL`` (or an index), else its
updates and deletes could not be told apart and the source refuses it.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from headrace.connectors import broker, postgres
from headrace.connectors.base import redact_dsn
from headrace.connectors.file_formats.jsonl import JSON_CONVERTERS
from headrace.connectors.file_formats.reader import batch_schema
from headrace.connectors.file_formats.values import BadValue, convert_values, iso_us
from headrace.connectors.payloads import data_batch, dead_letter_batch
from headrace.connectors.postgres import DEFAULT_DSN, one_line
from headrace.contract import SourceContext
from headrace.errors import PlanError, SourceError
from headrace.schema import Schema, arrow_type, schema_of, to_ddl

PLUGIN = "wal2json"
METADATA: Schema = (("op", "string"), ("table", "string"), ("before", "string"), ("after", "string"),
                    ("lsn", "string"), ("commit_lsn", "string"), ("commit_time", "timestamp"), ("xid", "long"))
OPS = {"I": "insert", "U": "update", "D": "delete"}
PROBE_ROWS = 64  # output rows a plan without a record cap peeks at, to see whether a change is pending
NO_TABLES = ("pg_catalog.headrace_no_such_table",)  # a filter that leaves only transactions' begin and commit rows
BATCH_ROWS = 10_000  # rows per Arrow batch, and per fetch of the server-side cursor
IDLE_ADVANCE_BYTES = 64 << 20  # WAL passed without a change of the chosen tables before an empty batch moves on
SLOT_BUSY_WAIT_S = 60  # a killed driver's server process may hold the slot for a moment
CONNECT_TIMEOUT_S = 10
_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")
_BAD_TABLE_CHARS = re.compile(r"[,*\\\s\"]")


def lsn_int(lsn: str) -> int:
    """An LSN's text as a number that sorts as the WAL does.

    >>> lsn_int("0/16B3748"), lsn_int("1/0") > lsn_int("0/FFFFFFFF")
    (23803720, True)
    """
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(value: int) -> str:
    """An LSN as PostgreSQL writes it.

    >>> lsn_text(lsn_int("A/16B3748"))
    'A/16B3748'
    """
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


def default_slot(source_name: str) -> str:
    """The slot of a source given no ``slot=``: ``headrace_`` and its name, fit for a slot name.

    >>> default_slot("Orders-CDC")
    'headrace_orders_cdc'
    """
    return ("headrace_" + re.sub(r"[^a-z0-9_]", "_", source_name.lower()))[:63]


def wal_level_message(where: str, level: str, dsn: str) -> str:
    """What to say when the server at ``dsn`` runs with ``wal_level=level`` (not logical)."""
    return (f"{where}: PostgreSQL at {redact_dsn(dsn)} runs with wal_level={level}, and change data capture "
            "needs wal_level=logical: run scripts/postgres_logical.sh on the local cluster, or set "
            "wal_level=logical (and max_replication_slots, max_wal_senders >= 1) in postgresql.conf and "
            "restart the server")


def psycopg_module() -> Any:
    return postgres.psycopg_module("the PostgresChanges source")


def postgres_connect(dsn: str, where: str, autocommit: bool = True) -> Any:
    psycopg = psycopg_module()
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        raise SourceError(f"{where}: cannot connect to PostgreSQL at {redact_dsn(dsn)}: {one_line(exc)}") from None


def _qualified(table: str) -> tuple[str, str]:
    schema, _, name = table.rpartition(".")
    return schema or "public", name


def _plugin_options(tables: Sequence[str]) -> list[str]:
    return ["format-version", "2", "include-xids", "1", "include-timestamp", "1", "include-transaction", "1",
            "actions", "insert,update,delete", "add-tables", ",".join(tables)]


def slot_error(where: str, slot: str, dsn: str, doing: str, exc: BaseException) -> SourceError:
    text = one_line(exc)
    if "wal_level" in text:
        return SourceError(wal_level_message(where, "not logical", dsn) + f" ({text})")
    return SourceError(f"{where}: PostgreSQL at {redact_dsn(dsn)}: {doing} the replication slot {slot!r}: {text}")


# ----------------------------------------------------------------------------------------
# The server: checks, the slot's lifecycle.

def check_server(conn: Any, where: str, dsn: str) -> None:
    """Refuse a server that cannot decode logically."""
    level = conn.execute("SHOW wal_level").fetchone()[0]
    if level != "logical":
        raise SourceError(wal_level_message(where, level, dsn))


def check_tables(conn: Any, where: str, dsn: str, tables: Sequence[str]) -> None:
    """Each table exists and its updates and deletes carry an old key (REPLICA IDENTITY)."""
    for table in tables:
        schema, name = _qualified(table)
        row = conn.execute(
            "SELECT c.relkind, c.relreplident, EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid "
            "AND i.indisprimary) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
        if row is None:
            raise SourceError(f"{where}: table {table!r} does not exist in the database of {redact_dsn(dsn)}; "
                              "create it first, or fix tables= (write schema.table outside 'public')")
        kind, identity, has_key = row
        if kind not in ("r", "p"):
            raise SourceError(f"{where}: {table!r} is not a table (relkind {kind!r}); only tables have changes "
                              "to capture")
        if identity == "n" or (identity == "d" and not has_key):
            raise SourceError(f"{where}: table {table!r} has no primary key and REPLICA IDENTITY "
                              f"{'NOTHING' if identity == 'n' else 'DEFAULT'}, so its updates and deletes carry no "
                              f"old key; add a primary key or run ALTER TABLE {table} REPLICA IDENTITY FULL")


def slot_position(conn: Any, slot: str) -> tuple[str, str, str] | None:
    """(plugin, database, confirmed flush LSN) of ``slot``, or None when there is none."""
    row = conn.execute("SELECT plugin, database, confirmed_flush_lsn::text FROM pg_replication_slots "
                       "WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else (row[0], row[1], row[2])


def ensure_slot(conn: Any, where: str, dsn: str, slot: str) -> str:
    """The confirmed LSN of ``slot``, created (with wal2json) when missing."""
    psycopg = psycopg_module()
    found = slot_position(conn, slot)
    database = conn.execute("SELECT current_database()").fetchone()[0]
    if found is None:
        check_server(conn, where, dsn)
        try:  # creating a slot waits until the transactions open now have ended
            conn.execute("SET statement_timeout = '120s'")
            conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, PLUGIN))
        except psycopg.errors.DuplicateObject:
            pass  # created meanwhile by another reader of this source
        except psycopg.errors.QueryCanceled:
            raise SourceError(f"{where}: PostgreSQL at {redact_dsn(dsn)}: creating the replication slot {slot!r} "
                              "waited 120 s for the transactions open on the server to end; end them (see "
                              "pg_stat_activity) and start again") from None
        except psycopg.Error as exc:
            if PLUGIN in str(exc):
                raise SourceError(f"{where}: PostgreSQL at {redact_dsn(dsn)}: cannot create the replication slot "
                                  f"{slot!r}: {one_line(exc)} (is the {PLUGIN} plugin installed? run "
                                  "scripts/postgres_logical.sh)") from None
            raise slot_error(where, slot, dsn, "cannot create", exc) from None
        finally:
            conn.execute("RESET statement_timeout")
        found = slot_position(conn, slot)
        assert found is not None
    plugin, slot_database, confirmed = found
    if plugin != PLUGIN or slot_database != database:
        raise SourceError(f"{where}: the replication slot {slot!r} exists for plugin {plugin!r} in database "
                          f"{slot_database!r}; this source needs one of its own for {PLUGIN} in {database!r}: "
                          "pass another slot= (or drop that slot if nothing uses it)")
    return str(confirmed)


def drop_slot(dsn: str, slot: str) -> bool:
    """Drop the replication slot ``slot`` of a retired pipeline, so that the server stops keeping WAL
    for it; True when there was one. (In SQL: ``SELECT pg_drop_replication_slot('<slot>')``.)"""
    conn = postgres_connect(dsn, f"drop_slot({slot!r})")
    try:
        if slot_position(conn, slot) is None:
            return False
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
        return True
    finally:
        conn.close()


def postgres_peek(conn: Any, slot: str, columns: str, upto_lsn: str | None, upto_rows: int | None,
          tables: Sequence[str], cursor: Any = None) -> Any:
    """``pg_logical_slot_peek_changes`` (nothing consumed), waiting while another process holds the
    slot (a killed driver's server process, for a moment)."""
    psycopg = psycopg_module()
    query = (f"SELECT {columns} FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, %s, "
             + ", ".join(["%s"] * len(_plugin_options(tables))) + ")")
    params = (slot, upto_lsn, upto_rows, *_plugin_options(tables))
    deadline = time.monotonic() + SLOT_BUSY_WAIT_S
    while True:
        try:
            if cursor is not None:
                return cursor.execute(query, params)
            return conn.execute(query, params).fetchall()
        except psycopg.errors.ObjectInUse:
            if time.monotonic() > deadline:
                raise
            if not conn.autocommit:
                conn.rollback()
            time.sleep(0.5)


# ----------------------------------------------------------------------------------------
# wal2json's output to Arrow record batches.

def _binary(value: Any) -> bytes:
    if type(value) is not str or not value.startswith("\\x"):
        raise BadValue
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise BadValue from None


def _timestamp(value: Any) -> int:
    if type(value) is not str:
        raise BadValue
    return iso_us(value)


CONVERTERS = {**JSON_CONVERTERS, "binary": _binary, "timestamp": _timestamp}


def _loads(raw: str) -> Any:
    """JSON text with orjson (about 6 times faster than ``json`` here); ``json`` takes what orjson
    refuses (integers beyond 64 bits)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def _dumps(image: dict[str, Any]) -> str:
    try:
        return orjson.dumps(image).decode()
    except TypeError:
        return json.dumps(image, ensure_ascii=False)


def _image(columns: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return None if columns is None else {c["name"]: c.get("value") for c in columns}


class ChangeDecoder:
    """Collects the changes of committed transactions and turns them into record batches of the
    source's Arrow schema (good rows first, then dead letters)."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.arrow = batch_schema((*schema, *METADATA), dead_letters=True)
        self.rows: list[tuple[Any, ...]] = []  # (op, table, before, after, lsn, commit lsn, time, xid, image)
        self.dead: list[tuple[str, str, str]] = []  # (raw, error, position)

    def __len__(self) -> int:
        return len(self.rows) + len(self.dead)

    def add(self, raw: str, row_lsn: str, commit_lsn: str, commit_us: int | None, xid: int | None) -> None:
        try:
            change = _loads(raw)
            op = OPS[change["action"]]
            table = f"{change['schema']}.{change['table']}"
            before, after = _image(change.get("identity")), _image(change.get("columns"))
            lsn = str(change.get("lsn") or row_lsn)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.dead.append((raw, f"cannot decode the change ({type(exc).__name__}: {exc})", row_lsn))
            return
        if op == "insert":
            before = None
        elif op == "delete":
            after = None
        self.rows.append((op, table, before, after, lsn, commit_lsn, commit_us, xid, raw))

    def batches(self) -> Iterator[pa.RecordBatch]:
        rows, dead = self.rows, self.dead
        self.rows, self.dead = [], []
        dead_rows: dict[int, str] = {}
        columns: list[pa.Array] = []
        if self.schema and rows:
            images = [r[3] if r[3] is not None else (r[2] or {}) for r in rows]
            for name, type_name in self.schema:
                errors: dict[int, str] = {}
                columns.append(convert_values(name, type_name, [i.get(name) for i in images],
                                              CONVERTERS[type_name], errors))
                for row, error in errors.items():
                    dead_rows.setdefault(row, f"table {rows[row][1]}: {error}")
        for row, error in sorted(dead_rows.items()):
            dead.append((rows[row][8], error, rows[row][4]))
        if rows:
            keep = [i for i in range(len(rows)) if i not in dead_rows]
            if dead_rows:
                index = pa.array(keep, pa.int64())
                columns = [c.take(index) for c in columns]
                rows = [rows[i] for i in keep]
            if rows:
                def text(image: dict[str, Any] | None) -> str | None:
                    return None if image is None else _dumps(image)

                meta = [pa.array([r[0] for r in rows], pa.string()), pa.array([r[1] for r in rows], pa.string()),
                        pa.array([text(r[2]) for r in rows], pa.string()),
                        pa.array([text(r[3]) for r in rows], pa.string()),
                        pa.array([r[4] for r in rows], pa.string()), pa.array([r[5] for r in rows], pa.string()),
                        pa.array([r[6] for r in rows], arrow_type("timestamp")),
                        pa.array([r[7] for r in rows], pa.int64())]
                yield data_batch(self.arrow, columns, meta)
        if dead:
            yield dead_letter_batch(self.arrow, [d[0] for d in dead], [d[1] for d in dead], [d[2] for d in dead])


# ----------------------------------------------------------------------------------------
# The connector.

def _merged_schema(schema: Any, tables: tuple[str, ...], where: str) -> Schema:
    """One schema from ``schema``: one for every table, or ``{table: schema}`` merged (a column
    named in several tables must have one type)."""
    if schema is None:
        return ()
    short = {t.partition(".")[2]: t for t in tables if t.startswith("public.")}
    if isinstance(schema, Mapping) and schema and all(k in tables or k in short for k in schema):
        merged: dict[str, str] = {}
        for table, spec in schema.items():
            for name, type_name in schema_of(spec, f"{where}: schema of {table!r}"):
                if merged.setdefault(name, type_name) != type_name:
                    raise PlanError(f"{where}: column {name!r} is {merged[name]} in one table's schema and "
                                    f"{type_name} in table {table!r}'s; give it one type")
        return tuple(merged.items())
    return schema_of(schema, where)


@dataclass(frozen=True, init=False)
class PostgresChanges(broker.Source, metadata=METADATA, spark_reader="postgres_cdc:PostgresChangesDataSource"):
    """The inserts, updates and deletes of PostgreSQL tables, from a logical replication slot.

    ``tables``: a table, a comma-separated list or a list (``"orders"`` is ``public.orders``;
    ``"shop.orders"`` names its schema). ``dsn``: a libpq URL or connection string of the database.
    ``slot``: the replication slot (created when missing; default ``headrace_<source name>``).
    ``schema``: None (the row images only as JSON text in ``before``/``after``), or columns to add,
    typed, taken from the new row (the old one on deletes): a schema for every table, or
    ``{table: schema}``. ``max_records_per_batch``: changes per micro-batch, whole transactions
    (None: all there are). Exactly-once while the slot lives; see the module's docstring.
    """

    tables: tuple[str, ...]
    data_schema: Schema
    dsn: str
    slot: str | None
    max_records_per_batch: int | None

    def __init__(self, tables: str | Sequence[str], *, dsn: str = DEFAULT_DSN, slot: str | None = None,
                 schema: Any = None, max_records_per_batch: int | None = None) -> None:
        names = broker.name_list(tables)
        where = f"PostgresChanges({', '.join(names)})"
        if not names:
            raise PlanError("PostgresChanges(): give at least one table, e.g. PostgresChanges('orders')")
        for name in names:
            if name.count(".") > 1 or not all(_qualified(name)) or _BAD_TABLE_CHARS.search(name):
                raise PlanError(f"{where}: {name!r} is not a table name like 'orders' or 'shop.orders'")
        qualified = tuple(".".join(_qualified(n)) for n in names)
        if len(set(qualified)) != len(qualified):
            raise PlanError(f"{where}: a table is named twice")
        if not isinstance(dsn, str) or not dsn.strip():
            raise PlanError(f"{where}: dsn must be a PostgreSQL connection string or URL, got {dsn!r}")
        if slot is not None and not (isinstance(slot, str) and _SLOT_NAME.match(slot)):
            raise PlanError(f"{where}: slot={slot!r} is not a replication slot name (lower-case letters, digits "
                            "and _, at most 63)")
        broker.check_batch_sizes(where, max_records_per_batch)
        data_schema = _merged_schema(schema, qualified, where)
        taken = sorted({n for n, _ in data_schema} & {n for n, _ in METADATA})
        if taken:
            raise PlanError(f"{where}: the schema's column(s) {', '.join(taken)} clash with the source's own "
                            f"columns {', '.join(n for n, _ in METADATA)}; leave them out (the JSON images "
                            "in before/after still hold them)")
        unsupported = sorted({t for _, t in data_schema if t not in CONVERTERS})
        if unsupported:
            raise PlanError(f"{where}: schema types {', '.join(unsupported)} are not read from changes; use "
                            f"{', '.join(CONVERTERS)} (or read the value from the JSON images)")
        self._assign(tables=qualified, data_schema=data_schema, dsn=dsn, slot=slot,
                     max_records_per_batch=max_records_per_batch)

    def offset_identity(self) -> dict[str, Any]:
        """An offset is a commit position of the slot's database: the slot and the tables fix what it
        means; the schema (how a change is typed), the server's address and batch sizes do not."""
        return {"tables": list(self.tables), "slot": self.slot}

    def describe(self) -> dict[str, Any]:
        return {"type": "PostgresChanges",
                "what": "PostgreSQL change data capture: inserts, updates and deletes of the tables, read "
                        f"from a logical replication slot ({PLUGIN}); offsets are commit LSNs, the slot "
                        "advances when Spark has committed a batch",
                "tables": list(self.tables), "dsn": redact_dsn(self.dsn),
                "slot": self.slot or "headrace_<source name>", "schema": to_ddl(self.data_schema) or None,
                "max_records_per_batch": self.max_records_per_batch,
                "guarantee": self.guarantee.value, "dead_letters": True}

    def prepare(self, context: SourceContext) -> None:
        """Before Spark starts: the server decodes logically, the tables are there, the slot exists."""
        where = f"source {context.source_name!r}"
        conn = postgres_connect(self.dsn, where)
        try:
            check_server(conn, where, self.dsn)
            check_tables(conn, where, self.dsn, self.tables)
            ensure_slot(conn, where, self.dsn, self.slot or default_slot(context.source_name))
        finally:
            conn.close()
