"""Window shapes: which windows a record belongs to. Pure assignment math, no emission policy.

All windows are half-open ``[start, end)`` in epoch milliseconds.

>>> Tumbling("1s").assign(1500)
[(1000, 2000)]
>>> Sliding("3s", "1s").assign(1500)
[(-1000, 2000), (0, 3000), (1000, 4000)]
>>> Session("1s").assign(1500)
[(1500, 2500)]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from headrace.code_locations import user_location
from headrace.durations import describe_millis, to_millis
from headrace.errors import PlanError
from headrace.json_kinds import Kind


def _invalid(shape: str, message: str) -> PlanError:
    """A bad window argument, named by the user's line (a shape is built before its step)."""
    return PlanError(f"hr.{shape} ({user_location()}): {message}")


def _millis(value: object, shape: str, what: str) -> int:
    try:
        return to_millis(value, what)
    except PlanError as exc:
        raise _invalid(shape, str(exc)) from None


class WindowShape(Kind):
    """Base of the window shapes, each found by its ``kind`` in JSON.

    >>> WindowShape.from_json(Tumbling("10s", offset="2s").to_json()).describe()
    'tumbling 10s offset 2s'
    """

    family: ClassVar[str] = "window kind"
    KINDS: ClassVar[dict[str, type[Any]]] = {}
    # Spark's native window function for the shape (None: only headrace's window processor runs it)
    spark_function: ClassVar[str | None] = "window"
    by_count: ClassVar[bool] = False  # fires by records, not by the watermark: count and global windows

    @staticmethod
    def from_json(data: dict[str, Any]) -> WindowShape:
        """The shape whose ``to_json`` gave ``data``."""
        shape: WindowShape = WindowShape.of_kind(data.get("kind")).read(data)
        return shape

    def assign(self, t: int) -> list[tuple[int, int]]:
        raise NotImplementedError

    def describe(self) -> str:
        """The shape with every setting (``str`` leaves out an offset)."""
        return str(self)

    def native_obstacle(self) -> str | None:
        """Why Spark's native window operator cannot run this shape as headrace defines it (None: it can)."""
        return None if self.spark_function else f"{self.kind} windows"

    def spark_durations(self) -> tuple[int, ...]:
        """The durations, in ms, that ``spark_function`` takes after the time column."""
        raise NotImplementedError


def _offset(offset_ms: int) -> str:
    return f" offset {describe_millis(offset_ms)}" if offset_ms else ""


@dataclass(frozen=True, init=False)
class Tumbling(WindowShape):
    """Fixed windows of ``size``: ``start = t - ((t - offset) mod size)``, ``end = start + size``."""

    kind: ClassVar[str] = "tumbling"
    size_ms: int
    offset_ms: int

    def __init__(self, size: object, offset: object = 0) -> None:
        size_ms = _millis(size, "Tumbling", "size")
        offset_ms = _millis(offset, "Tumbling", "offset")
        if size_ms <= 0:
            raise _invalid("Tumbling", f"the window size must be positive, got {size!r}")
        object.__setattr__(self, "size_ms", size_ms)
        object.__setattr__(self, "offset_ms", offset_ms % size_ms)

    def assign(self, t: int) -> list[tuple[int, int]]:
        start = t - ((t - self.offset_ms) % self.size_ms)
        return [(start, start + self.size_ms)]

    @classmethod
    def read(cls, data: dict[str, Any]) -> Tumbling:
        return cls(data["size_ms"], data.get("offset_ms", 0))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "size_ms": self.size_ms, "offset_ms": self.offset_ms}

    def __str__(self) -> str:
        return f"tumbling {describe_millis(self.size_ms)}"

    def describe(self) -> str:
        return f"{self}{_offset(self.offset_ms)}"

    def spark_durations(self) -> tuple[int, ...]:
        return (self.size_ms, self.size_ms, self.offset_ms)


