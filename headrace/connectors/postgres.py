"""A PostgreSQL sink: each batch's rows and its batch id are committed in one transaction.

The commit table ``headrace_sink_commits`` (:mod:`headrace.connectors.postgres_commits`)
records every batch a sink has committed; the rows of a batch and its record are written
in the same transaction, and a batch whose record exists is skipped (the claim of its
batch id inside the transaction makes sure of it), so a batch Spark replays after a
failure adds nothing. Rows are loaded with ``COPY`` into a temporary table and moved into
the target with one ``INSERT ... SELECT`` (``ON CONFLICT (key) DO UPDATE`` when a key is
given).

**Faults.** A transient failure (the server cannot be reached, the connection is lost or
terminated, a serialization failure: :func:`transient`) makes the sink try the whole
step again, on a new connection, with exponential backoff (:mod:`headrace.connectors.retry`).
A retry of a batch whose commit may have gone through, its answer lost with the
connection, starts with the claim of its batch id, which finds the record and writes
nothing. Any other error stops the batch at once.

**Lost rows.** Once a sink has committed rows into its table, the table must stay: when it
is missing (dropped, renamed away) or empty (truncated, dropped and created again), the
sink stops instead of creating it again and writing on, unless ``rewrite=True``.
"""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from headrace.connectors import postgres_commits as commits
from headrace.connectors import postgres_staging as staging
from headrace.connectors.base import check_sink_columns, column_names, redact_dsn, run_batch
from headrace.connectors.postgres_commits import COMMIT_TABLE
from headrace.connectors.retry import DEFAULT_FIRST_S, DEFAULT_RETRIES, Backoff, RetriesExhausted, retry, unreachable
from headrace.contract import Guarantee, SinkConnector
from headrace.errors import PlanError, SetupError, SinkError, raised_inside
from headrace.schema import TYPE_ALIASES
from headrace.sink_step import SinkStep, step_name

T = TypeVar("T")

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
CONNECT_TIMEOUT_S = 10
# libpq settings a DSN may override: a connection whose server or network went silent (no reply,
# not even to TCP keepalives; data sent and never acknowledged) fails after about a minute
# instead of holding the batch without end; the failure is transient and retried.
CONNECTION_DEFAULTS: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S, "keepalives": 1, "keepalives_idle": 30,
                                       "keepalives_interval": 10, "keepalives_count": 3, "tcp_user_timeout": 60_000}

# SQLSTATE classes of errors worth another attempt: connection exception, transaction rollback
# (serialization failure, deadlock), insufficient resources (too many connections), operator
# intervention (admin or crash shutdown, "the database system is starting up"), system error.
RETRIED_SQLSTATE_CLASSES = ("08", "40", "53", "57", "58")
RETRIED_SQLSTATES = ("55P03",)  # lock not available: a lock timeout, another transaction held the lock
NOT_RETRIED_SQLSTATES = ("57014",)  # query canceled: a statement timeout would only time out again
CONNECTION_SQLSTATES = ("08", "57P")  # the server is gone or going: "unreachable"
# Connecting failed for a reason another attempt cannot fix (such errors carry no SQLSTATE).
CONNECT_CONFIG_ERRORS = ("does not exist", "authentication failed", "no pg_hba.conf entry", "permission denied")

# Column type -> PostgreSQL column type: headrace's canonical type names (headrace.schema),
# then the other Spark types a sink may be given, by their DataType.typeName().
PG_TYPES = {
    "string": "text", "long": "bigint", "int": "integer", "double": "double precision", "float": "real",
    "boolean": "boolean", "timestamp": "timestamptz", "date": "date", "binary": "bytea",
    "varchar": "text", "char": "text", "short": "smallint", "byte": "smallint", "timestamp_ntz": "timestamp",
    "struct": "jsonb", "array": "jsonb", "map": "jsonb",
}


def psycopg_module(needing: str = "the Postgres sink") -> Any:
    """psycopg 3, imported when first used; without it, a SetupError saying that ``needing`` needs it."""
    try:
        import psycopg
    except ImportError:
        raise SetupError(f"{needing} needs psycopg 3: pip install 'psycopg[binary]'") from None
    return psycopg


