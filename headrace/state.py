"""The state a keyed process function declares: value, list and map state, each with an
optional time-to-live, free of Spark.

A function declares its state as class attributes (``count = hr.ValueState(default=0)``).
While it handles a record or a timer, reading such an attribute gives a handle on the
state of the key being processed; anywhere else it is an error, since state belongs to a
key. Each entry remembers when it expires (``ttl`` after it was last written, in
processing time); expired entries read as absent and are swept away.

This module holds the declarations only. The handles and the stored entries belong to the
operator engine (``headrace/engine/state_cells.py``): while the engine runs a record or
a timer it puts the key's scope on the function instance, and a declaration read there
asks that scope for its handle (``scope.handle(declaration)``), so a declaration never
needs to know how its entries are stored.
"""

from __future__ import annotations

import math
from typing import Any

from headrace.durations import to_millis

NEVER = math.inf  # the expiry of an entry without a ttl


class StateUsageError(Exception):
    """State used in a way that cannot work (the message says how to fix it)."""


class State:
    """A declared piece of per-key state; subclasses say what it holds."""

    kind = "state"

    def __init__(self, *, ttl: object = None) -> None:
        self.name = ""
        self.owner = ""
        self.ttl_ms: int | None = None
        if ttl is not None:
            self.ttl_ms = to_millis(ttl, f"{type(self).__name__} ttl")
            if self.ttl_ms <= 0:
                raise StateUsageError(f"{type(self).__name__} ttl must be positive, got {ttl!r}")

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.owner = name, owner.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        scope = obj.__dict__.get("_hr_scope")
        if scope is None:
            raise StateUsageError(
                f"state {self.owner}.{self.name} was used outside process() and on_timer(): state belongs to "
                "a key, so it can only be read or written while a record or a timer of that key is handled")
        return scope.handle(self)

    def __set__(self, obj: Any, value: Any) -> None:
        raise StateUsageError(f"{self.owner}.{self.name} is declared state: write it through its handle "
                              f"(self.{self.name}.set(...), .append(...) or .put(...)), not by assignment")

    def expiry(self, now: int) -> float:
        """When an entry written at processing time ``now`` expires (NEVER without a ttl)."""
        return NEVER if self.ttl_ms is None else now + self.ttl_ms

    def describe(self) -> str:
        ttl = f", ttl {self.ttl_ms} ms" if self.ttl_ms else ""
        return f"{self.kind}{ttl}"


class ValueState(State):
    """One value per key: ``get()``, ``set(v)``, ``exists()``, ``clear()``."""

    kind = "value"

    def __init__(self, *, default: Any = None, ttl: object = None) -> None:
        super().__init__(ttl=ttl)
        self.default = default


class ListState(State):
    """A list per key: ``get()``, ``append(v)``, ``extend(vs)``, ``set(vs)``, ``clear()``, ``len()``.
    With a ttl, each element expires on its own."""

    kind = "list"


class MapState(State):
    """A dict per key: ``get(k, default)``, ``put(k, v)``, ``remove(k)``, ``contains(k)``,
    ``keys()``, ``values()``, ``items()``, ``clear()``, ``len()``. With a ttl, each entry
    expires on its own."""

    kind = "map"
