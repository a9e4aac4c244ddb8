"""A failover sink group (Flume's failover sink processor): each micro-batch goes to the
first member that writes it without an error.

``Failover(primary, *backups)`` is a sink like any other. For every micro-batch it tries
the primary, then each backup in turn, until one writes the batch; each member that fails
is a *failover*, counted (``failovers``, ``failovers_by_member``) and logged as a warning on
the ``headrace.sinks.failover`` logger with the member's error. When every member fails,
the batch fails with a ``SinkError`` listing each member's error. The primary is tried
first again at the next batch.

Batch ids: the group has committed a batch when any member has (``committed``), so a batch
Spark replays after a crash is skipped, whichever member wrote it. Each member commits under
an identity of its own, ``<group>.<member name>/<pipeline>@<checkpoint>``.

Guarantee: the weakest member's. A replayed batch can still reach two members in one case:
the member that committed it cannot be asked (its system is down) when Spark replays it;
the group then counts it as not committed there (with a warning) and the next member writes it.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
from collections.abc import Sequence
from typing import Any

from headrace.contract import Guarantee, SinkConnector
from headrace.errors import PlanError, SinkError
from headrace.sink_step import SinkStep, step_name

log = logging.getLogger("headrace.sinks.failover")


class _Counts:
    """Failovers per member, shared by a group and the copies the runtime binds."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_member: dict[str, int] = {}

    def add(self, member: str) -> None:
        with self.lock:
            self.by_member[member] = self.by_member.get(member, 0) + 1


def _default_names(count: int) -> tuple[str, ...]:
    """
    >>> _default_names(3)
    ('primary', 'backup', 'backup_2')
    """
    return ("primary", "backup", *(f"backup_{n}" for n in range(2, count)))