@dataclass(frozen=True, init=False)
class Sliding(WindowShape):
    """Windows of ``size`` every ``slide``: every ``[s, s + size)`` with
    ``s ≡ offset (mod slide)`` and ``s <= t < s + size`` (starts may be negative)."""

    kind: ClassVar[str] = "sliding"
    size_ms: int
    slide_ms: int
    offset_ms: int

    def __init__(self, size: object, slide: object, offset: object = 0) -> None:
        size_ms = _millis(size, "Sliding", "size")
        slide_ms = _millis(slide, "Sliding", "slide")
        offset_ms = _millis(offset, "Sliding", "offset")
        if size_ms <= 0 or slide_ms <= 0:
            raise _invalid("Sliding", f"the window size and slide must be positive, got size={size!r} "
                                      f"slide={slide!r}")
        if slide_ms > size_ms:
            raise _invalid("Sliding", f"the slide ({slide!r}) is larger than the window size ({size!r}); "
                                      "records between windows would be lost: use a slide <= size")
        object.__setattr__(self, "size_ms", size_ms)
        object.__setattr__(self, "slide_ms", slide_ms)
        object.__setattr__(self, "offset_ms", offset_ms % slide_ms)

    def assign(self, t: int) -> list[tuple[int, int]]:
        last_start = t - ((t - self.offset_ms) % self.slide_ms)
        starts = range(last_start, t - self.size_ms, -self.slide_ms)
        return sorted((s, s + self.size_ms) for s in starts)

    @classmethod
    def read(cls, data: dict[str, Any]) -> Sliding:
        return cls(data["size_ms"], data["slide_ms"], data.get("offset_ms", 0))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "size_ms": self.size_ms, "slide_ms": self.slide_ms, "offset_ms": self.offset_ms}

    def __str__(self) -> str:
        return f"sliding {describe_millis(self.size_ms)} every {describe_millis(self.slide_ms)}"

    def describe(self) -> str:
        return f"{self}{_offset(self.offset_ms)}"

    def spark_durations(self) -> tuple[int, ...]:
        return (self.size_ms, self.slide_ms, self.offset_ms)

    def native_obstacle(self) -> str | None:
        # Spark's operator counts a late record once for each window it missed
        return ("sliding windows (a late record is counted once, not once per window it missed)"
                if self.slide_ms < self.size_ms else None)


@dataclass(frozen=True, init=False)
class Session(WindowShape):
    """Per-key sessions: each record opens ``[t, t + gap)``; windows of one key that
    overlap or touch merge into their cover."""

    kind: ClassVar[str] = "session"
    spark_function: ClassVar[str | None] = "session_window"
    gap_ms: int

    def __init__(self, gap: object) -> None:
        gap_ms = _millis(gap, "Session", "gap")
        if gap_ms <= 0:
            raise _invalid("Session", f"the gap must be positive, got {gap!r}")
        object.__setattr__(self, "gap_ms", gap_ms)

    def assign(self, t: int) -> list[tuple[int, int]]:
        return [(t, t + self.gap_ms)]

    @classmethod
    def read(cls, data: dict[str, Any]) -> Session:
        return cls(data["gap_ms"])

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "gap_ms": self.gap_ms}

    def __str__(self) -> str:
        return f"session gap {describe_millis(self.gap_ms)}"

    def spark_durations(self) -> tuple[int, ...]:
        return (self.gap_ms,)


@dataclass(frozen=True, init=False)
class Count(WindowShape):
    """Per-key count windows in arrival order: every ``slide`` records of a key, a window of
    its last ``size`` records (``slide == size``: tumbling). Time plays no part; a trailing
    partial window is never emitted."""

    kind: ClassVar[str] = "count"
    spark_function: ClassVar[str | None] = None
    by_count: ClassVar[bool] = True
    size: int
    slide: int

    def __init__(self, size: int, slide: int | None = None) -> None:
        slide = size if slide is None else slide
        for name, value in (("size", size), ("slide", slide)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PlanError(f"Count window {name} must be a positive number of records, got {value!r}")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "slide", slide)

    def assign(self, t: int) -> list[tuple[int, int]]:
        raise PlanError("count windows are assigned by arrival order, not by time")

    @classmethod
    def read(cls, data: dict[str, Any]) -> Count:
        return cls(data["size"], data.get("slide"))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "size": self.size, "slide": self.slide}

    def __str__(self) -> str:
        return f"count {self.size}" + (f" every {self.slide}" if self.slide != self.size else "")


@dataclass(frozen=True)
class Global(WindowShape):
    """One window per key for all time, reported with null bounds; it fires only on its
    trigger (e.g. ``hr.CountTrigger(n)``) or at the end of a bounded input."""

    kind: ClassVar[str] = "global"
    spark_function: ClassVar[str | None] = None
    by_count: ClassVar[bool] = True

    @classmethod
    def read(cls, data: dict[str, Any]) -> Global:
        return cls()

    def assign(self, t: int) -> list[tuple[int, int]]:
        raise PlanError("the global window holds every record of a key; it has no bounds")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def __str__(self) -> str:
        return "global"
