"""Rescale a stopped pipeline: change the number of partitions its keyed state is spread over.

Keyed state lives under its key (DESIGN.md), and Spark places keys in state partitions by
a hash of the key modulo the number of partitions, fixed when the checkpoint was created.
Spark 4.2+ rewrites a stopped query's state into another number of partitions offline
(``StreamingCheckpointManager.repartition``): it adds one batch to the checkpoint that holds
the repartitioned state and reads no input, and the next run continues from it with the
new number of parallel state tasks.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from typing import Any

from headrace.environment import checkpoints, storage
from headrace.environment.checkpoints import has_batches
from headrace.environment.session import get_session
from headrace.errors import HeadraceError
from headrace.runtime.runner import PipelineRun


def state_partitions(checkpoint: str) -> int | None:
    """The number of state partitions of a checkpoint's latest batch (Spark records it in the
    batch's offset-log entry), or None before the first batch. The checkpoint may be on HDFS
    or S3 (``headrace/environment/storage.py``)."""
    last = checkpoints.last_batch(checkpoint, checkpoints.OFFSETS)
    return None if last is None else checkpoints.state_partitions_of(checkpoints.offsets_entry(checkpoint, last)[1])


def _has_state(checkpoint: str) -> bool:
    return storage.is_dir(storage.join(checkpoint, "state"))


def unfinished_rescale(checkpoint: str) -> tuple[int, int] | None:
    """The numbers of partitions before and after a rescale that started and did not finish (its
    batch is in the offset log, not in the commit log, and changed the number), or None."""
    offsets = checkpoints.batch_ids(checkpoint, checkpoints.OFFSETS)
    commits = checkpoints.batch_ids(checkpoint, checkpoints.COMMITS)
    if len(offsets) < 2 or (commits and commits[-1] >= offsets[-1]):
        return None
    last, before = (checkpoints.state_partitions_of(checkpoints.offsets_entry(checkpoint, batch)[1])
                    for batch in offsets[-1:-3:-1])
    return (before, last) if last != before and last is not None and before is not None else None


def backup_dir(checkpoint: str) -> str:
    """Where a rescale keeps the checkpoint as it was until the rescale has finished."""
    return checkpoint.rstrip("/") + ".before-rescale"


def _keep_a_copy(checkpoint: str) -> str | None:
    """A copy of a local checkpoint as it is now, made of hard links (Spark writes each checkpoint
    file once, by renaming a new file into place, so the links keep the old contents at no cost);
    None for a remote checkpoint."""
    if storage.is_remote(checkpoint):
        return None
    local, backup = storage.local_path(checkpoint), storage.local_path(backup_dir(checkpoint))
    shutil.rmtree(backup, ignore_errors=True)
    shutil.copytree(local, backup, copy_function=os.link)
    return backup


def _put_back(checkpoint: str, backup: str) -> None:
    """Make ``backup`` the checkpoint again (two renames: the checkpoint is never missing for
    longer than between them)."""
    local = storage.local_path(checkpoint)
    failed = local.rstrip("/") + ".failed-rescale"
    shutil.rmtree(failed, ignore_errors=True)
    if os.path.isdir(local):
        os.rename(local, failed)
    os.rename(backup, local)
    shutil.rmtree(failed, ignore_errors=True)


def _settle_an_interrupted_rescale(checkpoint: str) -> None:
    """A rescale killed midway left its copy of the checkpoint: put it back when the rescale did
    not finish (or the checkpoint is missing), drop it when it did."""
    backup = None if storage.is_remote(checkpoint) else storage.local_path(backup_dir(checkpoint))
    if backup is None or not os.path.isdir(backup):
        return
    if not has_batches(checkpoint) or unfinished_rescale(checkpoint) is not None:
        _put_back(checkpoint, backup)
    else:
        shutil.rmtree(backup)


def rescale(pipeline: Any, partitions: int, *, state_dir: str | None = None, master: str | None = None) -> int:
    """Spread ``pipeline``'s state over ``partitions`` partitions; returns the number it had.
    The pipeline must not be running. A rescale that fails leaves a local checkpoint as it was;
    one that did not finish otherwise (a remote checkpoint, a killed process) is finished first."""
    name = pipeline.plan.name
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise HeadraceError(f"rescale {name!r}: the number of partitions must be a positive integer, got "
                            f"{partitions!r}")
    checkpoint = PipelineRun(pipeline, state_dir=state_dir, progress="quiet").checkpoint
    # a checkpoint on HDFS or S3 is read through the session's JVM: start it first
    spark = get_session(master) if storage.is_remote(checkpoint) else None
    _settle_an_interrupted_rescale(checkpoint)
    if not has_batches(checkpoint):
        raise HeadraceError(f"rescale {name!r}: no checkpoint with processed batches at {checkpoint}; run the "
                            "pipeline first (a new pipeline takes spark.sql.shuffle.partitions)")
    pending = unfinished_rescale(checkpoint)
    if pending is not None:  # Spark finishes a rescale when asked for the same number again
        _repartition(spark or get_session(master), name, checkpoint, *pending, finishing=True)
    current = state_partitions(checkpoint)
    if current is None or not _has_state(checkpoint):
        raise HeadraceError(f"rescale {name!r}: the pipeline keeps no keyed state (no stateful step in its "
                            "checkpoint), so there is nothing to rescale")
    if current == partitions:
        if pending is not None:
            return pending[0]
        raise HeadraceError(f"rescale {name!r}: its state already has {partitions} partitions")
    _repartition(spark or get_session(master), name, checkpoint, current, partitions)
    return current


def _repartition(spark: Any, name: str, checkpoint: str, current: int, partitions: int, *,
                 finishing: bool = False) -> None:
    """Spark's offline repartition, undone when it fails (a local checkpoint)."""
    backup = None if finishing else _keep_a_copy(checkpoint)
    group = f"headrace rescale {name} {uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, f"rescale {name!r} to {partitions} partitions")
    try:
        # Spark's repartition writes the state through the state store coordinator, which the
        # session starts only with its streaming query manager: a new session (headrace rescale
        # in a process of its own) has none yet ("Cannot find endpoint: spark://StateStoreCoordinator")
        spark._jsparkSession.streams()
        spark._streamingCheckpointManager.repartition(checkpoint, partitions)
    except Exception as exc:  # noqa: BLE001 - Spark's wrapped error, told in one line
        if backup is not None:
            _tasks_ended(spark, group)
            _put_back(checkpoint, backup)
        raise HeadraceError(_failed(name, checkpoint, current, partitions, exc, undone=backup is not None,
                                    finishing=finishing)) from None
    finally:
        spark.sparkContext._jsc.clearJobGroup()
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)


