"""Top-N per key in SQL: ``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...)`` filtered to the
first N rows, as NEXMark writes it (docs/sql.md, "Top N per key")::

    SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number
                     FROM bids)
     WHERE rank_number <= 10

Spark runs no OVER window on a stream. The same rows come from an aggregate Spark does run: per
partition key (and window, when the PARTITION BY holds a ``window(...)`` call), the N first rows
by the ORDER BY, exploded with each row's position as its rank. Spark's ``max_by(row, order, N)``
keeps only those N per key in its state; when the ORDER BY cannot be written as one order struct
for it (an ascending key that is not a number or a time), the key's whole list of rows is kept,
sorted and cut to N. Without
a window it is an aggregate in update mode: each micro-batch emits, for each key it touched, the
key's whole top N, ranks 1 to N, so a sink that keeps a row by (key, rank) holds the current top
N. With a window it is a windowed aggregate in append mode: each window's top N once.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect

RANK_FUNCTIONS = (exp.RowNumber,)
ORDER, ROW, TOP, RANK, ITEM = "_hr_order", "_hr_row", "_hr_top", "_hr_rank", "_hr_item"


@dataclass(frozen=True)
class TopN:
    """The parts of a top-N query: the subquery that numbers the rows, its OVER, the rank's name
    and N."""

    inner: exp.Select
    over: exp.Window
    rank: str
    limit: int


def _limit(where: exp.Expr, rank: str) -> int | None:
    """N of ``rank <= N``, ``rank < N + 1`` or ``rank = 1`` (N ≥ 1), else None."""
    if not isinstance(where, (exp.LTE, exp.LT, exp.EQ)):
        return None
    column, bound = where.this, where.expression
    if not (isinstance(column, exp.Column) and column.name == rank and not column.table
            and isinstance(bound, exp.Literal) and not bound.is_string):
        return None
    value = int(bound.this) - (1 if isinstance(where, exp.LT) else 0)
    if isinstance(where, exp.EQ) and value != 1:
        return None
    return value if value >= 1 else None


def find_top_n(tree: exp.Expr) -> TopN | None:
    """The query's top N, when it is exactly that: an outer SELECT (no GROUP BY, no other
    condition) over one subquery that numbers its rows with ROW_NUMBER() OVER (PARTITION BY ...
    ORDER BY ...), filtered to the first N."""
    if not isinstance(tree, exp.Select) or tree.args.get("group") or tree.args.get("joins"):
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    inner = source.this.this if source is not None and isinstance(source.this, exp.Subquery) else None
    where = tree.args.get("where")
    if not isinstance(inner, exp.Select) or where is None or inner.args.get("group") or inner.args.get("having"):
        return None
    if any(isinstance(n, exp.AggFunc) for n in inner.find_all(exp.AggFunc)):
        return None
    numbered = [e for e in inner.expressions if isinstance(e, exp.Alias) and isinstance(e.this, exp.Window)]
    if len(numbered) != 1 or len(list(tree.find_all(exp.Window))) != 1:
        return None
    over = numbered[0].this
    if not isinstance(over.this, RANK_FUNCTIONS) or not over.args.get("partition_by") or not over.args.get("order"):
        return None
    limit = _limit(where.this, numbered[0].alias)
    return TopN(inner, over, numbered[0].alias, limit) if limit is not None else None


def is_window_call(node: exp.Expr) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() == "window"


def _comparator(order: list[exp.Ordered]) -> str:
    """A lambda for ``array_sort``: the ORDER BY, on the fields k0, k1, ... of each row's order struct."""
    cases = []
    for number, key in enumerate(order):
        first, last = ("1", "-1") if key.args.get("desc") else ("-1", "1")
        left, right = f"l.{ORDER}.k{number}", f"r.{ORDER}.k{number}"
        cases.append(f"WHEN {left} < {right} THEN {first} WHEN {left} > {right} THEN {last}")
        nulls_first = bool(key.args.get("nulls_first"))  # sqlglot spells out each key's null order
        cases.append(f"WHEN {left} IS NULL AND {right} IS NOT NULL THEN {'-1' if nulls_first else '1'} "
                     f"WHEN {left} IS NOT NULL AND {right} IS NULL THEN {'1' if nulls_first else '-1'}")
    return f"(l, r) -> CASE {' '.join(cases)} ELSE 0 END"


