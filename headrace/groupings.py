"""Groupings: which instance (Apex partition, Storm task) of an operator a record goes to.

A grouping only computes instance indexes; the instances' state is their own. Every grouping
is deterministic, so a replayed micro-batch routes each record as the first run did:

* ``Shuffle()``: round robin over the instances, in the order the emitter emits (Storm's
  shuffle grouping, made replayable).
* ``Fields("word")``: a stable hash of the fields' values modulo the instances (``stable_hash``:
  CRC-32 of a canonical encoding, never Python's salted ``hash()``), so a word always goes to the
  same instance, in every run.
* ``All()``: a copy to every instance (Storm's all grouping, Apex's broadcast).
* ``Global()``: instance 0.
* ``Direct()``: the instance the emitter names with ``emit_direct(task, ...)``.
* ``LocalOrShuffle()``: the instance with the emitter's own index when there is one (records
  stay in their Python stage), else round robin.
* ``PartialKey("word")``: of the two instances two hashes of the fields pick, the one this
  emitter has sent fewer records to so far in the window (Storm's partial key grouping).
* ``Custom(fn)``: ``fn(record, instances)`` returns the index (or indexes) itself, e.g. a mask
  over a key, like Apex's partition keys.

>>> Fields("word").targets({"word": "storm"}, 4, emitter=0, sent=[0] * 4)
[2]
>>> [Shuffle().targets({}, 3, emitter=0, sent=s) for s in ([0, 0, 0], [1, 0, 0], [1, 1, 0])]
[[0], [1], [2]]
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.code_locations import function_label


def stable_hash(values: Sequence[Any]) -> int:
    """A hash of ``values`` that is the same in every process and every run.

    >>> stable_hash(["storm"]) == stable_hash(["storm"]), stable_hash([1]) != stable_hash(["1"])
    (True, True)
    """
    encoded = json.dumps(list(values), sort_keys=True, default=repr, separators=(",", ":"))
    return zlib.crc32(encoded.encode("utf-8"))


def field_values(record: Any, fields: Sequence[str]) -> list[Any]:
    """The values of ``fields`` in a record: a dict, an object with attributes, or a Storm tuple."""
    if isinstance(record, dict):
        return [record.get(f) for f in fields]
    getter = getattr(record, "value_by_field", None)
    if getter is not None:
        return [getter(f) for f in fields]
    return [getattr(record, f, None) for f in fields]


@dataclass(frozen=True)
class Grouping:
    """Routes one record to instance indexes. ``sent[i]``: records this emitter has sent to
    instance ``i`` through this stream in the current window (the round-robin cursor)."""

    name = "grouping"

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {"type": self.name}

    def describe(self) -> str:
        return self.name


@dataclass(frozen=True)
class Shuffle(Grouping):
    name = "shuffle"

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        return [sum(sent) % instances]


@dataclass(frozen=True)
class Fields(Grouping):
    fields: tuple[str, ...] = ()
    name = "fields"

    def __init__(self, *fields: str) -> None:
        if not fields or not all(isinstance(f, str) and f for f in fields):
            raise ValueError(f"a fields grouping needs field names, e.g. Fields('word'); got {fields!r}")
        object.__setattr__(self, "fields", tuple(fields))

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        return [stable_hash(field_values(record, self.fields)) % instances]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.name, "fields": list(self.fields)}

    def describe(self) -> str:
        return f"fields({', '.join(self.fields)})"


@dataclass(frozen=True)
class All(Grouping):
    name = "all"

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        return list(range(instances))


@dataclass(frozen=True)
class Global(Grouping):
    name = "global"

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        return [0]


@dataclass(frozen=True)
class Direct(Grouping):
    """The emitter chooses: ``emit_direct(task, ...)``; a plain ``emit`` on a direct stream fails."""

    name = "direct"

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        raise ValueError("this stream has a direct grouping: emit on it with emit_direct(task, ...)")


@dataclass(frozen=True)
class LocalOrShuffle(Grouping):
    name = "local_or_shuffle"

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        return [emitter] if emitter < instances else [sum(sent) % instances]


@dataclass(frozen=True)
class PartialKey(Grouping):
    fields: tuple[str, ...] = ()
    name = "partial_key"

    def __init__(self, *fields: str) -> None:
        if not fields or not all(isinstance(f, str) and f for f in fields):
            raise ValueError(f"a partial key grouping needs field names, e.g. PartialKey('word'); got {fields!r}")
        object.__setattr__(self, "fields", tuple(fields))

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        values = field_values(record, self.fields)
        first = stable_hash(values) % instances
        second = stable_hash([*values, "second choice"]) % instances
        return [second if sent[second] < sent[first] else first]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.name, "fields": list(self.fields)}

    def describe(self) -> str:
        return f"partial_key({', '.join(self.fields)})"


@dataclass(frozen=True)
class Custom(Grouping):
    """``fn(record, instances)`` returns an instance index or a list of them."""

    fn: Callable[[Any, int], Any] = None  # type: ignore[assignment]
    name = "custom"

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        chosen = self.fn(record, instances)
        indexes = list(chosen) if isinstance(chosen, (list, tuple, set, frozenset)) else [chosen]
        for index in indexes:
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < instances:
                raise ValueError(f"the custom grouping {function_label(self.fn)} returned {chosen!r}; it must "
                                 f"return an instance index from 0 to {instances - 1} (or a list of them)")
        return indexes

    def to_json(self) -> dict[str, Any]:
        return {"type": self.name, "fn": function_label(self.fn)}

    def describe(self) -> str:
        return f"custom({function_label(self.fn)})"


def grouping_of(value: Any, where: str) -> Grouping:
    """A grouping given as an object, or by name: ``"shuffle"``, ``"all"``, ``"global"``, ``"direct"``,
    ``"local_or_shuffle"``."""
    if isinstance(value, Grouping):
        return value
    named = {"shuffle": Shuffle, "all": All, "global": Global, "direct": Direct, "local_or_shuffle": LocalOrShuffle}
    if isinstance(value, str) and value in named:
        return named[value]()
    raise ValueError(f"{where}: grouping must be a headrace grouping (hr.groupings.Fields('word'), Shuffle(), "
                     f"All(), Global(), Direct(), LocalOrShuffle(), PartialKey(...), Custom(fn)) or one of "
                     f"{', '.join(map(repr, named))}; got {value!r}")