class Failover(SinkConnector):
    """Write each micro-batch to ``primary``, or, when it fails, to the first of ``backups``
    that writes it. ``names`` names the members in messages and counts (default ``primary``,
    ``backup``, ``backup_2``, ...).

    >>> import headrace as hr
    >>> group = Failover(hr.sinks.Files("/tmp/a", format="jsonl"), hr.sinks.Console())
    >>> group.guarantee.value, group.describe()["members"][1]
    ('at-least-once', {'name': 'backup', 'type': 'Console', 'limit': 20, 'truncate': False})
    """

    native_format = None  # always through write_batch: the group picks the member per batch

    def refuses_updates(self) -> str | None:
        for member in self.members:
            why = member.refuses_updates()
            if why is not None:
                return why
        return None

    def refuses_columns(self, columns: list[str]) -> str | None:
        for name, member in zip(self.names, self.members):
            why = member.refuses_columns(columns)
            if why is not None:
                return f"its member {name!r}: {why}"
        return None

    def refused_member(self) -> tuple[str, SinkConnector] | None:
        """The name and the sink of the first member that cannot take updates."""
        for name, member in zip(self.names, self.members):
            if member.refuses_updates() is not None:
                return name, member
        return None

    def __init__(self, primary: SinkConnector, *backups: SinkConnector, names: Sequence[str] | None = None) -> None:
        members = (primary, *backups)
        for position, member in enumerate(members):
            if not isinstance(member, SinkConnector):
                raise PlanError(f"Failover: member {position + 1} must be a headrace sink (hr.sinks.*), got "
                                f"{type(member).__name__}")
        if not backups:
            raise PlanError("Failover: give a primary and at least one backup sink: Failover(primary, backup, ...)")
        labels = _default_names(len(members)) if names is None else tuple(names)
        if len(labels) != len(members) or not all(isinstance(n, str) and n for n in labels):
            raise PlanError(f"Failover: names must be {len(members)} non-empty strings, one per member, got {names!r}")
        if len(set(labels)) != len(labels):
            raise PlanError(f"Failover: a member name appears twice in {list(labels)}")
        self.members: tuple[SinkConnector, ...] = members
        self.names = labels
        self.guarantee = Guarantee.weakest([m.guarantee for m in members])
        self._counts = _Counts()
        self._step: SinkStep | None = None
        self._run_dir: str | None = None
        self._unprepared: dict[int, str] = {}  # member index -> why its prepare failed

    # -- what the runtime asks -------------------------------------------------------------------
    def bind(self, owner: str, defined_at: str = "") -> Failover:
        """A copy for the sink step ``owner`` names (``<step>/<pipeline>@<checkpoint>``): each
        member is bound as ``<step>.<member name>``, so each commits under its own identity."""
        bound = copy.copy(self)
        step = step_name(owner)
        rest = owner[len(step):]  # "/<pipeline>@<checkpoint>", or nothing
        members = []
        for name, member in zip(self.names, self.members):
            bind = getattr(member, "bind", None)
            members.append(bind(f"{step}.{name}{rest}", defined_at) if bind else member)
        bound.members = tuple(members)
        bound._step = SinkStep(step, defined_at)
        bound._unprepared = {}
        return bound

    def prepare(self, run_dir: str) -> None:
        """Prepare every member. A member that cannot be prepared does not stop the pipeline: it
        is prepared again when its turn comes, and fails over while it cannot be."""
        self._run_dir = run_dir
        for index in range(len(self.members)):
            if not self._prepare(index):
                log.warning("%s: member %r cannot start, its batches go to the next member: %s",
                            self._where(), self.names[index], self._unprepared[index])

    def locate_checkpoint(self, checkpoint: str) -> None:
        for member in self.members:
            member.locate_checkpoint(checkpoint)

    def committed(self, batch_id: int) -> bool:
        for name, member in zip(self.names, self.members):
            try:
                if member.committed(batch_id):
                    return True
            except Exception as exc:  # noqa: BLE001 - a member that cannot tell is asked again next time
                log.warning("%s: cannot tell whether member %r committed batch %d (%s: %s); counting it as not "
                            "committed there", self._where(), name, batch_id, type(exc).__name__, exc)
        return False

    def write_batch(self, df: Any, batch_id: int) -> None:
        errors: list[str] = []
        last = len(self.members) - 1
        for index, (name, member) in enumerate(zip(self.names, self.members)):
            error = None
            if index in self._unprepared and not self._prepare(index):
                error = self._unprepared[index]
            else:
                try:
                    member.write_batch(df, batch_id)
                except Exception as exc:  # noqa: BLE001 - any member error fails over to the next member
                    error = f"{type(exc).__name__}: {exc}"
            if error is None:
                return
            errors.append(f"{name}: {error}")
            if index < last:
                self._counts.add(name)
                log.warning("%s: batch %d: member %r failed, failing over to %r: %s", self._where(), batch_id,
                            name, self.names[index + 1], error)
        raise SinkError(f"{self._where()}: every member failed to write batch {batch_id}: {'; '.join(errors)}")

    def _prepare(self, index: int) -> bool:
        """Prepare member ``index``; False (and the reason kept) when it cannot be prepared."""
        if self._run_dir is None:
            return True
        try:
            self.members[index].prepare(self._run_dir)
        except Exception as exc:  # noqa: BLE001 - reported as the member's failure to write
            self._unprepared[index] = f"{type(exc).__name__}: {exc}"
            return False
        self._unprepared.pop(index, None)
        return True

    def close(self) -> None:
        for member in self.members:
            with contextlib.suppress(Exception):  # one member that does not close leaves the others to close
                member.close()

    def spark_packages(self) -> list[Any]:
        return [package for member in self.members for package in member.spark_packages()]

    def describe(self) -> dict[str, Any]:
        return {"type": "Failover", "members": [{"name": name, **member.describe()}
                                                for name, member in zip(self.names, self.members)]}

    # -- what users read -------------------------------------------------------------------------
    @property
    def failovers(self) -> int:
        """How many times a member failed and the batch went on to the next member."""
        with self._counts.lock:
            return sum(self._counts.by_member.values())

    @property
    def failovers_by_member(self) -> dict[str, int]:
        """Failovers counted against each member that failed."""
        with self._counts.lock:
            return dict(self._counts.by_member)

    def _where(self) -> str:
        return str(self._step) if self._step is not None else f"Failover({', '.join(self.names)})"

    def __repr__(self) -> str:
        members = ", ".join(f"{name}={member!r}" for name, member in zip(self.names, self.members))
        return f"Failover({members})"
