"""SQL queries that join streams, checked at plan time with sqlglot (docs/sql.md, docs/joins.md).

Spark runs a join of two streams with its stream-stream join, which keeps the records of
both sides in its state until the watermark shows that no match can come. It can tell that
only from the join's condition, when the condition bounds one side's event time by the
other's from below and from above; without that bound Spark keeps every record forever. So
each stream joined in a query must be bounded that way in its ON clause, and every stream
the query reads needs its event time.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

# A comparison ``a op b`` bounds a's side from below (">", ">=") or from above ("<", "<=").
_FROM_BELOW = (exp.GT, exp.GTE)
_FROM_ABOVE = (exp.LT, exp.LTE)


@dataclass(frozen=True)
class StreamSide:
    """A stream the query reads: the name it goes by in the query (its alias, else its name)
    and its event-time field."""

    name: str
    event_time: str


class Unbounded(Exception):
    def __init__(self, message: str, node: exp.Expr) -> None:
        super().__init__(message)
        self.message, self.node = message, node


def _side_of(expression: exp.Expr, sides: list[StreamSide]) -> StreamSide | None:
    """The stream whose event time ``expression`` reads (alone among the streams' event times)."""
    found = set()
    for column in expression.find_all(exp.Column):
        for side in sides:
            if column.name == side.event_time and column.table in (side.name, ""):
                if column.table or sum(s.event_time == column.name for s in sides) == 1:
                    found.add(side)
    return found.pop() if len(found) == 1 else None


def _bounds(condition: exp.Expr, side: StreamSide, sides: list[StreamSide]) -> tuple[bool, bool]:
    """Whether ``condition`` bounds ``side``'s event time by another stream's from below and
    from above."""
    below = above = False

    def other(expression: exp.Expr) -> bool:
        found = _side_of(expression, sides)
        return found is not None and found != side

    for node in condition.find_all(exp.Between, *_FROM_BELOW, *_FROM_ABOVE):
        if isinstance(node, exp.Between):
            value, low, high = node.this, node.args["low"], node.args["high"]
            if _side_of(value, sides) == side:
                below, above = below or other(low), above or other(high)
            elif other(value):
                below = below or _side_of(high, sides) == side  # value <= high: high bounded from below
                above = above or _side_of(low, sides) == side
            continue
        left, right = node.this, node.expression
        if _side_of(left, sides) == side and other(right):
            below, above = below or isinstance(node, _FROM_BELOW), above or isinstance(node, _FROM_ABOVE)
        elif _side_of(right, sides) == side and other(left):
            below, above = below or isinstance(node, _FROM_ABOVE), above or isinstance(node, _FROM_BELOW)
    return below, above


def _join_condition(join: exp.Join) -> exp.Expr | None:
    """What bounds a join: its ON clause, and for an inner join (``JOIN``, ``INNER JOIN`` or a comma)
    the WHERE of its query too, which Spark moves into the join's condition."""
    parts = [join.args.get("on")]
    if not join.side and join.kind in ("", "INNER", "CROSS"):  # a comma is a CROSS join to sqlglot
        select = join.find_ancestor(exp.Select)
        where = select.args.get("where") if select is not None else None
        parts.append(where.this if where is not None else None)
    present = [part for part in parts if part is not None]
    return exp.and_(*present) if present else None


def check_joins_bounded(tree: exp.Expr, sides: dict[str, StreamSide]) -> None:
    """Raise ``Unbounded`` for a stream joined without a bound on its event time from below and
    above by another stream's in the ON clause. ``sides``: each stream by the name the query
    calls it."""
    all_sides = list(sides.values())
    for join in tree.find_all(exp.Join):
        joined = join.this
        if not isinstance(joined, exp.Table) or joined.alias_or_name not in sides:
            continue
        side = sides[joined.alias_or_name]
        condition = _join_condition(join)
        below, above = _bounds(condition, side, all_sides) if condition is not None else (False, False)
        if below and above:
            continue
        missing = "from below and above" if not (below or above) else "from above" if below else "from below"
        other = next(s for s in all_sides if s != side)
        mine, theirs = f"{side.name}.{side.event_time}", f"{other.name}.{other.event_time}"
        raise Unbounded(f"the join of stream {side.name!r} is not bounded in event time {missing} by another "
                        f"stream's: Spark would keep every record of both sides in its state forever. Add a "
                        f"condition on both event times to its ON clause, e.g. AND {mine} BETWEEN {theirs} - "
                        f"INTERVAL 10 SECONDS AND {theirs} + INTERVAL 10 SECONDS", joined)


def _aggregated(relation: exp.Expr) -> bool:
    """Whether a joined relation is a query that aggregates (its rows come out when the watermark has passed them)."""
    return isinstance(relation, exp.Subquery) and (relation.find(exp.Group) is not None
                                                   or relation.find(exp.AggFunc) is not None)


def _named_side(column: exp.Column, sides: dict[str, StreamSide]) -> StreamSide | None:
    """The stream ``column`` names: by its qualifier, or the one stream with an event time of its name."""
    if column.table:
        return sides.get(column.table)
    named = [side for side in sides.values() if side.event_time == column.name]
    return named[0] if len(named) == 1 else None


def check_time_keys(tree: exp.Expr, sides: dict[str, StreamSide]) -> None:
    """Raise ``Unbounded`` for a join of an aggregate's results whose ON clause equates a stream's event
    time itself with a column: Spark then drops the stream's records from its state as soon as the
    watermark passes them, while the aggregate emits its rows only after the watermark has passed
    them, so the matches would be lost."""
    for join in tree.find_all(exp.Join):
        select = join.find_ancestor(exp.Select)
        relations = [join.this, select.args["from"].this if select is not None and select.args.get("from") else None]
        if not any(_aggregated(r) for r in relations if r is not None):
            continue
        for equality in (join.args.get("on") or exp.true()).find_all(exp.EQ):
            for column in (equality.this, equality.expression):
                side = _named_side(column, sides) if isinstance(column, exp.Column) else None
                if side is not None and column.name == side.event_time:
                    raise Unbounded(f"the join equates the event time {column.sql()} of stream {side.name!r} with an "
                                    "aggregate's result: Spark forgets a record whose event time is a join key as soon "
                                    "as the watermark passes it, and the aggregate emits its rows only after that, so "
                                    "their matches would be lost. Compare the times as numbers instead, e.g. "
                                    f"unix_micros({column.sql()}) = unix_micros(...)", equality)


def _reads_stream(relation: exp.Expr, sides: dict[str, StreamSide]) -> bool:
    tables = [relation] if isinstance(relation, exp.Table) else list(relation.find_all(exp.Table))
    return any(table.alias_or_name in sides for table in tables)


def check_equi_joins(tree: exp.Expr, sides: dict[str, StreamSide]) -> None:
    """Raise ``Unbounded`` for a join of two streams without an equality between them: Spark's
    stream-stream join finds matches by a key, and refuses a join without one when it starts."""
    for join in tree.find_all(exp.Join):
        if not _reads_stream(join.this, sides) or join.args.get("using"):
            continue
        condition = _join_condition(join)
        equalities = list(condition.find_all(exp.EQ)) if condition is not None else []
        if not any(e.this.find(exp.Column) and e.expression.find(exp.Column) for e in equalities):
            raise Unbounded("a join of streams needs an equality between them (ON a.key = b.key AND ...): Spark's "
                            "stream-stream join matches records by a key; join on one, e.g. a window both sides "
                            "are grouped by", join)
