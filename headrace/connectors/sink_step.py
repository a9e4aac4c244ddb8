"""How a sink names itself in its messages: by the step the user wrote, never by its commit identity.

A running sink is bound to a commit identity ``<step>/<pipeline>@<checkpoint id>``
(``headrace/spark/writer.py``); its messages say ``sink 'totals' (app.py:14): ...``,
with the step's name and the ``file:line`` where the user defined it. That line is read
from the plan the runtime stores beside the sink's run directory before the query starts
(``headrace/runtime/checkpoints.py``: ``<pipeline root>/run`` and ``<pipeline root>/plan.json``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from headrace.runtime.checkpoints import read_plan


@dataclass(frozen=True)
class SinkStep:
    """A sink step as messages name it.

    >>> str(SinkStep("totals", "app.py:14"))
    "sink 'totals' (app.py:14)"
    >>> str(SinkStep("totals"))
    "sink 'totals'"
    """

    name: str
    defined_at: str = ""

    def __str__(self) -> str:
        return f"sink '{self.name}'" + (f" ({self.defined_at})" if self.defined_at else "")


def step_name(identity: str) -> str:
    """The step name in a commit identity.

    >>> step_name("out/clicks@3274e357-0c1e")
    'out'
    >>> step_name("to_db")
    'to_db'
    """
    head, slash, tail = identity.rpartition("/")
    return head if slash and head and "@" in tail else identity


def sink_step(identity: str, run_dir: str | None = None) -> SinkStep:
    """The step behind ``identity``, with where it was defined when the pipeline's stored plan
    (beside ``run_dir``) says so."""
    name = step_name(identity)
    record = read_plan(os.path.dirname(os.path.abspath(run_dir))) if run_dir else None
    if record is None or not identity.startswith(f"{name}/{record.get('pipeline')}@"):
        return SinkStep(name)
    for node in record.get("nodes") or ():
        if node.get("kind") == "sink" and node.get("name") == name:
            return SinkStep(name, str(node.get("defined_at") or ""))
    return SinkStep(name)
