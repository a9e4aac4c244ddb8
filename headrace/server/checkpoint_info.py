"""A server pipeline's checkpoint, for ``GET /api/pipelines/{name}/checkpoints`` and the web UI's
checkpoints tab: its committed micro-batches, newest first, and what the checkpoint holds.

A batch is committed once Spark has written ``<checkpoint>/commits/<batch id>``; its entry in
``offsets/`` holds the watermark it ran with and its number of state partitions. How long it took
and the rows it read come from the driver's progress file (``progress.jsonl``, read by
``headrace/server/metrics.py``): a batch without a report there (one committed in the instant
before its driver was killed, or a rescale's batch, which reads no input) has neither. Spark keeps
the files of the last 100 batches (``spark.sql.streaming.minBatchesToRetain``), so older batches
are counted but not listed.

Each stateful operator keeps its state under ``state/<operator id>/<partition>/``, a RocksDB
store per partition whose files Spark uploads there (the changes of each batch, and snapshots).
Their bytes on disk, partition by partition, show how evenly the keys spread: a partition far
above the median holds hot keys (skew). Spark's ``state/<operator id>/_metadata/metadata`` names
the operator and its number of partitions.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter
from typing import Any

from headrace.environment.checkpoints import (
    COMMITS,
    WATERMARK_KEY,
    batch_ids,
    batch_metadata,
    read_state_operators,
    state_partitions_of,
)
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
    files = file_sizes(checkpoint) if checkpoint else {}  # one walk of the checkpoint for every size below
    by_batch = {report["batch"]: report for report in reports}
    last_report = by_batch[max(by_batch)] if by_batch else {}
    return {
        "pipeline": entry.name, "checkpoint": checkpoint,
        "committed_batches": committed[-1] + 1 if committed else 0,  # batch ids count from 0, one after another
        "last_committed": committed[-1] if committed else None,
        "retained_batches": len(committed),
        "size_bytes": sum(files.values()),
        "state_size_bytes": sum(size for parts, size in files.items() if parts[0] == "state"),
        "state_operators": last_report.get("state_operators", []),
        "state_on_disk": state_on_disk(os.path.join(checkpoint, "state"), files,
                                       read_state_operators(os.path.dirname(checkpoint))) if checkpoint else [],
        "batches": [_batch(checkpoint, batch, by_batch.get(batch, {})) for batch in committed[::-1][:limit]]
        if checkpoint else [],
    }


def state_on_disk(state: str, files: dict[tuple[str, ...], int], steps: dict[int, str]) -> list[dict[str, Any]]:
    """Each stateful operator's state files, by operator id: Spark's name for the operator, the step
    it belongs to (``steps``, as its driver noted it; None when not known), the bytes of each of
    its partitions (index = partition; from ``files``, the checkpoint's, not counting the schema
    Spark writes beside a partition's state) and their skew, the largest over the median (None
    while the median partition holds nothing)."""
    try:
        operators = sorted(int(name) for name in os.listdir(state) if name.isdigit())
    except FileNotFoundError:
        return []
    partition_bytes: Counter[tuple[str, str]] = Counter()
    for parts, size in files.items():
        if len(parts) >= 4 and parts[0] == "state" and parts[3] != "_metadata":
            partition_bytes[parts[1], parts[2]] += size
    found = []
    for operator in operators:
        folder = os.path.join(state, str(operator))
        try:
            partitions = sorted(int(n) for n in os.listdir(folder) if n.isdigit())
        except FileNotFoundError:  # a rescale rewrote the state meanwhile
            continue
        name, count = _operator_metadata(folder)
        count = max([count or 0, *(p + 1 for p in partitions)])
        sizes = [partition_bytes[str(operator), str(p)] for p in range(count)]
        median = statistics.median(sizes) if sizes else 0
        found.append({"operator_id": operator, "operator": name, "step": steps.get(operator), "partition_bytes": sizes,
                      "skew": round(max(sizes) / median, 2) if median else None})
    return found


def _operator_metadata(folder: str) -> tuple[str | None, int | None]:
    """Spark's name for the operator and its number of partitions, from its metadata (None, None when
    it has none, or none headrace can read)."""
    try:
        with open(os.path.join(folder, "_metadata", "metadata"), encoding="utf-8") as handle:
            metadata = json.loads(handle.read().splitlines()[1])
        stores = metadata.get("stateStoreInfo") or [{}]
        return metadata["operatorInfo"]["operatorName"], int(stores[0]["numPartitions"])
    except (OSError, IndexError, KeyError, TypeError, ValueError):
        return None, None


def file_sizes(folder: str) -> dict[tuple[str, ...], int]:
    """The size of each file under ``folder``, by its path's parts below it ({} when there is no
    folder); a file Spark deletes meanwhile is left out."""
    sizes = {}
    for parent, _, names in os.walk(folder):
        below = os.path.relpath(parent, folder).split(os.sep)
        below = [] if below == ["."] else below
        for name in names:
            try:
                sizes[(*below, name)] = os.lstat(os.path.join(parent, name)).st_size
            except FileNotFoundError:
                pass
    return sizes


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
