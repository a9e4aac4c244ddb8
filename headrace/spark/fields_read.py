"""Which of the fields a source converts and checks (``SourceConnector.checked_fields``: a
``Files`` source's timestamps and dates, read as text) the pipeline's query reads.

Checking a field costs every row its conversion, although Spark prunes a field no step reads.
So the compiler first lowers the plan as a probe: each such conversion is marked with its own
number (``files_native.probe_mark``) and nothing is checked. Spark's optimizer then prunes what
no step reads, and the marks left in the optimized plans name the fields read. The query is
lowered again, checking those only: a record whose unread timestamp would not convert is no
dead letter, as a record whose unread number would not parse never was.
"""

from __future__ import annotations

from typing import Any

from headrace.connectors.files_native import probe_mark
from headrace.plan.graph import Plan
from headrace.plan.nodes import SourceNode


def sources_with_checked_fields(plan: Plan) -> dict[str, tuple[str, ...]]:
    """The checked fields of each source that has some."""
    sources = (n for n in plan.nodes.values() if isinstance(n, SourceNode))
    return {s.name: fields for s in sources if (fields := s.connector.checked_fields())}


def checked_fields_read(plan: Plan, spark: Any, frames: list[Any]) -> dict[str, frozenset[str]] | None:
    """By source, the checked fields whose marked conversion is left in the optimized plan of any
    of ``frames`` (a probe's); None (check them all) when two marks are the same number."""
    marks = {(source, field): str(probe_mark(source, field))
             for source, fields in sources_with_checked_fields(plan).items() for field in fields}
    if len(set(marks.values())) < len(marks):
        return None
    optimizer = spark._jsparkSession.sessionState().optimizer()
    plans = [optimizer.execute(frame._jdf.queryExecution().analyzed()).toString() for frame in frames]
    read: dict[str, set[str]] = {source: set() for source, _ in marks}
    for (source, field), mark in marks.items():
        if any(mark in text for text in plans):
            read[source].add(field)
    return {source: frozenset(fields) for source, fields in read.items()}
