"""Helpers the connectors share: counting dead letters, running a batch no sink reads, a sink
named after its step, a sink's column arguments (keys, partition columns) and checking them against
the stream's columns, the stop and exhausted files of a running source, the Spark schema of a
Python data source and a server address fit for a message. The contract itself (control rows,
guarantees, the connector base classes) is ``headrace/contract.py``; the names a connector's
author imports from here are re-exported."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Sequence
from typing import Any, Self
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa

from headrace.contract import (
    CONTROL_COLUMN,
    DEAD_COLUMNS,
    DEAD_LETTER_METRIC_PREFIX,
    FLUSH_TIME_MS,
    FLUSHED,
    RECORDS_FIELD,
    Guarantee,
    SinkConnector,
    SourceConnector,
    SourceContext,
)
from headrace.errors import PlanError, SinkError
from headrace.schema import Schema, to_ddl
from headrace.sink_step import SinkStep, step_name

__all__ = ["CONTROL_COLUMN", "DEAD_COLUMNS", "FLUSH_TIME_MS", "Guarantee", "SinkConnector", "SourceConnector",
           "SourceContext", "StepSink", "check_sink_columns", "column_names", "count_dead_letters", "mark_exhausted",
           "missing_columns", "redact_dsn", "run_batch", "spark_schema", "stop_requested"]


def count_dead_letters(frame: Any, source: str, is_dead: Any, control: Any = None, records: Any = None) -> Any:
    """``frame`` with the rows where the column ``is_dead`` holds counted as ``source``'s dead
    letters, in the observed metric progress reads (``headrace/runtime/progress.py``), the
    non-null values of ``control`` (when given) as its control rows, and ``records`` (a
    ``record_count``, when given) beside them."""
    from pyspark.sql import functions as F

    counts = [F.count(F.when(is_dead, 1)).alias("dead_letters")]
    if control is not None:
        counts.append(F.count(control).alias("control_rows"))
    if records is not None:
        counts.append(records)
    return frame.observe(f"{DEAD_LETTER_METRIC_PREFIX}{source}", *counts)


def record_count(control: Any = None) -> Any:
    """The aggregate that counts a source's records in its observed metric: its rows but the
    control rows (those where ``control``, when given, holds a value). Dead letters are records
    the source read, as a single source's input rows count them."""
    from pyspark.sql import functions as F

    return (F.count(F.lit(1)) if control is None else F.count(F.when(control.isNull(), 1))).alias(RECORDS_FIELD)


def run_batch(df: Any) -> None:
    """Run a micro-batch's DataFrame to its end and discard its rows (Spark's ``noop`` writer),
    so that its stateful operators commit their state although no sink reads it."""
    df.write.format("noop").mode("overwrite").save()


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


class StepSink(SinkConnector):
    """A sink that names itself, in its messages and its commits, after the sink step it is bound
    to: ``bind`` gives a copy under the step's identity (``headrace/spark/writer.py``), without the
    connection state (``_reset``) that only the original's process may use."""

    _name: str | None = None
    _step: SinkStep | None = None

    @property
    def name(self) -> str:
        raise NotImplementedError

    def bind(self, identity: str, defined_at: str = "") -> Self:
        """A copy of this sink committing under ``identity`` (see ``headrace/spark/writer.py``)."""
        bound = copy.copy(self)
        bound._name, bound._step = identity, SinkStep(step_name(identity), defined_at)
        bound._reset()
        return bound

    def _reset(self) -> None:
        """Drop the connection state a copy must not share (none here)."""

    def _where(self) -> str:
        """``sink 'totals' (app.py:14)``: how every message of this sink begins (before ``bind``, the
        sink's own name)."""
        return str(self._step or SinkStep(step_name(self.name)))


def column_names(value: str | Sequence[str] | None, argument: str, where: str) -> tuple[str, ...]:
    """A sink's ``argument`` (``key``, ``partition_by``) given as a column name or a list of them,
    as a tuple (None: none); an empty list, a name given twice or anything else is refused.

    >>> column_names("user", "key", "sink"), column_names(["day", "user"], "key", "sink")
    (('user',), ('day', 'user'))
    """
    if value is None:
        return ()
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, Sequence) else None
    if names == ():
        raise PlanError(f"{where}: {argument}=[] names no column; give one or more column names, or leave "
                        f"{argument} out")
    if names is None or not all(isinstance(n, str) and n for n in names):
        raise PlanError(f"{where}: {argument} must be a column name or a list of column names, got {value!r}")
    if len(set(names)) != len(names):
        raise PlanError(f"{where}: {argument} {list(names)} names a column twice")
    return names


def missing_columns(columns: Sequence[str], wanted: Sequence[str], argument: str) -> str | None:
    """What is wrong when the columns ``argument`` names (``wanted``) are not all among the
    stream's ``columns``, or None.

    >>> missing_columns(["user", "n"], ["day"], "key")
    "key column(s) ['day'] are not in the stream's columns ['user', 'n']; fix key= or add the columns"
    """
    missing = [c for c in wanted if c not in columns]
    if not missing:
        return None
    return (f"{argument} column(s) {missing} are not in the stream's columns {list(columns)}; fix {argument}= or "
            "add the columns")


def check_sink_columns(where: str, columns: list[str], key: Sequence[str]) -> None:
    """Refuse a stream, bound for a sink keyed by ``key``, whose ``columns`` name one twice or lack
    a key column."""
    if len(set(columns)) != len(columns):
        twice = sorted({c for c in columns if columns.count(c) > 1})
        raise SinkError(f"{where}: the stream has columns named twice: {twice}; rename them")
    problem = missing_columns(columns, key, "key")
    if problem:
        raise SinkError(f"{where}: {problem}")


# Helpers shared by the Python data sources (they run in Spark's Python workers).

def spark_schema(schema: Schema, dead_letters: bool) -> str:
    """The DDL of the columns a source's ``read`` yields (``batch_schema``), for ``DataSource.schema``."""
    columns = [*schema, (CONTROL_COLUMN, "long")]
    if dead_letters:
        columns.extend((name, "string") for name in DEAD_COLUMNS)
    return to_ddl(tuple(columns))


def stop_requested(options: dict[str, str]) -> bool:
    run_dir = options.get("hr_run_dir") or ""
    return bool(run_dir) and os.path.exists(os.path.join(run_dir, "stop"))


def flush_batch(schema: pa.Schema) -> pa.RecordBatch:
    """One control row: every other column null, ``_hr_ctl`` = FLUSH_TIME_MS."""
    arrays = [
        pa.array([FLUSH_TIME_MS], pa.int64()) if field.name == CONTROL_COLUMN else pa.nulls(1, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class ExhaustedMark:
    """Writes a bounded source's exhausted marker (``mark_exhausted``) the first time it is called."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options, self.written = options, False

    def __call__(self) -> None:
        if not self.written:
            mark_exhausted(self.options)
            self.written = True

    def past_flush(self, offset: dict) -> bool:
        """Whether ``offset`` is past the source's flush row (its input has ended, so ``latestOffset``
        hands out nothing more); the marker is then written."""
        if offset.get(FLUSHED):
            self()
            return True
        return False


def mark_exhausted(options: dict[str, str]) -> None:
    run_dir, name = options.get("hr_run_dir") or "", options.get("hr_source") or ""
    if not run_dir or not name:
        return
    folder = os.path.join(run_dir, "exhausted")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as marker:
        marker.write("done\n")


def write_atomically(path: str, data: bytes) -> None:
    """Write ``path`` whole or not at all (a hidden temporary file renamed into place), durably."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.tmp")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
