"""The end of an unbounded pipeline (``headrace run --drain``, ``headrace stop --drain``): one
micro-batch logged by hand in Spark's offset log, and the mark that nothing follows it.

Spark runs again, when a query starts, the micro-batch its offset log holds and its commit log
does not (a batch planned, then interrupted), with the offsets and the watermark logged for it.
A drain logs such a batch after the last committed one: the same offsets (it reads nothing new)
and the watermark at ``FLUSH_TIME_MS``, the one a bounded input's flush row brings. Running it
fires every open window and event-time timer, emits what outer joins and sessions hold, and
evicts every key's state, as at the end of a bounded input.

An entry of the offset log is a version line (``v1``), a JSON line of metadata
(``batchWatermarkMs``, ``batchTimestampMs``, the session's settings the checkpoint fixes), then
one line per source; only the watermark changes. A drained pipeline's root holds
``drained.json``: its checkpoint can only be forgotten (``--fresh``), as every later record
would be late.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from headrace.contract import END_OF_INPUT_MS, FLUSH_TIME_MS
from headrace.environment import storage
from headrace.environment.checkpoints import COMMITS, OFFSETS, WATERMARK_KEY, last_batch, offsets_entry
from headrace.errors import HeadraceError, IncompatibleCheckpoint

DRAINED_FILE = "drained.json"


def pending_end(checkpoint: str) -> int | None:
    """The batch id of a logged end-of-time batch that has not committed yet (a drain that was
    interrupted: its next start runs that batch), else None."""
    planned, committed = last_batch(checkpoint, OFFSETS), last_batch(checkpoint, COMMITS)
    if planned is None or (committed is not None and committed >= planned):
        return None
    metadata = _entry(checkpoint, planned)[1]
    return planned if int(metadata.get(WATERMARK_KEY, 0)) >= END_OF_INPUT_MS else None


def log_end(checkpoint: str) -> int | None:
    """Log the end-of-time batch after the last committed one and return its id; None when no
    batch has committed (there is nothing to end). A batch planned and not committed must not
    be there: the query that ends cleanly commits every batch it plans."""
    committed = last_batch(checkpoint, COMMITS)
    if committed is None:
        return None
    planned = last_batch(checkpoint, OFFSETS)
    if planned != committed:
        raise HeadraceError(f"cannot end the checkpoint {checkpoint}: its batch {planned} was planned and not "
                            f"committed; run the pipeline once more, then drain it")
    lines, metadata = _entry(checkpoint, committed)
    metadata[WATERMARK_KEY] = FLUSH_TIME_MS
    lines[1] = json.dumps(metadata, separators=(",", ":"))
    storage.write_text(storage.join(checkpoint, OFFSETS, str(committed + 1)), "\n".join(lines))
    return committed + 1


def _entry(checkpoint: str, batch: int) -> tuple[list[str], dict[str, Any]]:
    """An offset log entry's lines, and its metadata parsed; refused when it is not as documented."""
    try:
        lines, metadata = offsets_entry(checkpoint, batch)
        if WATERMARK_KEY not in metadata:
            raise ValueError("no watermark")
    except ValueError:
        path = storage.join(checkpoint, OFFSETS, str(batch))
        raise HeadraceError(f"cannot drain: Spark's offset log entry {path} is not a version line followed by "
                            f"metadata with {WATERMARK_KEY}") from None
    return lines, metadata


def mark_drained(root: str, batch: int) -> None:
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    storage.write_text(storage.join(root, DRAINED_FILE), json.dumps({"batch": batch, "at": at}) + "\n")


def refuse_drained(root: str, pipeline: str) -> None:
    """Raise when the pipeline under ``root`` was drained: its checkpoint ended for good."""
    try:
        drained = json.loads(storage.read_text(storage.join(root, DRAINED_FILE)))
    except FileNotFoundError:
        return
    raise IncompatibleCheckpoint(
        f"pipeline {pipeline!r} was drained at batch {drained.get('batch')} ({drained.get('at')}): every window "
        f"fired at the end of time, so every later record would be late; run it with --fresh to start over")
