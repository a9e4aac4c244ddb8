"""How a sink names itself in its messages: by the step the user wrote, never by its commit identity.

A running sink is bound (``headrace/spark/writer.py``) to a commit identity
``<step>/<pipeline>@<checkpoint id>`` and to the ``file:line`` where the user defined the
step; its messages say ``sink 'totals' (app.py:14): ...``.
"""

from __future__ import annotations

from dataclasses import dataclass


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
