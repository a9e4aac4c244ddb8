"""Turn headrace column expressions into Spark columns."""

from __future__ import annotations

import operator
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

from headrace.aggregates import Agg
from headrace.expr import Expr

_BINARY = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "mod": operator.mod, "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
    "gt": operator.gt, "ge": operator.ge, "and": operator.and_, "or": operator.or_,
}


def to_column(e: Expr) -> Column:
    args: list[Any] = [to_column(a) if isinstance(a, Expr) else a for a in e.args]
    if e.op == "col":
        return F.col(f"`{args[0]}`")
    if e.op == "lit":
        return F.lit(args[0])
    if e.op == "sql":
        return F.expr(args[0])
    if e.op in _BINARY:
        return _BINARY[e.op](args[0], args[1])  # type: ignore[no-any-return]
    if e.op == "not":
        return ~args[0]
    if e.op == "neg":
        return -args[0]
    if e.op == "isin":
        return args[0].isin(*args[1:])  # type: ignore[no-any-return]
    if e.op == "is_null":
        return args[0].isNull()  # type: ignore[no-any-return]
    if e.op == "is_not_null":
        return args[0].isNotNull()  # type: ignore[no-any-return]
    if e.op == "cast":
        return args[0].cast(args[1])  # type: ignore[no-any-return]
    if e.op == "alias":
        return args[0].alias(args[1])  # type: ignore[no-any-return]
    if e.op == "lower":
        return F.lower(args[0])
    if e.op == "upper":
        return F.upper(args[0])
    raise ValueError(f"unknown expression operator {e.op!r}")


_AGGREGATES: dict[str, Any] = {
    "count": lambda c: F.count(F.lit(1)),
    "sum": lambda c: F.sum(F.col(f"`{c}`")),
    "min": lambda c: F.min(F.col(f"`{c}`")),
    "max": lambda c: F.max(F.col(f"`{c}`")),
    "mean": lambda c: F.avg(F.col(f"`{c}`")),
}


def aggregate_columns(aggs: tuple[tuple[str, Agg], ...]) -> list[Column]:
    """Spark's own aggregate for each built-in aggregate, named as the step names it."""
    return [_AGGREGATES[agg.func](agg.column).alias(name) for name, agg in aggs]