# How a key of a type is turned the other way round, for max_by: numbers and times.
_REVERSED = {"tinyint": "-({})", "smallint": "-({})", "int": "-({})", "bigint": "-({})", "float": "-({})",
             "double": "-({})", "timestamp": "-unix_micros({})", "timestamp_ntz": "-unix_micros({})",
             "date": "-unix_date({})"}


def _bounded_top(order: list[exp.Ordered], types: dict[str, str], row: str, limit: int,
                 dialect: type[Dialect]) -> exp.Expr | None:
    """``max_by(row, order, N)`` (Spark 4.2: a heap of N rows per key), whose order struct ranks
    the rows as the ORDER BY does: per key a flag that puts its nulls where the ORDER BY wants
    them, then the key, turned round when it is ascending. None when a key that must be turned
    round is not a column of a number or a time (``types``: the input columns' Spark types)."""
    fields = []
    for key in order:
        sql = key.this.sql(dialect=dialect)
        nulls_first = bool(key.args.get("nulls_first"))
        fields.append(f"{sql} IS NULL" if nulls_first else f"{sql} IS NOT NULL")
        if key.args.get("desc"):
            fields.append(sql)
            continue
        kind = types.get(key.this.name) if isinstance(key.this, exp.Column) else None
        if kind not in _REVERSED:
            return None
        fields.append(_REVERSED[kind].format(sql))
    ranking = ", ".join(f"{field} AS o{n}" for n, field in enumerate(fields))
    # an anonymous call: sqlglot reads max_by as its ArgMax, which drops the third argument
    arguments = [exp.maybe_parse(f"struct(struct({row}) AS {ROW})", dialect=dialect),
                 exp.maybe_parse(f"struct({ranking})", dialect=dialect), exp.Literal.number(limit)]
    return exp.alias_(exp.Anonymous(this="max_by", expressions=arguments), TOP)


def top_n_as_aggregate(tree: exp.Select, top: TopN, dialect: type[Dialect], types: dict[str, str]) -> str:
    """The query with its numbered subquery as the aggregate that gives the same rows (see the
    module's docstring); ``types``: the Spark types of the input columns, by name."""
    kept = [e for e in top.inner.expressions if not (isinstance(e, exp.Alias) and e.this is top.over)]
    partition = list(top.over.args["partition_by"])
    order = list(top.over.args["order"].expressions)
    windows = [p for p in partition if is_window_call(p)]
    keys = ", ".join(f"{key.this.sql(dialect=dialect)} AS k{n}" for n, key in enumerate(order))
    row = ", ".join(e.sql(dialect=dialect) for e in kept)
    top_rows = _bounded_top(order, types, row, top.limit, dialect) or exp.maybe_parse(
        f"slice(array_sort(collect_list(struct(struct({keys}) AS {ORDER}, struct({row}) AS {ROW})), "
        f"{_comparator(order)}), 1, {top.limit}) AS {TOP}", dialect=dialect)
    grouped = top.inner.copy()
    grouped.set("expressions", [top_rows] + [exp.alias_(w.copy(), "window") for w in windows])
    grouped.set("group", exp.Group(expressions=[p.copy() for p in partition]))
    window_column = ", window" if windows else ""
    exploded = (f"SELECT {ITEM}.{ROW}.*{window_column}, {RANK} + 1 AS {top.rank} "
                f"FROM ({grouped.sql(dialect=dialect)}) LATERAL VIEW posexplode({TOP}) AS {RANK}, {ITEM}")
    outer = tree.copy()
    outer.set("where", None)
    placeholder = "SELECT * FROM _hr_top_n"  # put in as text: parsed again, max_by would lose its N
    outer.args["from_"].this.set("this", exp.maybe_parse(placeholder, dialect=dialect))
    return outer.sql(dialect=dialect).replace(placeholder, exploded, 1)
