"""What readers read, moved atomically between versions of a pipeline's output (``headrace
switch``, docs/backfill.md), and a Lambda serving view.

A second version of a pipeline writes its own output beside the first (its own PostgreSQL
table, its own folder), reprocessing the history (``--backfill``) while readers still read the
first through a name that points at it: a PostgreSQL view, or a symbolic link to a folder.
Switching re-points that name in one step:

* a view is dropped and created again over the new table in one transaction (PostgreSQL's DDL
  is transactional): a reader sees the old table or the new one, never neither;
* a link is replaced by ``rename`` of a new link over it (atomic on POSIX file systems).

A Lambda serving view merges a batch view (history, up to a cut-off time) with a live view
(from the cut-off on), for users who keep both layers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from headrace.connectors.postgres import psycopg_module
from headrace.errors import SetupError


@dataclass(frozen=True)
class Switched:
    name: str  # the view or link readers read
    target: str  # what it points at now
    previous: str | None  # what it pointed at before (None: it is new)


def _relation_kind(conn: Any, name: str) -> str | None:
    """'view', 'table' (any other relation) or None, for a possibly schema-qualified name."""
    row = conn.execute("SELECT c.relkind FROM pg_class c WHERE c.oid = to_regclass(%s)", (name,)).fetchone()
    return None if row is None else ("view" if row[0] == "v" else "table")


def _view_target(conn: Any, view: str) -> str | None:
    """The one relation a view made by ``switch_view`` reads, if it is such a view."""
    schema, _, name = view.rpartition(".")
    rows = conn.execute("SELECT DISTINCT u.table_schema, u.table_name FROM information_schema.view_table_usage u "
                        "WHERE u.view_name = %s AND u.view_schema = COALESCE(NULLIF(%s, ''), current_schema())",
                        (name, schema)).fetchall()
    return f"{rows[0][0]}.{rows[0][1]}" if len(rows) == 1 else None


def _qualified(sql: Any, name: str) -> Any:
    return sql.Identifier(*name.split("."))


def switch_view(dsn: str, view: str, table: str) -> Switched:
    """Point the PostgreSQL view ``view`` at ``table`` (``SELECT * FROM table``), atomically."""
    psycopg = psycopg_module("headrace switch")
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        if _relation_kind(conn, table) is None:
            raise SetupError(f"switch: there is no table {table!r} to point {view!r} at")
        kind = _relation_kind(conn, view)
        if kind == "table":
            raise SetupError(f"switch: {view!r} is a table, not a view; readers must read a view to be switched: "
                             f"rename the table (it can be the first version) and switch {view!r} to it")
        previous = _view_target(conn, view) if kind == "view" else None
        with conn.transaction():
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(_qualified(sql, view)))
            conn.execute(sql.SQL("CREATE VIEW {} AS SELECT * FROM {}").format(_qualified(sql, view),
                                                                             _qualified(sql, table)))
    return Switched(view, table, previous)


def switch_link(link: str, target: str) -> Switched:
    """Point the symbolic link ``link`` at the folder ``target``, atomically."""
    if not os.path.isdir(target):
        raise SetupError(f"switch: there is no folder {target!r} to point {link!r} at")
    if os.path.exists(link) and not os.path.islink(link):
        raise SetupError(f"switch: {link!r} is a folder, not a link; readers must read a link to be switched: "
                         f"rename the folder (it can be the first version) and switch {link!r} to it")
    previous = os.readlink(link) if os.path.islink(link) else None
    fresh = f"{link}.switching-{os.getpid()}"
    if os.path.lexists(fresh):
        os.unlink(fresh)
    os.symlink(os.path.abspath(target), fresh)
    os.replace(fresh, link)
    return Switched(link, os.path.abspath(target), previous)


def lambda_view(dsn: str, view: str, batch: str, live: str, time_column: str, cutoff: str) -> Switched:
    """A serving view over a batch layer and a speed layer: the rows of ``batch`` before
    ``cutoff`` and those of ``live`` from it on (by ``time_column``); replaced atomically, so a
    new cut-off (a newer batch view) takes over in one step."""
    psycopg = psycopg_module("headrace switch")
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        columns = {}
        for table in (batch, live):
            if _relation_kind(conn, table) is None:
                raise SetupError(f"switch: there is no table {table!r} for the serving view {view!r}")
            found = conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                                 "AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()
            columns[table] = [r[0] for r in found]
        if columns[batch] != columns[live]:
            raise SetupError(f"switch: the batch table {batch!r} has the columns {', '.join(columns[batch])} and the "
                             f"live table {live!r} {', '.join(columns[live])}: a serving view needs the same ones")
        if time_column not in columns[batch]:
            raise SetupError(f"switch: {batch!r} has no column {time_column!r} (it has {', '.join(columns[batch])})")
        if _relation_kind(conn, view) == "table":
            raise SetupError(f"switch: {view!r} is a table, not a view")
        query = sql.SQL("CREATE VIEW {view} AS SELECT * FROM {batch} WHERE {time} < CAST({cutoff} AS timestamptz) "
                        "UNION ALL SELECT * FROM {live} WHERE {time} >= CAST({cutoff} AS timestamptz)").format(
            view=_qualified(sql, view), batch=_qualified(sql, batch), live=_qualified(sql, live),
            time=sql.Identifier(time_column), cutoff=sql.Literal(cutoff))
        with conn.transaction():
            conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(_qualified(sql, view)))
            try:
                conn.execute(query)
            except psycopg.Error as exc:
                raise SetupError(f"switch: cannot make the serving view {view!r}: {exc}".strip()) from None
    return Switched(view, f"{batch} before {cutoff}, {live} from it on", None)
