"""Checkpoint directories, the identity of the query that owns one, and the plan stored beside it.

A pipeline's files live under ``<state dir>/<pipeline>/``: ``checkpoint/`` (Spark's),
``run/`` (the sources' run-time files) and ``plan.json``, the plan of the run that last
started from the checkpoint, which a restart is checked against before Spark starts.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

PLAN_FILE = "plan.json"


def pipeline_root(state_dir: str, pipeline: str) -> str:
    """The directory holding a pipeline's checkpoint, run files and stored plan."""
    return str(Path(state_dir) / pipeline)


def query_id(checkpoint: str) -> str:
    """The id Spark keeps in ``<checkpoint>/metadata`` for the life of the checkpoint.

    headrace writes it first when the checkpoint is new (Spark then adopts it), so sinks
    know, before the first batch, the identity their commits belong to: a restart from
    the same checkpoint has the same id; a fresh start has a new one.
    """
    path = os.path.join(checkpoint, "metadata")
    if os.path.exists(path):
        with open(path) as handle:
            return str(json.loads(handle.readline())["id"])
    os.makedirs(checkpoint, exist_ok=True)
    new_id = str(uuid.uuid4())
    with open(path + ".tmp", "w") as handle:
        handle.write(json.dumps({"id": new_id}) + "\n")
    os.replace(path + ".tmp", path)
    return new_id


def has_batches(checkpoint: str) -> bool:
    """Whether Spark has logged a micro-batch's offsets there: from then on the checkpoint
    holds offsets (and state) that only a compatible plan can continue."""
    try:
        return any(name.isdigit() for name in os.listdir(os.path.join(checkpoint, "offsets")))
    except FileNotFoundError:
        return False


def read_plan(root: str) -> dict[str, Any] | None:
    """The stored plan record of the pipeline under ``root``, if any."""
    try:
        with open(os.path.join(root, PLAN_FILE)) as handle:
            record: dict[str, Any] = json.load(handle)
    except FileNotFoundError:
        return None
    return record


def write_plan(root: str, record: dict[str, Any]) -> None:
    """Store ``record`` as ``<root>/plan.json``, atomically (write, then rename)."""
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, PLAN_FILE)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "w") as handle:
        json.dump(record, handle, indent=2)  # key order kept: aggregates and fields are ordered
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
