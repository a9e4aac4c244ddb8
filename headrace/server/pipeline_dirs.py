"""Where a server pipeline's files are: its state dir (``<server state dir>/pipelines/<name>``)
holds that one pipeline, under the pipeline's own name (which ``--name`` may differ from), with
its checkpoint, its stored plan and its run dir."""

from __future__ import annotations

import os
from typing import Any

from headrace.environment.checkpoints import read_plan, run_dir
from headrace.server.registry import Entry

# what the web UI draws of each step: never a connector's settings (a DSN could hold a password)
DAG_FIELDS = ("name", "kind", "inputs", "defined_at", "keys", "event_time")


def pipeline_roots(entry: Entry) -> list[str]:
    """The pipeline's root (normally one) under the entry's state dir."""
    if not os.path.isdir(entry.state_dir):
        return []
    return [os.path.join(entry.state_dir, child) for child in sorted(os.listdir(entry.state_dir))
            if os.path.isdir(os.path.join(entry.state_dir, child, "checkpoint"))]


def run_dirs(entry: Entry) -> list[str]:
    return [run_dir(root, os.path.basename(root), "") for root in pipeline_roots(entry)]


def dag(entry: Entry) -> dict[str, Any]:
    """The steps of the pipeline's stored plan (what its driver runs), for drawing: each step's
    name, kind, inputs, where it is defined, its keys and event time, and its connector's type."""
    for root in pipeline_roots(entry):
        plan = read_plan(root)
        if plan is not None:
            nodes = [{**{name: node.get(name) for name in DAG_FIELDS},
                      "type": (node.get("connector") or {}).get("type")} for node in plan.get("nodes", [])]
            return {"pipeline": entry.name, "nodes": nodes}
    return {"pipeline": entry.name, "nodes": []}
