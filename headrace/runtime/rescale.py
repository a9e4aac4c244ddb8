"""Rescale a stopped pipeline: change the number of partitions its keyed state is spread over.

Keyed state lives under its key (DESIGN.md), and Spark places keys in state partitions by
a hash of the key modulo the number of partitions, fixed when the checkpoint was created.
Spark 4.2+ rewrites a stopped query's state into another number of partitions offline
(``StreamingCheckpointManager.repartition``): it adds one batch to the checkpoint that holds
the repartitioned state and reads no input, and the next run continues from it with the
new number of parallel state tasks.
"""

from __future__ import annotations

import json
from typing import Any

from headrace.errors import HeadraceError
from headrace.runtime import storage
from headrace.runtime.checkpoints import has_batches
from headrace.runtime.runner import PipelineRun
from headrace.runtime.session import get_session


def state_partitions(checkpoint: str) -> int | None:
    """The number of state partitions of a checkpoint's latest batch (Spark records it in the
    batch's offset-log entry), or None before the first batch. The checkpoint may be on HDFS
    or S3 (``headrace/runtime/storage.py``)."""
    offsets = storage.join(checkpoint, "offsets")
    try:
        batches = sorted((int(name) for name in storage.list_names(offsets) if name.isdigit()), reverse=True)
    except FileNotFoundError:
        return None
    if not batches:
        return None
    metadata = json.loads(storage.read_text(storage.join(offsets, str(batches[0]))).splitlines()[1])
    return int(metadata["conf"]["spark.sql.shuffle.partitions"])


def _has_state(checkpoint: str) -> bool:
    return storage.is_dir(storage.join(checkpoint, "state"))


def rescale(pipeline: Any, partitions: int, *, state_dir: str | None = None, master: str | None = None) -> int:
    """Spread ``pipeline``'s state over ``partitions`` partitions; returns the number it had.
    The pipeline must not be running."""
    name = pipeline.plan.name
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise HeadraceError(f"rescale {name!r}: the number of partitions must be a positive integer, got "
                            f"{partitions!r}")
    checkpoint = PipelineRun(pipeline, state_dir=state_dir, progress="quiet").checkpoint
    # a checkpoint on HDFS or S3 is read through the session's JVM: start it first
    spark = get_session(master) if storage.is_remote(checkpoint) else None
    if not has_batches(checkpoint):
        raise HeadraceError(f"rescale {name!r}: no checkpoint with processed batches at {checkpoint}; run the "
                            "pipeline first (a new pipeline takes spark.sql.shuffle.partitions)")
    current = state_partitions(checkpoint)
    if current is None or not _has_state(checkpoint):
        raise HeadraceError(f"rescale {name!r}: the pipeline keeps no keyed state (no stateful step in its "
                            "checkpoint), so there is nothing to rescale")
    if current == partitions:
        raise HeadraceError(f"rescale {name!r}: its state already has {partitions} partitions")
    spark = spark or get_session(master)
    try:
        spark._streamingCheckpointManager.repartition(checkpoint, partitions)
    except Exception as exc:  # noqa: BLE001 - Spark's wrapped error, told in one line
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise HeadraceError(f"rescale {name!r} from {current} to {partitions} partitions failed: {first}") from None
    return current