def one_line(exc: BaseException) -> str:
    """A psycopg error's message (PostgreSQL's spans lines) on one line, fit for an error message."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _table_parts(table: str) -> tuple[str, ...]:
    return tuple(table.split("."))


def transient(exc: BaseException) -> bool:
    """Whether another attempt may succeed where ``exc`` failed: psycopg's OperationalError
    for a connection that failed or was lost (no SQLSTATE, or class 08), an admin or crash
    shutdown (57P01, 57P02), a server starting up (57P03), a serialization failure or
    deadlock (40001, 40P01), a lock timeout (55P03), too many connections (53300) or an I/O error (58). Not a
    canceled statement (57014), nor a connection refused for its settings (unknown
    database or role, failed authentication), nor any data or schema error."""
    psycopg = psycopg_module()
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    if state is None:
        return not any(phrase in str(exc) for phrase in CONNECT_CONFIG_ERRORS)
    if state in RETRIED_SQLSTATES:
        return True
    return state[:2] in RETRIED_SQLSTATE_CLASSES and state not in NOT_RETRIED_SQLSTATES


def _connection_failed(exc: BaseException) -> bool:
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith(CONNECTION_SQLSTATES)


def pg_type(spark_type: Any) -> str | None:
    """The PostgreSQL column type for a Spark ``DataType``, or None when there is none."""
    name = spark_type.typeName()
    if name == "decimal":
        return f"numeric({spark_type.precision},{spark_type.scale})"
    return PG_TYPES.get(TYPE_ALIASES.get(name, name))  # Spark's "integer" is headrace's "int"


class Postgres(SinkConnector):
    """Write each batch into the PostgreSQL table ``table``, exactly once.

    Parameters:

    * ``table``: the target table, optionally schema-qualified (``"shop.orders"``).
    * ``dsn``: a libpq connection string or URL.
    * ``key``: column name(s) of the table's primary key. With a key, rows are
      upserted (``INSERT ... ON CONFLICT (key) DO UPDATE``; within one batch the
      last row of a key wins); without one they are inserted. Either way a
      batch is committed once.
    * ``create_table``: create the table, if missing, from the batch's Spark
      schema (strings ``text``, longs ``bigint``, timestamps ``timestamptz``,
      structs, arrays and maps ``jsonb``...) with ``key`` as primary key, as long
      as this sink has committed no rows into it; a table that held its rows and
      went missing stops the sink instead.
    * ``retries``, ``retry_backoff``: after a transient failure (:func:`transient`)
      a step is tried again up to ``retries`` times, first after ``retry_backoff``
      seconds, then twice as long each time, at most 8 s (defaults: 5 and 0.5, so six
      attempts over about 15.5 s); then the pipeline stops, saying so.
    * ``rewrite``: when the table that held this sink's rows is missing or empty,
      create it again (or write into the empty one) and accept that the batches
      committed before are gone, with a warning; their commit records are deleted.

    **Identity.** A sink's commits are recorded under its *sink name* in
    ``headrace_sink_commits``. The compiler gives the sink the name of its step
    with ``sink.bind(step_name)``, which returns a configured copy; the name
    can also be given as ``name=``. An unbound sink is named after its table.
    The name must stay the same across restarts from a checkpoint (Spark
    replays batch ids from there), and a new checkpoint needs a new name or
    cleared commit records, since batch ids start again at 0. Messages name the
    step (``sink 'totals' (app.py:14)``), the identity only as a detail.
    """

    guarantee = Guarantee.EXACTLY_ONCE
    native_format = None
    keyed_updates = "(..., key=[...])"  # an upsert by key

    def refuses_updates(self) -> str | None:
        return None if self.key else "without key= it inserts each update as a new row"

    def __init__(self, table: str, dsn: str = DEFAULT_DSN, key: str | Sequence[str] | None = None,
                 create_table: bool = True, *, name: str | None = None, retries: int = DEFAULT_RETRIES,
                 retry_backoff: float = DEFAULT_FIRST_S, rewrite: bool = False):
        if not isinstance(table, str) or not table.strip() or any(not p for p in _table_parts(table)):
            raise PlanError(f"Postgres sink: table must be a name like 'events' or 'shop.events', got {table!r}")
        where = f"Postgres sink for table {table!r}"
        if not isinstance(dsn, str) or not dsn.strip():
            raise PlanError(f"{where}: dsn must be a connection string, got {dsn!r}")
        keys = column_names(key, "key", where)
        if name is not None and (not isinstance(name, str) or not name):
            raise PlanError(f"{where}: name must be a non-empty string, got {name!r}")
        if not isinstance(rewrite, bool):
            raise PlanError(f"{where}: rewrite must be True or False, got {rewrite!r}")
        if rewrite and not create_table:
            raise PlanError(f"{where}: rewrite=True creates the table again when it went missing; it needs "
                            "create_table=True")
        self.table = table
        self.dsn = dsn
        self.key = keys
        self.create_table = bool(create_table)
        self.backoff = Backoff.checked(retries, retry_backoff, where)
        self.rewrite = rewrite
        self._name = name
        self._step: SinkStep | None = None
        self._reset()

    def _reset(self) -> None:
        """Forget what belongs to one connection or one process (kept state, cached facts)."""
        self._conn: Any = None
        self._commit_table_ready = False
        self._has_rows: bool | None = None  # whether this sink committed rows into its table

    # -- identity -----------------------------------------------------------

    @property
    def name(self) -> str:
        """The sink's identity in the commit table: its step name once bound, else its table."""
        return self._name or self.table

    def bind(self, identity: str, defined_at: str = "") -> Postgres:
        """A copy of this sink that records its commits under ``identity`` (its step, pipeline and
        checkpoint), for the step defined at ``defined_at`` (``file:line``, for messages)."""
        if not isinstance(identity, str) or not identity:
            raise PlanError(f"Postgres sink for table {self.table!r}: step name must be a non-empty string")
        bound = copy.copy(self)
        bound._name = identity
        bound._step = SinkStep(step_name(identity), defined_at)
        bound._reset()
        return bound

    def describe(self) -> dict[str, Any]:
        return {"type": "Postgres", "name": self.name, "table": self.table, "dsn": redact_dsn(self.dsn),
                "key": list(self.key) or None, "create_table": self.create_table,
                "retries": self.backoff.retries, "retry_backoff": self.backoff.first_s, "rewrite": self.rewrite}

    def __repr__(self) -> str:
        return (f"Postgres({self.table!r}, dsn={redact_dsn(self.dsn)!r}, key={list(self.key) or None!r}, "
                f"create_table={self.create_table!r}, name={self.name!r}, retries={self.backoff.retries!r}, "
                f"retry_backoff={self.backoff.first_s!r}, rewrite={self.rewrite!r})")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_conn=None, _commit_table_ready=False, _has_rows=None)
        return state

    def _where(self) -> str:
        """``sink 'totals' (app.py:14)``: how every message of this sink begins."""
        return str(self._step or SinkStep(step_name(self.name)))

    # -- connection and retries -----------------------------------------------

    def _connect(self) -> Any:
        psycopg = psycopg_module()
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self.close()
        try:
            given = psycopg.conninfo.conninfo_to_dict(self.dsn)
            extra = {name: value for name, value in CONNECTION_DEFAULTS.items() if name not in given}
        except psycopg.Error as exc:
            raise SinkError(f"{self._where()}: the DSN {redact_dsn(self.dsn)!r} is not valid: "
                            f"{one_line(exc)}") from None
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, **extra)
        except psycopg.Error as exc:
            if transient(exc):
                raise
            raise SinkError(f"{self._where()}: cannot connect to PostgreSQL at {redact_dsn(self.dsn)}: "
                            f"{one_line(exc)}; check the DSN (database, user, password)") from None
        self._conn = conn
        return conn

    def _ready(self) -> Any:
        """A connection, with the commit table in place."""
        conn = self._connect()
        if not self._commit_table_ready:
            commits.ensure_table(conn, psycopg_module().errors.UniqueViolation)
            self._commit_table_ready = True
        return conn

    def close(self) -> None:
        """Close the connection the sink keeps between batches."""
        conn = self._conn
        self._reset()
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection must not fail
                pass

    def _retrying(self, doing: str, action: Callable[[], T]) -> T:
        """``action()``, tried again on a new connection after each transient failure; a
        SinkError naming the step when it cannot be done."""
        psycopg = psycopg_module()
        try:
            return retry(action, self.backoff, transient, on_retry=lambda _exc: self.close())
        except RetriesExhausted as out:
            self.close()
            if _connection_failed(out.last):  # the restart strategy restarts the query on these words
                what = unreachable("PostgreSQL", out.attempts, out.elapsed_s)
                then = ("the run restarts the query from its checkpoint under its restart strategy (exactly once); "
                        "if the server stays down longer, restart the pipeline once it is back, or let the sink "
                        "wait longer with retries= and retry_backoff=")
            else:
                what = (f"PostgreSQL kept failing after {out.attempts} attempt{'s' if out.attempts > 1 else ''} "
                        f"over {out.elapsed_s:.1f} s")
                then = ("restart the pipeline once the cause is fixed (it goes on from its checkpoint, exactly "
                        "once), or let the sink wait longer with retries= and retry_backoff=")
            raise SinkError(f"{self._where()}: {what}: {one_line(out.last)}; gave up trying to {doing} at "
                            f"{redact_dsn(self.dsn)}; {then}", refusal=not _connection_failed(out.last)) from None
        except psycopg.Error as exc:
            raise SinkError(f"{self._where()}: cannot {doing}: {one_line(exc)}") from None

    def prepare(self, run_dir: str) -> None:
        """Before the query starts: connect, create the commit table, and
        stop if the rows this sink committed are gone."""
        self._retrying(f"check table {self.table!r} and the commit table {COMMIT_TABLE} before the start",
                       self._check_at_start)

    def check_schema(self, schema: Any, step: SinkStep) -> None:
        """An existing table against the stream, before the first batch: every column of the
        stream is a column of the table, of a type PostgreSQL can cast the stream's type to (a
        missing table is created from the stream's schema, when create_table=True)."""
        named = copy.copy(self)  # every message, retries' included, names the step
        named._step = step
        named._reset()
        columns = [field.name for field in schema.fields]
        check_sink_columns(named._where(), columns, self.key)
        types = named._column_types(schema)
        try:
            named._retrying(f"check table {self.table!r} against the stream's columns",
                            lambda: named._check_table_schema(str(step), schema, types))
        finally:
            named.close()

    def _check_table_schema(self, where: str, schema: Any, types: tuple[str, ...]) -> None:
        psycopg = psycopg_module()
        from psycopg import sql

        conn = self._connect()
        target = sql.Identifier(*_table_parts(self.table)).as_string(conn)
        found = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                                  "attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                                  (target,)).fetchall())
        if not found:
            if self.create_table:
                return  # the first batch creates it from the stream's schema
            raise SinkError(f"{where}: table {self.table!r} does not exist; create it or pass create_table=True")
        for field, stream_type in zip(schema.fields, types):
            if field.name not in found:
                raise SinkError(f"{where}: table {self.table!r} has no column {field.name!r} (it has "
                                f"{', '.join(found)}); add it to the table or drop it from the stream")
            try:
                with conn.transaction():
                    conn.execute(sql.SQL("SELECT CAST(CAST(NULL AS {}) AS {})").format(
                        sql.SQL(stream_type), sql.SQL(found[field.name])))
            except psycopg.errors.CannotCoerce as exc:
                spark_type = TYPE_ALIASES.get(field.dataType.typeName(), field.dataType.typeName())
                reason = str(exc).splitlines()[0]
                raise SinkError(f"{where}: the stream's column {field.name!r} is a {spark_type} (PostgreSQL "
                                f"{stream_type}), and column {field.name!r} of table {self.table!r} is a "
                                f"{found[field.name]}, which PostgreSQL cannot cast it to ({reason}); "
                                "cast the column in the pipeline, or change the table's column") from None

    def _check_at_start(self) -> None:
        conn = self._ready()
        staging.drop_leftovers(conn, self.name)
        lost = self._lost(conn, None)
        if lost:
            self._lost_rows(conn, lost, None)

    def is_committed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` of this sink is recorded in the commit table."""
        return self._retrying(f"check whether batch {batch_id} is committed",
                              lambda: commits.is_recorded(self._ready(), self.name, batch_id))

    # -- writing ------------------------------------------------------------

    def committed(self, batch_id: int) -> bool:
        return self.is_committed(batch_id)

    def write_batch(self, df: Any, batch_id: int) -> None:
        columns = list(df.columns)
        check_sink_columns(self._where(), columns, self.key)
        if self.is_committed(batch_id):  # (the dispatcher asks committed() first; this is for direct calls)
            run_batch(df)  # a replay: write nothing, but read the batch, as Spark needs to commit its state
            return
        schema = df.schema
        stage = staging.Stage(staging.stage_name(self.name, batch_id), tuple(columns), self._column_types(schema))
        self._retrying(f"create the staging table of batch {batch_id}", lambda: stage.create(self._connect()))
        try:
            rows = staging.load(df, stage, lambda part, batches: self._load_partition(stage, part, batches))
        except Exception as exc:
            inner = raised_inside(str(exc), only=("SinkError",))
            if inner is not None:  # a task could not load its rows: its message names the step
                raise inner from None
            raise
        self._retrying(f"write batch {batch_id}", lambda: self._write_once(batch_id, columns, schema, stage, rows))

    def _load_partition(self, stage: staging.Stage, partition: int, batches: list[Any]) -> int:
        """On an executor: load one partition's rows into the staging table (retried like the
        driver's steps), on a connection of the task's own."""
        try:
            return self._retrying(f"stage partition {partition} of the batch in {stage.name}",
                                  lambda: stage.load_partition(self._connect(), partition, batches, _csv_ready))
        finally:
            self.close()

    def _write_once(self, batch_id: int, columns: list[str], schema: Any, stage: staging.Stage, rows: int) -> None:
        """One attempt: claim the batch id, check the table, move the staged rows, commit; then
        drop the staging table."""
        psycopg = psycopg_module()
        from psycopg import sql

        conn = self._ready()
        try:
            with conn.transaction():
                if not commits.claim(conn, self.name, batch_id, rows, self.table):
                    raise psycopg.Rollback()  # committed before: a replay, or an attempt whose answer was lost
                lost = self._lost(conn, batch_id)
                if lost:
                    self._lost_rows(conn, lost, batch_id)
                if self.create_table:
                    self._create_table(conn, schema)
                self._check_target(conn, columns)
                if rows:
                    self._move(conn, columns, stage)
        except psycopg.errors.InvalidColumnReference as exc:
            raise SinkError(f"{self._where()}: batch {batch_id}: table {self.table!r} has no primary key or unique "
                            f"index on {list(self.key)} ({one_line(exc)}); add one or change key=") from None
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(stage.name)))
        if rows:
            self._has_rows = True

    # -- rows committed before -------------------------------------------------

    def _lost(self, conn: Any, batch_id: int | None) -> str | None:
        """``"missing"`` or ``"empty"`` when the table no longer holds the rows this sink committed
        into it (in batches other than ``batch_id``), else None. Two cheap reads per batch: the
        table's existence and, when it should hold rows, whether it holds any. Rows deleted
        from a table that keeps others are not noticed."""
        from psycopg import sql

        if self._has_rows is None:
            self._has_rows = commits.has_rows(conn, self.name, self.table, batch_id)
        if not self._has_rows:
            return None
        target = sql.Identifier(*_table_parts(self.table))
        if conn.execute("SELECT to_regclass(%s) IS NULL", (target.as_string(conn),)).fetchone()[0]:
            return "missing"
        if conn.execute(sql.SQL("SELECT NOT EXISTS (SELECT 1 FROM {})").format(target)).fetchone()[0]:
            return "empty"
        return None

    def _lost_rows(self, conn: Any, lost: str, batch_id: int | None) -> None:
        """Stop with what was found and what to do; with ``rewrite=True``, forget the lost batches
        and warn instead."""
        done = commits.committed(conn, self.name, self.table, batch_id)
        table = f"table {self.table!r}"
        if self.rewrite:
            commits.forget(conn, self.name, self.table, batch_id)
            self._has_rows = False
            warnings.warn(f"{self._where()}: {table} was {lost}; "
                          f"rewrite=True: writing on {'into a new table' if lost == 'missing' else 'into it'}, "
                          f"and {done} committed before are gone", stacklevel=2)
            return
        found, since, restore, rewrite = {
            "missing": ("is missing", "it was dropped or renamed", "restore the table (or rename it back)",
                        "create the table again"),
            "empty": ("is empty", "it was emptied (TRUNCATE, DELETE) or dropped and created again",
                      "restore its rows", "write on into it"),
        }[lost]
        option = "rewrite=True" if self.create_table else "rewrite=True and create_table=True"
        raise SinkError(
            f"{self._where()}: {table} {found}, but this sink committed {done} into it (commit records of "
            f"{self.name!r} in {COMMIT_TABLE}); {since}, and writing on would lose those rows without a word. "
            f"To go on: {restore} and restart the pipeline; or restart it with --fresh (fresh=True) to start "
            f"over from the beginning of its input; or pass {option} to this sink to {rewrite} and accept "
            "that those batches are gone")

    # -- the target table --------------------------------------------------------

    def _column_types(self, schema: Any) -> tuple[str, ...]:
        """The PostgreSQL type of each of the stream's columns (``pg_type``)."""
        types = []
        for field in schema.fields:
            column_type = pg_type(field.dataType)
            if column_type is None:
                raise SinkError(f"{self._where()}: column {field.name!r} has Spark type "
                                f"{field.dataType.simpleString()}, which has no PostgreSQL column type here; "
                                f"cast it to a string or create table {self.table!r} yourself")
            types.append(column_type)
        return tuple(types)

    def _create_table(self, conn: Any, schema: Any) -> None:
        from psycopg import sql

        definitions = [sql.SQL("{} {}").format(sql.Identifier(field.name), sql.SQL(column_type))
                       for field, column_type in zip(schema.fields, self._column_types(schema))]
        if self.key:
            definitions.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(sql.Identifier(k) for k in self.key)))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            sql.Identifier(*_table_parts(self.table)), sql.SQL(", ").join(definitions)))

    def _check_target(self, conn: Any, columns: list[str]) -> None:
        psycopg = psycopg_module()
        from psycopg import sql

        try:
            with conn.transaction():
                cursor = conn.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(
                    sql.Identifier(*_table_parts(self.table))))
        except psycopg.errors.UndefinedTable:
            raise SinkError(f"{self._where()}: table {self.table!r} does not exist; create it or pass "
                            "create_table=True") from None
        existing = [d.name for d in cursor.description or ()]
        unknown = [c for c in columns if c not in existing]
        if unknown:
            raise SinkError(f"{self._where()}: table {self.table!r} has no column(s) {unknown} (it has "
                            f"{existing}); add them to the table or drop them from the stream")

    def _move(self, conn: Any, columns: list[str], stage: staging.Stage) -> None:
        """Insert the staged rows into the target in the batch's order (upsert: the last row of a key wins)."""
        from psycopg import sql

        source = sql.Identifier(stage.name)
        target = sql.Identifier(*_table_parts(self.table))
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        types = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                                  "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                                  (target.as_string(conn),)).fetchall())
        # The staged columns have the stream's types; a target column of another type takes a cast.
        values = sql.SQL(", ").join(sql.SQL("CAST({} AS {})").format(sql.Identifier(c), sql.SQL(types[c]))
                                    for c in columns)
        order = sql.SQL(f"{staging.PART_COLUMN}, {staging.ORDER_COLUMN}")
        if not self.key:
            conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY {}")
                         .format(target, cols, values, source, order))
            return
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.key)
        others = [c for c in columns if c not in self.key]
        action: Any
        if others:
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others))
        else:
            action = sql.SQL("DO NOTHING")
        last_first = sql.SQL(f"{staging.PART_COLUMN} DESC, {staging.ORDER_COLUMN} DESC")
        conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, {} "
                             "ON CONFLICT ({}) {}").format(target, cols, keys, values, source, keys, last_first,
                                                           keys, action))


def _json_value(value: Any, kind: Any) -> Any:
    """An Arrow value (from ``to_pylist``) of type ``kind`` as JSON-able Python."""
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_map(kind):
        return {str(k): _json_value(v, kind.item_type) for k, v in value}
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [_json_value(v, kind.value_type) for v in value]
    if pa.types.is_struct(kind):
        return {field.name: _json_value(value.get(field.name), field.type) for field in kind}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return value


def _csv_ready(data: Any) -> Any:
    """``data`` with the columns PostgreSQL's CSV input cannot take as Arrow writes them turned into text."""
    import pyarrow as pa

    for index, field in enumerate(data.schema):
        kind = field.type
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            values = ["\\x" + bytes(v).hex() if v is not None else None for v in data.column(index).to_pylist()]
        elif pa.types.is_nested(kind):
            values = [None if v is None else json.dumps(_json_value(v, kind), default=str, ensure_ascii=False)
                      for v in data.column(index).to_pylist()]
        elif (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
              or pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_decimal(kind)
              or pa.types.is_timestamp(kind) or pa.types.is_date(kind)):
            continue
        else:
            values = [None if v is None else str(v) for v in data.column(index).to_pylist()]
        data = data.set_column(index, field.name, pa.array(values, pa.string()))
    return data
