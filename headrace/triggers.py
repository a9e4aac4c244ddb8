"""Emission policy, apart from the window shape: when a window's panes fire, how long a
window accepts late data, and whether panes accumulate.

>>> AfterWatermark(early=EveryN(2)).describe()
'on time when the watermark passes the end, early every 2 records'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from headrace.durations import describe_millis, to_millis
from headrace.errors import PlanError


@dataclass(frozen=True)
class EveryN:
    """An early pane every ``n`` records of a window (Beam ``AfterCount``, repeated)."""

    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise PlanError(f"EveryN needs a positive number of records, got {self.n!r}")

    def to_json(self) -> dict[str, Any]:
        return {"every_n_elements": self.n}


@dataclass(frozen=True, init=False)
class AfterDelay:
    """An early pane ``delay`` of processing time after the first record of a pane
    (Beam ``AfterProcessingTime.pastFirstElementInPane().plusDelayOf``, repeated)."""

    delay_ms: int

    def __init__(self, delay: object) -> None:
        delay_ms = to_millis(delay, "AfterDelay delay")
        if delay_ms <= 0:
            raise PlanError(f"AfterDelay needs a positive delay, got {delay!r}")
        object.__setattr__(self, "delay_ms", delay_ms)

    def to_json(self) -> dict[str, Any]:
        return {"processing_time_delay_ms": self.delay_ms}


@dataclass(frozen=True)
class AfterWatermark:
    """The default trigger: one on-time pane when the watermark reaches the window's end,
    optional early panes before it, a late pane for each late record while the window is
    within its allowed lateness. ``on_time_empty="fire"`` emits the on-time pane even
    when nothing arrived since the previous pane (Beam's default); ``"skip"`` does not."""

    early: EveryN | AfterDelay | None = None
    on_time_empty: str = "skip"

    def __post_init__(self) -> None:
        if self.on_time_empty not in ("skip", "fire"):
            raise PlanError(f"on_time_empty must be 'skip' or 'fire', got {self.on_time_empty!r}")
        if self.early is not None and not isinstance(self.early, (EveryN, AfterDelay)):
            raise PlanError(f"early must be hr.EveryN(n) or hr.AfterDelay(delay), got {self.early!r}")

    def to_json(self) -> dict[str, Any]:
        return {"type": "event_time", "early": self.early.to_json() if self.early else None,
                "on_time_empty_pane": self.on_time_empty}

    def describe(self) -> str:
        text = "on time when the watermark passes the end"
        if isinstance(self.early, EveryN):
            text += f", early every {self.early.n} records"
        elif isinstance(self.early, AfterDelay):
            text += f", early {describe_millis(self.early.delay_ms)} of processing time after a pane's first record"
        return text


@dataclass(frozen=True)
class CountTrigger:
    """Fire every ``n`` records of a key's window, ignoring time (Flink ``CountTrigger``);
    for global windows."""

    n: int

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise PlanError(f"CountTrigger needs a positive number of records, got {self.n!r}")

    def to_json(self) -> dict[str, Any]:
        return {"type": "count", "n": self.n}

    def describe(self) -> str:
        return f"every {self.n} records"


Trigger = AfterWatermark | CountTrigger


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
