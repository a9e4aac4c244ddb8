"""Emission policy, apart from the window shape: when a window's panes fire, how long a
window accepts late data, and whether panes accumulate.

A trigger is one class: it describes and serialises itself and decides, record by record,
when a window's pane fires (``on_record``); the window operator
(``headrace/engine/window_panes.py``) asks it and keeps the panes.

>>> AfterWatermark(early=EveryN(2)).describe()
'on time when the watermark passes the end, early every 2 records'
>>> Trigger.from_json(AfterWatermark(early=AfterDelay("5s")).to_json()).brief()
'after the watermark, early after 5s of processing time'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from headrace.durations import describe_millis, to_millis
from headrace.errors import PlanError
from headrace.json_kinds import Kind


class PaneCounters(Protocol):
    """What a trigger reads and sets on a window's pane."""

    early_count: int  # records since the pane last fired
    timer: float | None  # processing time of a due early pane
    on_time_done: bool  # the on-time pane has fired


class Early(Kind):
    """Base of the early firings of ``AfterWatermark``, each found by its one key in JSON."""

    family: ClassVar[str] = "early firing"
    KINDS: ClassVar[dict[str, type[Any]]] = {}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Early:
        """The early firing whose ``to_json`` gave ``data``."""
        [(kind, value)] = data.items()
        early: Early = Early.of_kind(kind)(value)
        return early

    def on_record(self, pane: PaneCounters, clock: float) -> bool:
        """A record joined the pane at processing time ``clock``: whether an early pane fires now."""
        raise NotImplementedError


@dataclass(frozen=True)
class EveryN(Early):
    """An early pane every ``n`` records of a window (Beam ``AfterCount``, repeated)."""

    kind: ClassVar[str] = "every_n_elements"
    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise PlanError(f"EveryN needs a positive number of records, got {self.n!r}")

    def to_json(self) -> dict[str, Any]:
        return {self.kind: self.n}

    def describe(self) -> str:
        return f"early every {self.n} records"

    def on_record(self, pane: PaneCounters, clock: float) -> bool:
        pane.early_count += 1
        return pane.early_count >= self.n


@dataclass(frozen=True, init=False)
class AfterDelay(Early):
    """An early pane ``delay`` of processing time after the first record of a pane
    (Beam ``AfterProcessingTime.pastFirstElementInPane().plusDelayOf``, repeated)."""

    kind: ClassVar[str] = "processing_time_delay_ms"
    delay_ms: int

    def __init__(self, delay: object) -> None:
        delay_ms = to_millis(delay, "AfterDelay delay")
        if delay_ms <= 0:
            raise PlanError(f"AfterDelay needs a positive delay, got {delay!r}")
        object.__setattr__(self, "delay_ms", delay_ms)

    def to_json(self) -> dict[str, Any]:
        return {self.kind: self.delay_ms}

    def describe(self) -> str:
        return f"early {describe_millis(self.delay_ms)} of processing time after a pane's first record"

    def brief(self) -> str:
        return f"early after {describe_millis(self.delay_ms)} of processing time"

    def on_record(self, pane: PaneCounters, clock: float) -> bool:
        if pane.timer is None:  # the window operator fires it when processing time reaches it
            pane.timer = clock + self.delay_ms
        return False


class Trigger(Kind):
    """Base of the triggers, each found by its ``type`` in JSON."""

    family: ClassVar[str] = "trigger type"
    KINDS: ClassVar[dict[str, type[Any]]] = {}
    # an on-time pane fires when the watermark passes the window's end
    fires_on_time: ClassVar[bool] = False

    @staticmethod
    def from_json(data: dict[str, Any]) -> Trigger:
        """The trigger whose ``to_json`` gave ``data``."""
        trigger: Trigger = Trigger.of_kind(data.get("type")).read(data)
        return trigger

    def on_record(self, pane: PaneCounters, window_end: float, watermark: float, clock: float) -> str | None:
        """A record joined ``pane`` (of a window ending at ``window_end``) with the watermark at
        ``watermark`` and processing time at ``clock``: the kind of pane that fires now, or None."""
        raise NotImplementedError

    def fires_empty_on_time(self) -> bool:
        """Whether the on-time pane fires when nothing arrived since the previous pane."""
        return False


