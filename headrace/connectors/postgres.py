"""A PostgreSQL sink: each batch's rows and its batch id are committed in one transaction.

The commit table ``headrace_sink_commits(sink, batch_id, committed_at)``
records every batch a sink has committed; the rows of a batch and its record
are written in the same transaction, and a batch whose record exists is
skipped (the claim of its batch id inside the transaction makes sure of it), so
a batch Spark replays after a failure adds nothing. Rows are
loaded with ``COPY`` into a temporary table and moved into the target with one
``INSERT ... SELECT`` (``ON CONFLICT (key) DO UPDATE`` when a key is given).
"""

from __future__ import annotations

import copy
import io
import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from headrace.connectors.base import Guarantee, SinkConnector, run_batch
from headrace.errors import PlanError, SetupError, SinkError
from headrace.schema import TYPE_ALIASES

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
COMMIT_TABLE = "headrace_sink_commits"
CONNECT_TIMEOUT_S = 10
COPY_CHUNK_ROWS = 65_536

# Column type -> PostgreSQL column type: headrace's canonical type names (headrace.schema),
# then the other Spark types a sink may be given, by their DataType.typeName().
PG_TYPES = {
    "string": "text", "long": "bigint", "int": "integer", "double": "double precision", "float": "real",
    "boolean": "boolean", "timestamp": "timestamptz", "date": "date", "binary": "bytea",
    "varchar": "text", "char": "text", "short": "smallint", "byte": "smallint", "timestamp_ntz": "timestamp",
    "struct": "jsonb", "array": "jsonb", "map": "jsonb",
}


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise SetupError("the Postgres sink needs psycopg 3: pip install 'psycopg[binary]'") from None
    return psycopg


