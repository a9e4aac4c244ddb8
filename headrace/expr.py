"""Column expressions as plain data: built without Spark, lowered to Spark columns by the compiler.

>>> e = (col("price") * 2 > 10) & col("kind").isin("view", "click")
>>> sorted(e.columns())
['kind', 'price']
>>> e.to_json()["op"]
'and'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headrace.schema import normalise_type

BINARY_OPS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "mod": "%",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "and": "&", "or": "|",
}


def _wrap(value: Any) -> Expr:
    return value if isinstance(value, Expr) else Expr("lit", (value,))


@dataclass(frozen=True, eq=False)
class Expr:
    """A node of a column expression: ``op`` and its arguments (sub-expressions or constants)."""

    op: str
    args: tuple[Any, ...]

    # Comparison and arithmetic build new expressions, like Spark's Column.
    def _bin(self, op: str, other: Any) -> Expr:
        return Expr(op, (self, _wrap(other)))

    def __add__(self, other: Any) -> Expr: return self._bin("add", other)
    def __sub__(self, other: Any) -> Expr: return self._bin("sub", other)
    def __mul__(self, other: Any) -> Expr: return self._bin("mul", other)
    def __truediv__(self, other: Any) -> Expr: return self._bin("div", other)
    def __mod__(self, other: Any) -> Expr: return self._bin("mod", other)
    def __radd__(self, other: Any) -> Expr: return _wrap(other)._bin("add", self)
    def __rsub__(self, other: Any) -> Expr: return _wrap(other)._bin("sub", self)
    def __rmul__(self, other: Any) -> Expr: return _wrap(other)._bin("mul", self)
    def __eq__(self, other: Any) -> Expr: return self._bin("eq", other)  # type: ignore[override]
    def __ne__(self, other: Any) -> Expr: return self._bin("ne", other)  # type: ignore[override]
    def __lt__(self, other: Any) -> Expr: return self._bin("lt", other)
    def __le__(self, other: Any) -> Expr: return self._bin("le", other)
    def __gt__(self, other: Any) -> Expr: return self._bin("gt", other)
    def __ge__(self, other: Any) -> Expr: return self._bin("ge", other)
    def __and__(self, other: Any) -> Expr: return self._bin("and", other)
    def __or__(self, other: Any) -> Expr: return self._bin("or", other)
    def __invert__(self) -> Expr: return Expr("not", (self,))
    def __neg__(self) -> Expr: return Expr("neg", (self,))
    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise TypeError("a column expression has no truth value; combine conditions with & | ~, not and/or/not")

    def isin(self, *values: Any) -> Expr:
        return Expr("isin", (self, *values))

    def is_null(self) -> Expr:
        return Expr("is_null", (self,))

    def is_not_null(self) -> Expr:
        return Expr("is_not_null", (self,))

    def cast(self, type_name: str) -> Expr:
        return Expr("cast", (self, normalise_type(type_name, "cast")))

    def alias(self, name: str) -> Expr:
        return Expr("alias", (self, name))

    def lower(self) -> Expr:
        return Expr("lower", (self,))

    def upper(self) -> Expr:
        return Expr("upper", (self,))

    def columns(self) -> set[str]:
        """Names of the columns this expression reads (``expr(sql)`` reads unknown ones)."""
        if self.op == "col":
            return {self.args[0]}
        found: set[str] = set()
        for arg in self.args:
            if isinstance(arg, Expr):
                found |= arg.columns()
        return found

    def output_name(self) -> str | None:
        """The column name this expression produces in a select, when it has one."""
        if self.op == "alias":
            return str(self.args[1])
        if self.op == "col":
            return str(self.args[0])
        return None

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op,
                "args": [a.to_json() if isinstance(a, Expr) else a for a in self.args]}

    def __repr__(self) -> str:
        if self.op == "col":
            return f"col({self.args[0]!r})"
        if self.op == "lit":
            return repr(self.args[0])
        if self.op == "sql":
            return f"expr({self.args[0]!r})"
        if self.op in BINARY_OPS:
            return f"({self.args[0]!r} {BINARY_OPS[self.op]} {self.args[1]!r})"
        return f"{self.op}({', '.join(repr(a) for a in self.args)})"


def col(name: str) -> Expr:
    """A column of the stream by name."""
    return Expr("col", (name,))


def lit(value: Any) -> Expr:
    """A constant."""
    return Expr("lit", (value,))


def expr(sql: str) -> Expr:
    """A Spark SQL expression, for anything the operators above do not cover.
    Its columns are not checked when the plan is built."""
    return Expr("sql", (sql,))
