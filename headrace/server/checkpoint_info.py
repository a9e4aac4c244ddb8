"""A server pipeline's checkpoint, for ``GET /api/pipelines/{name}/checkpoints`` and the web UI's
checkpoints tab: its committed micro-batches, newest first, and what the checkpoint holds.

A batch is committed once Spark has written ``<checkpoint>/commits/<batch id>``; its entry in
``offsets/`` holds the watermark it ran with and its number of state partitions. How long it took
and the rows it read come from the driver's progress file (``progress.jsonl``, read by
``headrace/server/metrics.py``): a batch without a report there (one committed in the instant
before its driver was killed, or a rescale's batch, which reads no input) has neither. Spark keeps
the files of the last 100 batches (``spark.sql.streaming.minBatchesToRetain``), so older batches
are counted but not listed.
"""

from __future__ import annotations

import os
from typing import Any

from headrace.environment.checkpoints import COMMITS, WATERMARK_KEY, batch_ids, batch_metadata, state_partitions_of
from headrace.server.pipeline_dirs import pipeline_roots
from headrace.server.registry import Entry
from headrace.server.views import watermark_text

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000


def checkpoint_dir(entry: Entry) -> str | None:
    """The pipeline's checkpoint directory, None before its first driver made one."""
    roots = pipeline_roots(entry)
    return os.path.join(roots[0], "checkpoint") if roots else None


def checkpoints(entry: Entry, reports: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """The checkpoint's committed batches, newest first (at most ``limit``), with its location, its
    size on disk and its stateful operators as the last report gives them; ``reports``: the
    progress file's figures of the recent batches."""
    checkpoint = checkpoint_dir(entry)
    committed = batch_ids(checkpoint, COMMITS) if checkpoint else []
    by_batch = {report["batch"]: report for report in reports}
    last_report = by_batch[max(by_batch)] if by_batch else {}
    return {
        "pipeline": entry.name, "checkpoint": checkpoint,
        "committed_batches": committed[-1] + 1 if committed else 0,  # batch ids count from 0, one after another
        "last_committed": committed[-1] if committed else None,
        "retained_batches": len(committed),
        "size_bytes": disk_usage(checkpoint) if checkpoint else 0,
        "state_size_bytes": disk_usage(os.path.join(checkpoint, "state")) if checkpoint else 0,
        "state_operators": last_report.get("state_operators", []),
        "batches": [_batch(checkpoint, batch, by_batch.get(batch, {})) for batch in committed[::-1][:limit]]
        if checkpoint else [],
    }


def disk_usage(folder: str) -> int:
    """The bytes of the files under ``folder`` (0 when there is none); a file Spark deletes meanwhile
    counts nothing."""
    total = 0
    for parent, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                pass
    return total


def _batch(checkpoint: str, batch: int, report: dict[str, Any]) -> dict[str, Any]:
    try:
        committed_at: float | None = round(os.path.getmtime(os.path.join(checkpoint, COMMITS, str(batch))), 3)
    except FileNotFoundError:  # Spark dropped it meanwhile (it keeps the last batches' files only)
        committed_at = None
    metadata = batch_metadata(checkpoint, batch)
    watermark_ms = metadata.get(WATERMARK_KEY)
    return {"batch": batch, "committed_at": committed_at, "duration_ms": report.get("batch_ms"),
            "input_rows": report.get("input_rows"), "watermark_ms": watermark_ms,
            "watermark": watermark_text(watermark_ms),
            "state_partitions": state_partitions_of(metadata)}
