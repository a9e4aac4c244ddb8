"""Checkpoint directories, the identity of the query that owns one, and the plan stored beside it.

A pipeline's files live under ``<state dir>/<pipeline>/``: ``checkpoint/`` (Spark's) and
``plan.json``, the plan of the run that last started from the checkpoint, which a restart is
checked against before the query starts. The state dir may be a local path or a Hadoop URI
(``hdfs://``, ``s3a://``): these files go through ``headrace/environment/storage.py``.

The run files (the stop and exhausted markers, the sources' run-time files) are read by
Python data sources with Python's file functions, so they are always local: in
``<state dir>/<pipeline>/run/`` for a local state dir, and in
``<run files dir>/<pipeline>/<query id>/`` (``HEADRACE_RUN_FILES_DIR``) for a remote one.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any
from urllib.parse import quote

from headrace.environment import storage
from headrace.environment.state_paths import run_files_dir

PLAN_FILE = "plan.json"
STATE_OPERATORS_FILE = "state_operators.json"  # {Spark's stateful operator id: the step it belongs to}


def write_state_operators(root: str, steps: dict[int, str]) -> None:
    """Keep which step each stateful operator (by Spark's operator id) belongs to, beside the checkpoint."""
    storage.write_text(storage.join(root, STATE_OPERATORS_FILE),
                       json.dumps({str(operator): step for operator, step in sorted(steps.items())}) + "\n")


def read_state_operators(root: str) -> dict[int, str]:
    """What ``write_state_operators`` kept ({} when nothing, or nothing readable)."""
    try:
        kept = json.loads(storage.read_text(storage.join(root, STATE_OPERATORS_FILE)))
        return {int(operator): str(step) for operator, step in kept.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def pipeline_root(state_dir: str, pipeline: str) -> str:
    """The directory holding a pipeline's checkpoint and stored plan (and, for a local state
    dir, its run files)."""
    return storage.join(state_dir, pipeline)


def run_dir(root: str, pipeline: str, query: str) -> str:
    """The folder of a run's run files: ``<root>/run`` when ``root`` is local, and otherwise
    ``<run files dir>/<pipeline>/<query id>``, which a restart from the same checkpoint finds
    again on the same machine and a new checkpoint (a new query id) does not."""
    if not storage.is_remote(root):
        return storage.local_path(storage.join(root, "run"))
    return os.path.join(run_files_dir(), quote(pipeline, safe=""), query)


def read_query_id(checkpoint: str) -> str | None:
    """The id in ``<checkpoint>/metadata``, if there is one."""
    try:
        first = storage.read_text(storage.join(checkpoint, "metadata")).splitlines()[0]
    except FileNotFoundError:
        return None
    return str(json.loads(first)["id"])


def query_id(checkpoint: str) -> str:
    """The id Spark keeps in ``<checkpoint>/metadata`` for the life of the checkpoint.

    headrace writes it first when the checkpoint is new (Spark then adopts it), so sinks
    know, before the first batch, the identity their commits belong to: a restart from
    the same checkpoint has the same id; a fresh start has a new one.
    """
    known = read_query_id(checkpoint)
    if known is not None:
        return known
    new_id = str(uuid.uuid4())
    storage.write_text(storage.join(checkpoint, "metadata"), json.dumps({"id": new_id}) + "\n")
    return new_id


# -- Spark's offset and commit logs ----------------------------------------------------------------
# ``<checkpoint>/offsets/<batch id>`` is written when a micro-batch is planned: a version line
# (``v1``), a line of metadata (the watermark the batch runs with, its time, the settings it runs
# under, among them the number of state partitions) and a line per source with its offsets.
# ``<checkpoint>/commits/<batch id>`` is written when the batch has committed. Spark keeps the
# files of the last batches only.
OFFSETS, COMMITS = "offsets", "commits"
WATERMARK_KEY = "batchWatermarkMs"
STATE_PARTITIONS_KEY = "spark.sql.shuffle.partitions"  # in the metadata's ``conf``


def batch_ids(checkpoint: str, log: str) -> list[int]:
    """The batch ids the ``offsets`` or ``commits`` log has an entry for, in order ([] when none)."""
    try:
        return sorted(int(name) for name in storage.list_names(storage.join(checkpoint, log)) if name.isdigit())
    except FileNotFoundError:
        return []


def last_batch(checkpoint: str, log: str) -> int | None:
    """The highest batch id in the ``offsets`` or ``commits`` log, None when it is empty."""
    return max(batch_ids(checkpoint, log), default=None)


def has_batches(checkpoint: str) -> bool:
    """Whether Spark has logged a micro-batch's offsets there: from then on the checkpoint
    holds offsets (and state) that only a compatible plan can continue."""
    return bool(batch_ids(checkpoint, OFFSETS))


def offsets_entry(checkpoint: str, batch: int) -> tuple[list[str], dict[str, Any]]:
    """Batch ``batch``'s offset log entry: its lines, and its metadata parsed. FileNotFoundError
    when there is none; ValueError when it is not a version line followed by a metadata object."""
    lines = storage.read_text(storage.join(checkpoint, OFFSETS, str(batch))).splitlines()
    try:
        metadata = json.loads(lines[1])
    except IndexError:
        raise ValueError("no metadata line") from None
    if not (lines[0].startswith("v") and isinstance(metadata, dict)):
        raise ValueError("not a version line followed by a metadata object")
    return lines, metadata


def batch_metadata(checkpoint: str, batch: int) -> dict[str, Any]:
    """Batch ``batch``'s metadata in the offset log; {} when its entry is gone (Spark dropped it) or
    not of that shape."""
    try:
        return offsets_entry(checkpoint, batch)[1]
    except (OSError, ValueError):
        return {}


def state_partitions_of(metadata: dict[str, Any]) -> int | None:
    """The number of state partitions a batch ran with, from its metadata; None when not there."""
    partitions = str((metadata.get("conf") or {}).get(STATE_PARTITIONS_KEY))
    return int(partitions) if partitions.isdigit() else None


def read_plan(root: str) -> dict[str, Any] | None:
    """The stored plan record of the pipeline under ``root``, if any."""
    try:
        text = storage.read_text(storage.join(root, PLAN_FILE))
    except FileNotFoundError:
        return None
    record: dict[str, Any] = json.loads(text)
    return record


def write_plan(root: str, record: dict[str, Any]) -> None:
    """Store ``record`` as ``<root>/plan.json``, atomically (write, then rename)."""
    # key order kept: aggregates and fields are ordered
    storage.write_text(storage.join(root, PLAN_FILE), json.dumps(record, indent=2))