def _tasks_ended(spark: Any, group: str, timeout_s: float = 60.0) -> None:
    """Wait until the tasks of a failed repartition have ended (at most ``timeout_s``): Spark
    fails the job at its first failed task, while the others may still be writing their
    partitions' state into the checkpoint, which would land in the one put back."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
        stages = [tracker.getStageInfo(stage) for job in jobs if job is not None for stage in job.stageIds]
        if all(stage is None or stage.numActiveTasks == 0 for stage in stages):
            return
        time.sleep(0.1)


def _failed(name: str, checkpoint: str, current: int, partitions: int, exc: BaseException, *, undone: bool,
            finishing: bool) -> str:
    """What went wrong, where the checkpoint stands and what to do."""
    cause = _spark_cause(exc)
    if finishing:
        return (f"rescale {name!r}: finishing an earlier rescale to {partitions} partitions failed: {cause}; the "
                f"checkpoint {checkpoint} still ends with that unfinished rescale, which the pipeline cannot start "
                f"from: fix the cause and run headrace rescale again (any number of partitions: it finishes the "
                f"earlier one first)")
    if undone:
        return (f"rescale {name!r} from {current} to {partitions} partitions failed: {cause}; the checkpoint is "
                f"as it was ({current} partitions) and the pipeline runs from it as before; fix the cause and "
                f"run headrace rescale again")
    return (f"rescale {name!r} from {current} to {partitions} partitions failed: {cause}; the checkpoint "
            f"{checkpoint} now ends with an unfinished rescale, which the pipeline cannot start from: fix the "
            f"cause and run headrace rescale again (any number of partitions: it finishes this one first)")


def _spark_cause(exc: BaseException) -> str:
    """The innermost cause Spark names (py4j's own line says only which call failed)."""
    from headrace.runtime.failures import root_cause, spark_trace

    return root_cause(spark_trace(exc))
