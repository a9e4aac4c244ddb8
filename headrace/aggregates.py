"""What a keyed stream or a window computes: the built-in aggregates (``hr.count()``,
``hr.sum(col)``, ...) and the base class of user aggregate functions (``hr.AggregateFunction``).

>>> count(), sum("price")
(count(), sum('price'))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FUNCTIONS = ("count", "sum", "min", "max", "mean")


@dataclass(frozen=True)
class Agg:
    """One aggregate: a function over a column (``count`` needs none)."""

    func: str
    column: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"func": self.func, "column": self.column}

    def __repr__(self) -> str:
        return f"{self.func}({self.column!r})" if self.column else f"{self.func}()"


def count() -> Agg:
    """The number of records."""
    return Agg("count")


def sum(column: str) -> Agg:  # noqa: A001 - mirrors the aggregate's name
    """The sum of a numeric column."""
    return Agg("sum", column)


def min(column: str) -> Agg:  # noqa: A001
    """The smallest value of a column."""
    return Agg("min", column)


def max(column: str) -> Agg:  # noqa: A001
    """The largest value of a column."""
    return Agg("max", column)


def mean(column: str) -> Agg:
    """The arithmetic mean of a numeric column."""
    return Agg("mean", column)


class AggregateFunction:
    """Base for user aggregate functions: subclass and implement the four methods.

    ``merge`` is used when session windows merge; ``result`` returns the output record (a dict).
    """

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, accumulator: Any, record: dict[str, Any]) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, accumulator: Any) -> dict[str, Any]:
        raise NotImplementedError


def result_type(agg: Agg, input_type: str | None) -> str | None:
    """The type of an aggregate's result, when the input type is known."""
    if agg.func == "count":
        return "long"
    if agg.func == "mean":
        return "double"
    if agg.func == "sum" and input_type in ("int", "long"):
        return "long"
    if agg.func == "sum":
        return "double" if input_type in ("float", "double") else input_type
    return input_type


__all__ = ["Agg", "AggregateFunction", "count", "sum", "min", "max", "mean", "FUNCTIONS", "result_type"]
