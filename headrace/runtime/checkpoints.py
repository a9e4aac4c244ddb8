"""Checkpoint directories and the identity of the query that owns one."""

from __future__ import annotations

import json
import os
import uuid


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