def redact_dsn(dsn: str) -> str:
    """``dsn`` without its password, fit for an error message.

    >>> redact_dsn("postgresql://app:secret@db:5432/shop?sslmode=require&password=x")
    'postgresql://app@db:5432/shop?sslmode=require'
    >>> redact_dsn("host=db user=app password=secret dbname=shop")
    'host=db user=app dbname=shop'
    """
    if "://" in dsn:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            netloc = f"{userinfo.split(':', 1)[0]}@{host}"
        query = "&".join(p for p in parts.query.split("&") if p and not p.lower().startswith("password="))
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return re.sub(r"\s*\bpassword\s*=\s*('(?:[^'\\]|\\.)*'|\S*)", "", dsn).strip()


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _table_parts(table: str) -> tuple[str, ...]:
    return tuple(table.split("."))


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
      structs, arrays and maps ``jsonb``...) with ``key`` as primary key.

    **Identity.** A sink's commits are recorded under its *sink name* in
    ``headrace_sink_commits``. The compiler gives the sink the name of its step
    with ``sink.bind(step_name)``, which returns a configured copy; the name
    can also be given as ``name=``. An unbound sink is named after its table.
    The name must stay the same across restarts from a checkpoint (Spark
    replays batch ids from there), and a new checkpoint needs a new name or
    cleared commit records, since batch ids start again at 0.
    """

    guarantee = Guarantee.EXACTLY_ONCE
    native_format = None

    def __init__(self, table: str, dsn: str = DEFAULT_DSN, key: str | Sequence[str] | None = None,
                 create_table: bool = True, *, name: str | None = None):
        if not isinstance(table, str) or not table.strip() or any(not p for p in _table_parts(table)):
            raise PlanError(f"Postgres sink: table must be a name like 'events' or 'shop.events', got {table!r}")
        where = f"Postgres sink for table {table!r}"
        if not isinstance(dsn, str) or not dsn.strip():
            raise PlanError(f"{where}: dsn must be a connection string, got {dsn!r}")
        if key is None:
            keys: tuple[str, ...] = ()
        elif isinstance(key, str):
            keys = (key,)
        elif isinstance(key, Sequence) and key and all(isinstance(k, str) and k for k in key):
            keys = tuple(key)
        else:
            raise PlanError(f"{where}: key must be a column name or a list of column names, got {key!r}")
        if len(set(keys)) != len(keys):
            raise PlanError(f"{where}: key {list(keys)} names a column twice")
        if name is not None and (not isinstance(name, str) or not name):
            raise PlanError(f"{where}: name must be a non-empty string, got {name!r}")
        self.table = table
        self.dsn = dsn
        self.key = keys
        self.create_table = bool(create_table)
        self._name = name
        self._conn: Any = None
        self._commit_table_ready = False

    # -- identity -----------------------------------------------------------

    @property
    def name(self) -> str:
        """The sink's identity in the commit table: its step name once bound, else its table."""
        return self._name or self.table

    def bind(self, step_name: str) -> Postgres:
        """A copy of this sink that records its commits under ``step_name``."""
        if not isinstance(step_name, str) or not step_name:
            raise PlanError(f"Postgres sink for table {self.table!r}: step name must be a non-empty string")
        bound = copy.copy(self)
        bound._name = step_name
        bound._conn = None
        bound._commit_table_ready = False
        return bound

    def describe(self) -> dict[str, Any]:
        return {"type": "Postgres", "name": self.name, "table": self.table, "dsn": redact_dsn(self.dsn),
                "key": list(self.key) or None, "create_table": self.create_table}

    def __repr__(self) -> str:
        return (f"Postgres({self.table!r}, dsn={redact_dsn(self.dsn)!r}, key={list(self.key) or None!r}, "
                f"create_table={self.create_table!r}, name={self.name!r})")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_conn"] = None
        state["_commit_table_ready"] = False
        return state

    def _where(self) -> str:
        return f"sink {self.name!r} (PostgreSQL table {self.table!r})"

    # -- connection ---------------------------------------------------------

    def _connect(self) -> Any:
        psycopg = _psycopg()
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._conn = None
        self._commit_table_ready = False
        extra: dict[str, Any] = {}
        try:
            if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(self.dsn):
                extra["connect_timeout"] = CONNECT_TIMEOUT_S
        except psycopg.Error as exc:
            raise SinkError(f"{self._where()}: the DSN {redact_dsn(self.dsn)!r} is not valid: "
                            f"{_one_line(exc)}") from None
        try:
            conn = psycopg.connect(self.dsn, autocommit=True, **extra)
        except psycopg.Error as exc:
            raise SinkError(f"{self._where()}: cannot connect to PostgreSQL at {redact_dsn(self.dsn)}: "
                            f"{_one_line(exc)}; check that the server is running and the DSN is right") from None
        self._conn = conn
        return conn

    def close(self) -> None:
        """Close the connection the sink keeps between batches."""
        conn, self._conn = self._conn, None
        self._commit_table_ready = False
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a dead connection must not fail
                pass

    def _ensure_commit_table(self, conn: Any) -> None:
        if self._commit_table_ready:
            return
        psycopg = _psycopg()
        try:
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {COMMIT_TABLE} ("
                "sink text NOT NULL, batch_id bigint NOT NULL, "
                "committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (sink, batch_id))")
        except psycopg.errors.UniqueViolation:
            pass  # another sink created it at the same moment
        self._commit_table_ready = True

    def prepare(self, run_dir: str) -> None:
        """Connect and create the commit table before the query starts, so errors show early."""
        psycopg = _psycopg()
        conn = self._connect()
        try:
            self._ensure_commit_table(conn)
        except psycopg.Error as exc:
            raise SinkError(f"{self._where()}: cannot create the commit table {COMMIT_TABLE}: "
                            f"{_one_line(exc)}") from None

    def is_committed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` of this sink is recorded in the commit table."""
        psycopg = _psycopg()
        reused = self._conn is not None
        try:
            try:
                row = self._read_commit(batch_id)
            except psycopg.OperationalError:
                if not reused:
                    raise
                self.close()  # the kept connection went away (server restart, idle timeout): retry once
                row = self._read_commit(batch_id)
        except psycopg.Error as exc:
            raise SinkError(f"{self._where()}: cannot read the commit table {COMMIT_TABLE}: "
                            f"{_one_line(exc)}") from None
        return row is not None

    def _read_commit(self, batch_id: int) -> Any:
        conn = self._connect()
        self._ensure_commit_table(conn)
        return conn.execute(f"SELECT 1 FROM {COMMIT_TABLE} WHERE sink = %s AND batch_id = %s",
                            (self.name, batch_id)).fetchone()

    # -- writing ------------------------------------------------------------

    def committed(self, batch_id: int) -> bool:
        return self.is_committed(batch_id)

    def write_batch(self, df: Any, batch_id: int) -> None:
        columns = list(df.columns)
        self._check_columns(columns)
        if self.is_committed(batch_id):  # (the dispatcher asks committed() first; this is for direct calls)
            run_batch(df)  # a replay: write nothing, but read the batch, as Spark needs to commit its state
            return
        schema = df.schema
        data = df.toArrow()
        psycopg = _psycopg()
        conn = self._connect()
        try:
            with conn.transaction():
                claimed = conn.execute(
                    f"INSERT INTO {COMMIT_TABLE} (sink, batch_id) VALUES (%s, %s) "
                    "ON CONFLICT DO NOTHING RETURNING batch_id", (self.name, batch_id)).fetchone()
                if claimed is None:
                    raise psycopg.Rollback()  # committed before (a replay) or meanwhile by another attempt
                if self.create_table:
                    self._create_table(conn, schema)
                self._check_target(conn, columns)
                if data.num_rows:
                    self._load(conn, columns, data)
        except SinkError:
            raise
        except psycopg.errors.InvalidColumnReference as exc:
            raise SinkError(f"{self._where()}: batch {batch_id}: the table has no primary key or unique "
                            f"index on {list(self.key)} ({_one_line(exc)}); add one or change key=") from None
        except psycopg.Error as exc:
            raise SinkError(f"{self._where()}: cannot write batch {batch_id}: {_one_line(exc)}") from None

    def _check_columns(self, columns: list[str]) -> None:
        if len(set(columns)) != len(columns):
            twice = sorted({c for c in columns if columns.count(c) > 1})
            raise SinkError(f"{self._where()}: the stream has columns named twice: {twice}; rename them")
        missing = [k for k in self.key if k not in columns]
        if missing:
            raise SinkError(f"{self._where()}: key column(s) {missing} are not in the stream's columns "
                            f"{columns}; fix key= or add the columns")

    def _create_table(self, conn: Any, schema: Any) -> None:
        from psycopg import sql

        definitions = []
        for field in schema.fields:
            column_type = pg_type(field.dataType)
            if column_type is None:
                raise SinkError(f"{self._where()}: column {field.name!r} has Spark type "
                                f"{field.dataType.simpleString()}, which has no PostgreSQL column type here; "
                                "cast it to a string or create the table yourself")
            definitions.append(sql.SQL("{} {}").format(sql.Identifier(field.name), sql.SQL(column_type)))
        if self.key:
            definitions.append(sql.SQL("PRIMARY KEY ({})").format(
                sql.SQL(", ").join(sql.Identifier(k) for k in self.key)))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            sql.Identifier(*_table_parts(self.table)), sql.SQL(", ").join(definitions)))

    def _check_target(self, conn: Any, columns: list[str]) -> None:
        psycopg = _psycopg()
        from psycopg import sql

        try:
            with conn.transaction():
                cursor = conn.execute(sql.SQL("SELECT * FROM {} LIMIT 0").format(
                    sql.Identifier(*_table_parts(self.table))))
        except psycopg.errors.UndefinedTable:
            raise SinkError(f"{self._where()}: the table does not exist; create it or pass "
                            "create_table=True") from None
        existing = [d.name for d in cursor.description or ()]
        unknown = [c for c in columns if c not in existing]
        if unknown:
            raise SinkError(f"{self._where()}: the table has no column(s) {unknown} (it has {existing}); "
                            "add them to the table or drop them from the stream")

    def _load(self, conn: Any, columns: list[str], data: Any) -> None:
        import pyarrow as pa
        import pyarrow.csv as pa_csv
        from psycopg import sql

        stage = sql.Identifier("_hr_stage")
        target = sql.Identifier(*_table_parts(self.table))
        cols = sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        conn.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {}, 0::bigint AS _hr_ord "
                             "FROM {} WITH NO DATA").format(stage, cols, target))
        table = _csv_ready(data).append_column("_hr_ord", pa.array(range(data.num_rows), pa.int64()))
        options = pa_csv.WriteOptions(include_header=False)
        with conn.cursor() as cursor, cursor.copy(sql.SQL("COPY {} ({}, _hr_ord) FROM STDIN (FORMAT csv)")
                                                  .format(stage, cols)) as copy_in:
            for chunk in table.to_batches(max_chunksize=COPY_CHUNK_ROWS):
                buffer = io.BytesIO()
                pa_csv.write_csv(chunk, buffer, options)
                copy_in.write(buffer.getbuffer())
        if not self.key:
            conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY _hr_ord")
                         .format(target, cols, cols, stage))
            return
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.key)
        others = [c for c in columns if c not in self.key]
        action: Any
        if others:
            action = sql.SQL("DO UPDATE SET {}").format(sql.SQL(", ").join(
                sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c)) for c in others))
        else:
            action = sql.SQL("DO NOTHING")
        conn.execute(sql.SQL("INSERT INTO {} ({}) SELECT DISTINCT ON ({}) {} FROM {} ORDER BY {}, _hr_ord DESC "
                             "ON CONFLICT ({}) {}").format(target, cols, keys, cols, stage, keys, keys, action))


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
