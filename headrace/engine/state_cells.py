"""The per-key state cells behind ``hr.ValueState``, ``hr.ListState`` and ``hr.MapState``,
free of Spark.

One key's state is a :data:`Cells` dict: declared name -> stored entries, each entry a
``(value, expiry)`` pair (a value state holds one, a list state a list of them, a map state a
dict of them). While the engine handles a record or a timer of a key it sets a
:class:`KeyScope` on the function instance; a declaration read there returns the matching
handle (``ValueHandle``, ``ListHandle``, ``MapHandle``). :func:`sweep` drops expired entries.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from headrace.state import NEVER, ListState, MapState, State, StateUsageError, ValueState

Cells = dict[str, Any]  # one key's state: declared name -> stored entries


class KeyScope:
    """The state of the key being processed, at processing time ``now``."""

    __slots__ = ("cells", "now", "instance")

    def __init__(self, cells: Cells, now: int, instance: Any) -> None:
        self.cells, self.now, self.instance = cells, now, instance

    def handle(self, state: State) -> Any:
        """The handle on ``state`` for this key (what ``self.<name>`` gives the function)."""
        make = HANDLES.get(type(state))
        if make is None:  # a subclass of a declaration
            make = next((HANDLES[k] for k in type(state).__mro__ if k in HANDLES), None)
            if make is None:
                raise StateUsageError(f"{state.owner}.{state.name} is a {type(state).__name__}; declare state "
                                      "as hr.ValueState, hr.ListState or hr.MapState")
        return make(state, self)

    def expires(self, state: State) -> float:
        """The expiry of an entry of ``state`` written now; the instance learns its next sweep."""
        expiry = state.expiry(self.now)
        if expiry != NEVER:
            self.instance.next_expiry = min(self.instance.next_expiry, expiry)
        return expiry


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


# The handle each declaration gives while a key is handled.
HANDLES: dict[type, Any] = {ValueState: ValueHandle, ListState: ListHandle, MapState: MapHandle}


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
