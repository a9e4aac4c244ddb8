"""Column expressions (``headrace/expr.py``) evaluated on one record in plain Python, with SQL's
rules: a comparison or arithmetic with null is null, a filter passes only true, ``and``/``or``
follow three-valued logic, integer division by zero is null."""

from __future__ import annotations

import datetime
import math
import operator
from collections.abc import Callable
from typing import Any

from headrace.errors import PlanError
from headrace.expr import Expr

Row = dict[str, Any]

_ARITHMETIC: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul}
_COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge}
_CASTS: dict[str, Callable[[Any], Any]] = {
    "string": str, "long": int, "int": int, "double": float, "float": float, "boolean": bool}


def refusal(e: Expr) -> str | None:
    """Why the local runner cannot evaluate ``e`` (None: it can)."""
    if e.op == "sql":
        return f"the SQL expression {e!r} needs Spark's SQL parser"
    if e.op == "cast" and e.args[1] not in _CASTS:
        return f"a cast to {e.args[1]} is Spark's"
    known = {"col", "lit", "not", "neg", "isin", "is_null", "is_not_null", "cast", "alias", "lower", "upper",
             "div", "mod", "and", "or", *_ARITHMETIC, *_COMPARISONS}
    if e.op not in known:
        return f"the expression {e!r} ({e.op}) is Spark's"
    for arg in e.args:
        if isinstance(arg, Expr) and (why := refusal(arg)) is not None:
            return why
    return None


def evaluate(e: Expr, row: Row) -> Any:
    """The value of ``e`` for ``row`` (None is SQL's null)."""
    op, args = e.op, e.args
    if op == "col":
        return row[args[0]]
    if op == "lit":
        return args[0]
    if op == "alias":
        return evaluate(args[0], row)
    if op in ("and", "or"):
        return _logical(op, evaluate(args[0], row), evaluate(args[1], row))
    if op in ("is_null", "is_not_null"):
        return (evaluate(args[0], row) is None) == (op == "is_null")
    if op == "isin":
        value = evaluate(args[0], row)
        return None if value is None else value in args[1:]
    if op == "cast":
        value = evaluate(args[0], row)
        return None if value is None else _CASTS[args[1]](value)
    values = [evaluate(a, row) if isinstance(a, Expr) else a for a in args]
    if any(v is None for v in values):
        return None
    if op == "not":
        return not values[0]
    if op == "neg":
        return -values[0]
    if op in ("lower", "upper"):
        return values[0].lower() if op == "lower" else values[0].upper()
    if op == "div":  # SQL's / is a division of doubles; by zero it is null
        return None if values[1] == 0 else values[0] / values[1]
    if op == "mod":  # Spark's % keeps the dividend's sign; by zero it is null
        return None if values[1] == 0 else _remainder(values[0], values[1])
    if op in _ARITHMETIC:
        return _ARITHMETIC[op](values[0], values[1])
    return _COMPARISONS[op](*_comparable(values[0], values[1]))


def _logical(op: str, a: Any, b: Any) -> Any:
    if op == "and":
        if a is False or b is False:
            return False
        return None if a is None or b is None else True
    if a is True or b is True:
        return True
    return None if a is None or b is None else False


def _remainder(a: Any, b: Any) -> Any:
    if isinstance(a, int) and isinstance(b, int):
        result = abs(a) % abs(b)
        return -result if a < 0 else result
    return math.fmod(a, b)


def _comparable(a: Any, b: Any) -> tuple[Any, Any]:
    """A timestamp compared with a string literal reads the string as a time, as Spark does."""
    if isinstance(a, datetime.datetime) and isinstance(b, str):
        return a, _timestamp(b)
    if isinstance(b, datetime.datetime) and isinstance(a, str):
        return _timestamp(a), b
    return a, b


def _timestamp(text: str) -> datetime.datetime:
    moment = datetime.datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def check(e: Expr, step: str, where: str) -> None:
    """Refuse, before running, an expression the local runner cannot evaluate."""
    why = refusal(e)
    if why is not None:
        raise PlanError(f"step '{step}' ({where}): the local runner cannot evaluate this: {why}; run the pipeline "
                        "on Spark with headrace.testing.run_to_completion")
