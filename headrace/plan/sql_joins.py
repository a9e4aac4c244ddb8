"""SQL queries that join streams, checked at plan time with sqlglot (docs/sql.md, docs/joins.md).

Spark runs a join of two streams with its stream-stream join, which keeps the records of
both sides in its state until the watermark shows that no match can come. It can tell that
only from the join's condition: when the condition bounds one side's event time by the
other's from below and from above (an interval join), or when it equates both sides' windows
of their event times (a window join, ``window(a.t, '10 seconds') = window(b.t, '10 seconds')``:
a record waits until the watermark passes its window's end). Without either, Spark keeps
every record forever. So each stream joined in a query must be bounded that way in its ON
clause, and every stream the query reads needs its event time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeGuard

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


# -- window joins ---------------------------------------------------------------------------------

_UNITS_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
             "week": 604_800_000}  # Spark's interval units, but months and years (no fixed length)
_AMOUNT = re.compile(r"(-?\d+)\s*([a-z]+)")
WINDOW_COLUMN = "_hr_join_window"  # the window column of a window join's side (headrace/spark/sql.py)


def duration_ms(expression: exp.Expr) -> int | None:
    """The milliseconds of a duration argument of ``window()``: ``'10 seconds'``, ``'1 minute 30
    seconds'``, ``INTERVAL 10 SECONDS``; None when it is not written so."""
    if isinstance(expression, exp.Interval):
        unit = expression.args.get("unit")
        text = f"{expression.this.name} {unit.name if unit is not None else ''}"
    elif isinstance(expression, exp.Literal) and expression.is_string:
        text = expression.name
    else:
        return None
    text = re.sub(r"^\s*interval\s+", "", text.lower()).replace("'", "")
    amounts = _AMOUNT.findall(text)
    if not amounts or _AMOUNT.sub("", text).strip():
        return None
    total = 0
    for number, unit in amounts:
        size = _UNITS_MS.get(unit.removesuffix("s"))
        if size is None:
            return None
        total += int(number) * size
    return total


@dataclass(frozen=True)
class JoinWindow:
    """The tumbling window a window join puts both sides' records in."""

    size_ms: int
    offset_ms: int

    @property
    def column(self) -> str:
        """The name of the window column of a side's view."""
        return f"{WINDOW_COLUMN}_{self.size_ms}_{self.offset_ms}"


@dataclass(frozen=True)
class WindowEquality:
    """``window(a.t, ...) = window(b.t, ...)`` between two streams' event times: their calls,
    the streams, and the window (None when the calls are not the same tumbling window)."""

    equality: exp.EQ
    calls: tuple[exp.Anonymous, exp.Anonymous]
    sides: tuple[StreamSide, StreamSide]
    window: JoinWindow | None
    why_not: str


def _text(call: exp.Expr) -> str:
    return call.sql(normalize_functions=False)


def _window_of(call: exp.Anonymous) -> tuple[JoinWindow | None, str]:
    """The tumbling window ``call`` assigns to, or None and why it is none."""
    args = call.expressions[1:]
    sizes = [duration_ms(a) for a in args[:2]]
    if not args or None in sizes:
        return None, f"cannot read the window's duration in {_text(call)}; write it as window(t, '10 seconds')"
    if len(sizes) == 2 and sizes[0] != sizes[1]:
        return None, (f"{_text(call)} is a sliding window: a window join takes tumbling windows (in sliding windows "
                      "a pair of records would meet in several windows); give window(t, '10 seconds')")
    offset = duration_ms(args[2]) if len(args) > 2 else 0
    if offset is None:
        return None, f"cannot read the window's start time in {_text(call)}"
    return JoinWindow(sizes[0], offset), ""  # type: ignore[arg-type]


def _window_call(expression: exp.Expr) -> TypeGuard[exp.Anonymous]:
    return isinstance(expression, exp.Anonymous) and expression.name.lower() == "window"


def window_equalities(tree: exp.Expr, sides: list[StreamSide]) -> list[WindowEquality]:
    """Every equality of two streams' windows of their event times in ``tree``."""
    found = []
    for equality in tree.find_all(exp.EQ):
        calls = equality.this, equality.expression
        if not all(_window_call(c) and c.expressions for c in calls):
            continue
        owners = [_side_of(c.expressions[0], sides) for c in calls]
        times_only = all(isinstance(c.expressions[0], exp.Column) for c in calls)
        if None in owners or owners[0] == owners[1] or not times_only:
            continue
        (first, why), (second, other_why) = _window_of(calls[0]), _window_of(calls[1])
        why = why or other_why
        if not why and first != second:
            why = (f"{_text(calls[0])} and {_text(calls[1])} are not the same window: a window join puts both sides' "
                   "records in one window; give both the same duration and start")
        found.append(WindowEquality(equality, calls, (owners[0], owners[1]),  # type: ignore[arg-type]
                                    None if why else first, why))
    return found


