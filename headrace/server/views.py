"""Queryable state over the REST API: a pipeline's views, read from its serving store
(``headrace/connectors/view_store.py``), never from a running operator.

Each answer says as of which batch and watermark. ``min_batch`` waits for the view to reach
that batch (read-your-writes) and answers 409 when it does not in time. ``changes`` follows a
view as server-sent events, one per batch that changed it, resumable by batch id. A view the
pipeline does not have (none in its store, none declared by the plan its driver recorded) is a
404 at once, whatever the request waits for.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from headrace.connectors.view_store import AsOf, ViewReader, store_path
from headrace.contract import END_OF_INPUT_MS
from headrace.environment.checkpoints import read_plan
from headrace.server.pipeline_dirs import pipeline_roots, run_dirs
from headrace.server.registry import Entry, Refused

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
DEFAULT_WAIT_S, MAX_WAIT_S = 10.0, 60.0
POLL_S = 0.1
FEED_POLL_S = 0.25
HEARTBEAT_S = 15.0  # a comment line this often on a quiet feed, so a gone client is noticed


def reader_of(entry: Entry) -> ViewReader:
    """The store of a server pipeline, in its run dir."""
    for folder in run_dirs(entry):
        if os.path.exists(store_path(folder)):
            return ViewReader(store_path(folder))
    return ViewReader("")


def declared_views(entry: Entry) -> list[str] | None:
    """The views the plan its driver recorded declares (its ``View`` sinks), None before a driver
    recorded one: then only the store tells which views there are."""
    for root in pipeline_roots(entry):
        plan = read_plan(root)
        if plan is not None:
            return sorted(node["name"] for node in plan.get("nodes", [])
                          if node.get("kind") == "sink" and (node.get("connector") or {}).get("type") == "View")
    return None


def _check_view(entry: Entry, reader: ViewReader, view: str) -> None:
    """404 for a view the pipeline does not have: not in its store and not declared by its recorded
    plan (a declared view appears in the store with its first batch)."""
    stored = [found.view for found in reader.views()] if reader.exists() else []
    declared = declared_views(entry)
    if view in stored or (declared is not None and view in declared):
        return
    if declared is None and not stored:
        return  # no driver recorded its plan yet: which views come is not known
    known = ", ".join(sorted({*stored, *(declared or [])})) or "none"
    raise Refused(404, f"pipeline {entry.name!r} has no view {view!r} (its views: {known})")


def views(entry: Entry) -> dict[str, Any]:
    return {"pipeline": entry.name, "views": [_as_of_fields(found) for found in reader_of(entry).views()]}


def lookup(entry: Entry, view: str, key: str, min_batch: int | None, wait_s: float) -> tuple[int, dict[str, Any]]:
    reader = _reached(entry, view, min_batch, wait_s)
    as_of, value = reader.lookup(view, key)
    answer = {**_as_of_fields(as_of), "key": key}
    if value is None:
        return 404, {"error": f"view {view!r} has no key {key!r} as of batch {as_of.batch_id}", **answer}
    return 200, {**answer, "value": value}


def scan(entry: Entry, view: str, prefix: str, cursor: str | None, limit: int, min_batch: int | None,
         wait_s: float) -> dict[str, Any]:
    reader = _reached(entry, view, min_batch, wait_s)
    as_of, rows = reader.scan(view, prefix, cursor, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return {**_as_of_fields(as_of), "prefix": prefix, "rows": [{"key": key, "value": value} for key, value in rows],
            "next_cursor": rows[-1][0] if more else None}


def changes(entry: Entry, view: str, after: int, until: int | None) -> Iterator[str]:
    """Server-sent events: for each batch past ``after`` that changed the view, one event (id: the
    batch id) with the rows changed since the last event, as they are now; ends after batch
    ``until`` when given; a client that leaves ends it (the server's next write fails: a quiet
    feed writes a comment line every ``HEARTBEAT_S``). An unknown view is refused (404) before
    the feed starts."""
    reader = reader_of(entry)
    _check_view(entry, reader, view)
    return _feed(entry, reader, view, after, until)


def _feed(entry: Entry, reader: ViewReader, view: str, after: int, until: int | None) -> Iterator[str]:
    quiet_since = time.monotonic()
    while True:
        reader = reader if reader.exists() else reader_of(entry)
        as_of = reader.as_of(view) if reader.exists() else None
        if as_of is not None and as_of.batch_id > after:
            as_of, rows = reader.changed_since(view, after)
            event = {**_as_of_fields(as_of), "rows": [{"key": key, "value": value} for key, value in rows]}
            yield _event(as_of.batch_id, event)
            after, quiet_since = as_of.batch_id, time.monotonic()
        if until is not None and after >= until:
            return
        if time.monotonic() - quiet_since > HEARTBEAT_S:
            yield ": still here\n\n"
            quiet_since = time.monotonic()
        time.sleep(FEED_POLL_S)


def _event(batch_id: int, data: dict[str, Any]) -> str:
    return f"id: {batch_id}\nevent: batch\ndata: {json.dumps(data)}\n\n"


def _reached(entry: Entry, view: str, min_batch: int | None, wait_s: float) -> ViewReader:
    """The pipeline's store once ``view`` holds ``min_batch`` (None: now); 404 for an unknown
    view, 409 when the batch is not reached within ``wait_s``."""
    deadline = time.monotonic() + (wait_s if min_batch is not None else 0.0)
    reader = reader_of(entry)
    _check_view(entry, reader, view)
    while True:
        reader = reader if reader.exists() else reader_of(entry)
        as_of = reader.as_of(view) if reader.exists() else None
        if as_of is not None and (min_batch is None or as_of.batch_id >= min_batch):
            return reader
        if time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    if as_of is None and min_batch is None:
        known = ", ".join(found.view for found in reader.views()) if reader.exists() else ""
        raise Refused(404, f"pipeline {entry.name!r} has no view {view!r} yet (its views so far: {known or 'none'}; "
                           "a view appears once its first batch is applied)")
    standing = f"is at batch {as_of.batch_id}" if as_of is not None else "has no batch yet"
    raise Refused(409, f"view {view!r} {standing}; batch {min_batch} was not reached in {wait_s:g} s")


def _as_of_fields(as_of: AsOf) -> dict[str, Any]:
    """The view's standing, with its watermark as text (``watermark_text``)."""
    return {**as_of.public(), "watermark": watermark_text(as_of.watermark_ms)}


def watermark_text(watermark_ms: int | None) -> str | None:
    """A watermark as text: an ISO time, "end of input" once a bounded input ended (its flush
    raised the watermark past every window), None before the first.

    >>> watermark_text(1_700_000_000_000), watermark_text(253402214400000), watermark_text(0)
    ('2023-11-14T22:13:20.000Z', 'end of input', None)
    """
    if watermark_ms is not None and watermark_ms >= END_OF_INPUT_MS:
        return "end of input"
    if not watermark_ms:
        return None
    moment = datetime.datetime.fromtimestamp(watermark_ms / 1000, datetime.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
