"""Families of value classes that describe and serialise themselves, each class found by its
``kind`` (window shapes, triggers, early firings): a new member of a family is one class."""

from __future__ import annotations

from typing import Any, ClassVar

from headrace.errors import PlanError


class Kind:
    """A family's base sets ``KINDS = {}`` and ``family`` (for errors); each subclass that sets
    ``kind`` is registered there under it."""

    kind: ClassVar[str]
    family: ClassVar[str]
    KINDS: ClassVar[dict[str, type[Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            cls.KINDS[cls.kind] = cls

    @classmethod
    def of_kind(cls, kind: object) -> type[Any]:
        """The class registered as ``kind`` in the family of ``cls``."""
        found = cls.KINDS.get(str(kind))
        if found is None:
            raise PlanError(f"unknown {cls.family} {kind!r}; known: {', '.join(cls.KINDS)}")
        return found

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    def describe(self) -> str:
        """For ``explain``."""
        raise NotImplementedError

    def brief(self) -> str:
        """For a restart's refusal (``describe`` unless shorter is clearer)."""
        return self.describe()
