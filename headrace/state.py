"""The state a keyed process function declares: value, list and map state, each with an
optional time-to-live, free of Spark.

A function declares its state as class attributes (``count = hr.ValueState(default=0)``).
While it handles a record or a timer, reading such an attribute gives a handle on the
state of the key being processed; anywhere else it is an error, since state belongs to a
key. Each entry remembers when it expires (``ttl`` after it was last written, in
processing time); expired entries read as absent and are swept away.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from headrace.durations import to_millis

Cells = dict[str, Any]  # one key's state: declared name -> stored entries

NEVER = math.inf


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
        return self.handle(scope)

    def __set__(self, obj: Any, value: Any) -> None:
        raise StateUsageError(f"{self.owner}.{self.name} is declared state: write it through its handle "
                              f"(self.{self.name}.set(...), .append(...) or .put(...)), not by assignment")

    def handle(self, scope: KeyScope) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        ttl = f", ttl {self.ttl_ms} ms" if self.ttl_ms else ""
        return f"{self.kind}{ttl}"


class KeyScope:
    """The state of the key being processed, at processing time ``now``."""

    __slots__ = ("cells", "now", "instance")

    def __init__(self, cells: Cells, now: int, instance: Any) -> None:
        self.cells, self.now, self.instance = cells, now, instance

    def expires(self, state: State) -> float:
        if state.ttl_ms is None:
            return NEVER
        expiry = self.now + state.ttl_ms
        self.instance.next_expiry = min(self.instance.next_expiry, expiry)
        return expiry


class ValueState(State):
    """One value per key: ``get()``, ``set(v)``, ``exists()``, ``clear()``."""

    kind = "value"

    def __init__(self, *, default: Any = None, ttl: object = None) -> None:
        super().__init__(ttl=ttl)
        self.default = default

    def handle(self, scope: KeyScope) -> ValueHandle:
        return ValueHandle(self, scope)


class ValueHandle:
    __slots__ = ("state", "scope")

    def __init__(self, state: ValueState, scope: KeyScope) -> None:
        self.state, self.scope = state, scope

    def exists(self) -> bool:
        entry = self.scope.cells.get(self.state.name)
        return entry is not None and entry[1] > self.scope.now

    def get(self) -> Any:
        entry = self.scope.cells.get(self.state.name)
        if entry is None or entry[1] <= self.scope.now:
            return self.state.default
        return entry[0]

    def set(self, value: Any) -> None:
        self.scope.cells[self.state.name] = (value, self.scope.expires(self.state))

    def clear(self) -> None:
        self.scope.cells.pop(self.state.name, None)


class ListState(State):
    """A list per key: ``get()``, ``append(v)``, ``extend(vs)``, ``set(vs)``, ``clear()``, ``len()``.
    With a ttl, each element expires on its own."""

    kind = "list"

    def handle(self, scope: KeyScope) -> ListHandle:
        return ListHandle(self, scope)


class ListHandle:
    __slots__ = ("state", "scope")

    def __init__(self, state: ListState, scope: KeyScope) -> None:
        self.state, self.scope = state, scope

    def _live(self) -> list[tuple[Any, float]]:
        return [e for e in self.scope.cells.get(self.state.name, ()) if e[1] > self.scope.now]

    def get(self) -> list[Any]:
        return [value for value, _ in self._live()]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.get())

    def __len__(self) -> int:
        return len(self._live())

    def append(self, value: Any) -> None:
        self.scope.cells.setdefault(self.state.name, []).append((value, self.scope.expires(self.state)))

    def extend(self, values: Any) -> None:
        for value in values:
            self.append(value)

    def set(self, values: Any) -> None:
        self.clear()
        self.extend(values)

    def clear(self) -> None:
        self.scope.cells.pop(self.state.name, None)


class MapState(State):
    """A dict per key: ``get(k, default)``, ``put(k, v)``, ``remove(k)``, ``contains(k)``,
    ``keys()``, ``values()``, ``items()``, ``clear()``, ``len()``. With a ttl, each entry
    expires on its own."""

    kind = "map"

    def handle(self, scope: KeyScope) -> MapHandle:
        return MapHandle(self, scope)


class MapHandle:
    __slots__ = ("state", "scope")

    def __init__(self, state: MapState, scope: KeyScope) -> None:
        self.state, self.scope = state, scope

    def _entries(self) -> dict[Any, tuple[Any, float]]:
        return self.scope.cells.get(self.state.name, {})  # type: ignore[no-any-return]

    def get(self, key: Any, default: Any = None) -> Any:
        entry = self._entries().get(key)
        return default if entry is None or entry[1] <= self.scope.now else entry[0]

    def contains(self, key: Any) -> bool:
        entry = self._entries().get(key)
        return entry is not None and entry[1] > self.scope.now

    __contains__ = contains

    def put(self, key: Any, value: Any) -> None:
        self.scope.cells.setdefault(self.state.name, {})[key] = (value, self.scope.expires(self.state))

    def remove(self, key: Any) -> None:
        self._entries().pop(key, None)

    def items(self) -> list[tuple[Any, Any]]:
        now = self.scope.now
        return [(k, v) for k, (v, expiry) in self._entries().items() if expiry > now]

    def keys(self) -> list[Any]:
        return [k for k, _ in self.items()]

    def values(self) -> list[Any]:
        return [v for _, v in self.items()]

    def __len__(self) -> int:
        return len(self.items())

    def clear(self) -> None:
        self.scope.cells.pop(self.state.name, None)


def sweep(cells: Cells, now: int) -> float:
    """Drop the entries of one key that expired by ``now``; returns the next expiry left."""
    upcoming = NEVER
    for name in list(cells):
        stored = cells[name]
        if isinstance(stored, tuple):
            if stored[1] <= now:
                del cells[name]
            else:
                upcoming = min(upcoming, stored[1])
            continue
        if isinstance(stored, list):
            stored[:] = [e for e in stored if e[1] > now]
            expiries = [e[1] for e in stored]
        else:
            for k in [k for k, e in stored.items() if e[1] <= now]:
                del stored[k]
            expiries = [e[1] for e in stored.values()]
        if not stored:
            del cells[name]
        else:
            upcoming = min(upcoming, *expiries)
    return upcoming