def check_window_joins(tree: exp.Expr, sides: dict[str, StreamSide], aggregates: bool) -> None:
    """Raise ``Unbounded`` for a window join Spark could not run as one: windows that are not the
    same tumbling window, several windows in one query, a stream joined by an interval beside
    them, or an aggregate after the join in the same query (its input's event times no longer
    carry the watermark: Spark judges each side by its window)."""
    equalities = window_equalities(tree, list(sides.values()))
    if not equalities:
        return
    for equality in equalities:
        if equality.window is None:
            raise Unbounded(equality.why_not, equality.equality)
    windows = {e.window for e in equalities}
    if len(windows) > 1:
        raise Unbounded("the query joins streams in windows of different sizes; a query's window joins take one "
                        "window (join the results of one in another step)", equalities[-1].equality)
    joined = {side for e in equalities for side in e.sides}
    others = [side for side in sides.values() if side not in joined]
    if others:
        raise Unbounded(f"the query joins streams by window, and stream {others[0].name!r} otherwise: a window "
                        "join judges its streams by their windows, so join every stream of the query by the same "
                        f"window (AND window({others[0].name}.{others[0].event_time}, ...) = window(...))",
                        equalities[0].equality)
    if aggregates:
        raise Unbounded("an aggregate cannot follow a window join in one query: Spark judges the joined streams by "
                        "their windows, so their event times carry no watermark for it; aggregate the join's results "
                        "in another pipeline, or bound the join by an interval (BETWEEN) instead",
                        equalities[0].equality)


def window_join_columns(tree: exp.Expr, sides: dict[str, StreamSide]) -> tuple[exp.Expr, dict[str, JoinWindow]]:
    """``tree`` with each ``window()`` call of a window join's window over a joined stream's event
    time as that stream's window column (``JoinWindow.column``), and the window each stream
    (by its name in the query) needs in its view. The tree unchanged when it joins no windows."""
    equalities = [e for e in window_equalities(tree, list(sides.values())) if e.window is not None]
    if not equalities:
        return tree, {}
    window = equalities[0].window
    assert window is not None
    joined = {side.name: side for e in equalities for side in e.sides}

    def as_column(node: exp.Expr) -> exp.Expr:
        if not (_window_call(node) and node.expressions and isinstance(node.expressions[0], exp.Column)):
            return node
        side = _side_of(node.expressions[0], list(joined.values()))
        if side is None or _window_of(node)[0] != window:
            return node
        column = exp.column(window.column, table=side.name)
        projected = isinstance(node.parent, exp.Select) and node.arg_key == "expressions"
        return exp.alias_(column, "window") if projected else column

    return tree.transform(as_column), dict.fromkeys(joined, window)


# -- interval joins -------------------------------------------------------------------------------

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
    above by another stream's in the ON clause, or an equality of their windows. ``sides``: each
    stream by the name the query calls it."""
    all_sides = list(sides.values())
    for join in tree.find_all(exp.Join):
        joined = join.this
        if not isinstance(joined, exp.Table) or joined.alias_or_name not in sides:
            continue
        side = sides[joined.alias_or_name]
        condition = _join_condition(join)
        below, above = _bounds(condition, side, all_sides) if condition is not None else (False, False)
        in_windows = condition is not None and any(side in e.sides for e in window_equalities(condition, all_sides))
        if (below and above) or in_windows:
            continue
        missing = "from below and above" if not (below or above) else "from above" if below else "from below"
        other = next(s for s in all_sides if s != side)
        mine, theirs = f"{side.name}.{side.event_time}", f"{other.name}.{other.event_time}"
        raise Unbounded(f"the join of stream {side.name!r} is not bounded in event time {missing} by another "
                        f"stream's: Spark would keep every record of both sides in its state forever. Add a "
                        f"condition on both event times to its ON clause, e.g. AND {mine} BETWEEN {theirs} - "
                        f"INTERVAL 10 SECONDS AND {theirs} + INTERVAL 10 SECONDS (an interval join), or AND "
                        f"window({mine}, '10 seconds') = window({theirs}, '10 seconds') (a window join)", joined)


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