@dataclass(frozen=True)
class AfterWatermark(Trigger):
    """The default trigger: one on-time pane when the watermark reaches the window's end,
    optional early panes before it, a late pane for each late record while the window is
    within its allowed lateness. ``on_time_empty="fire"`` emits the on-time pane even
    when nothing arrived since the previous pane (Beam's default); ``"skip"`` does not."""

    kind: ClassVar[str] = "event_time"
    fires_on_time: ClassVar[bool] = True
    early: Early | None = None
    on_time_empty: str = "skip"

    def __post_init__(self) -> None:
        if self.on_time_empty not in ("skip", "fire"):
            raise PlanError(f"on_time_empty must be 'skip' or 'fire', got {self.on_time_empty!r}")
        if self.early is not None and not isinstance(self.early, Early):
            raise PlanError(f"early must be hr.EveryN(n) or hr.AfterDelay(delay), got {self.early!r}")

    @classmethod
    def read(cls, data: dict[str, Any]) -> AfterWatermark:
        early = data.get("early")
        return cls(Early.from_json(early) if early else None, data.get("on_time_empty_pane") or "skip")

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "early": self.early.to_json() if self.early else None,
                "on_time_empty_pane": self.on_time_empty}

    def describe(self) -> str:
        early = f", {self.early.describe()}" if self.early else ""
        return f"on time when the watermark passes the end{early}"

    def brief(self) -> str:
        early = f", {self.early.brief()}" if self.early else ""
        empty = ", empty on-time panes fired" if self.fires_empty_on_time() else ""
        return f"after the watermark{early}{empty}"

    def on_record(self, pane: PaneCounters, window_end: float, watermark: float, clock: float) -> str | None:
        if watermark >= window_end:  # complete but not expired: a late pane at once
            pane.on_time_done = True
            return "late"
        return "early" if self.early is not None and self.early.on_record(pane, clock) else None

    def fires_empty_on_time(self) -> bool:
        return self.on_time_empty == "fire"


@dataclass(frozen=True)
class CountTrigger(Trigger):
    """Fire every ``n`` records of a key's window, ignoring time (Flink ``CountTrigger``);
    for global windows."""

    kind: ClassVar[str] = "count"
    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise PlanError(f"CountTrigger needs a positive number of records, got {self.n!r}")

    @classmethod
    def read(cls, data: dict[str, Any]) -> CountTrigger:
        return cls(data["n"])

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "n": self.n}

    def describe(self) -> str:
        return f"every {self.n} records"

    def on_record(self, pane: PaneCounters, window_end: float, watermark: float, clock: float) -> str | None:
        pane.early_count += 1
        return "count" if pane.early_count >= self.n else None


@dataclass(frozen=True)
class Emission:
    """Everything about when and what a window emits, beside its shape."""

    trigger: Trigger = field(default_factory=AfterWatermark)
    allowed_lateness_ms: int = 0
    accumulating: bool = True

    def is_default(self) -> bool:
        """True when Spark's native window operator has exactly these semantics."""
        return self == Emission()

    def has_panes(self, by_count: bool) -> bool:
        """Whether a window's output has ``pane_kind`` and ``pane_index`` columns: when it can fire
        more than one pane per window (this policy is not the default, or the window fires by
        count, ``by_count``: count and global windows). One on-time pane per window has none."""
        return by_count or not self.is_default()

    def to_json(self) -> dict[str, Any]:
        return {"trigger": self.trigger.to_json(), "allowed_lateness_ms": self.allowed_lateness_ms,
                "accumulation": "accumulating" if self.accumulating else "discarding"}
