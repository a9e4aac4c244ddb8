"""SQL steps at plan time: read a Spark SQL query with sqlglot, without Spark.

:func:`sql_node` parses the query, finds the names it reads in FROM and JOIN (the plan's
sources, steps and tables), refuses what a streaming query cannot do, and tells what the
query is, which decides how the step runs:

* ``stateless``: projections, filters, joins with tables; runs the same on one micro-batch. A
  query that only projects its one stream (:func:`projects_each_record`) gives a row per record;
* ``windowed aggregate``: a GROUP BY with Spark's ``window()`` or ``session_window()`` on
  the stream's event time; stateful, append mode (a window is emitted once, when the
  watermark passes its end);
* ``windows of windows``: windowed aggregates of windowed aggregates (a later window reads an
  earlier one's ``window_time``); Spark chains them in one query, append mode;
* ``join of streams``: several streams joined, each bounded in event time by another in its
  ON clause (``headrace/plan/sql_joins.py``), maybe then grouped by ``window()``; stateful,
  append mode (Spark's stream-stream join);
* ``aggregate``: a GROUP BY (or an aggregate) without a window; stateful, update mode (each
  micro-batch emits the groups it changed, with their values so far);
* ``distinct``: SELECT DISTINCT (on the outer query, without GROUP BY or aggregates); runs the
  query without DISTINCT, then Spark's streaming ``dropDuplicates``; append mode (each
  distinct row is emitted once, ever).

:func:`rewrite` puts the names of Spark temp views in place of the names the query reads,
keeping every other character where the user wrote it, and maps a position in the rewritten
text back to the query, so that errors point at the query the user wrote.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.dialects.spark import Spark
from sqlglot.errors import ParseError, TokenError

from headrace.errors import PlanError, step_error
from headrace.plan.graph import Plan
from headrace.plan.nodes import (
    AGGREGATE,
    CHAINED_WINDOWS,
    DISTINCT,
    JOINED,
    STATELESS,
    WINDOWED,
    EventTimeNode,
    SinkNode,
    SourceNode,
    SqlNode,
    TableNode,
)
from headrace.plan.sql_joins import (
    JoinWindow,
    StreamSide,
    Unbounded,
    check_equi_joins,
    check_joins_bounded,
    check_time_keys,
    check_window_joins,
    window_join_columns,
)
from headrace.plan.sql_top_n import find_top_n, is_window_call, top_n_as_aggregate

WINDOW_FUNCTIONS = ("window", "session_window")
# Spark aggregate functions sqlglot reads as plain (anonymous) functions.
MORE_AGGREGATES = frozenset({"mean", "every", "some", "any", "bool_or", "histogram_numeric", "try_sum", "try_avg",
                             "hll_sketch_agg", "hll_union_agg", "count_min_sketch", "bitmap_or_agg",
                             "approx_top_k", "grouping", "grouping_id"})


class _SparkSql(Spark):
    """Spark's SQL as sqlglot reads it, with ``window`` a plain name: Spark's ``window(ts, '1
    minute')`` function and its ``window`` column, not the WINDOW clause of named OVER windows
    (which a streaming query cannot use)."""

    class Tokenizer(Spark.Tokenizer):
        KEYWORDS = {word: kind for word, kind in Spark.Tokenizer.KEYWORDS.items() if word != "WINDOW"}


@dataclass(frozen=True)
class Position:
    """Where something is in a query: 1-based line and column, and how many characters it spans."""

    line: int
    column: int
    width: int = 1

    @classmethod
    def at(cls, query: str, offset: int, width: int = 1) -> Position:
        before = query[:offset]
        line = before.count("\n") + 1
        return cls(line, offset - (before.rfind("\n") + 1) + 1, max(width, 1))

    def describe(self) -> str:
        return f"line {self.line}, column {self.column}"


def show(query: str, position: Position | None = None) -> str:
    """The query, numbered, with carets under ``position`` (a few lines around it for a long query)."""
    lines = query.split("\n")
    first, last = 0, len(lines)
    if position is not None and len(lines) > 12:
        first, last = max(position.line - 4, 0), min(position.line + 3, len(lines))
    width = len(str(last))
    out = []
    for number in range(first + 1, last + 1):
        text = lines[number - 1]
        out.append(f"    {str(number).rjust(width)} | {text}")
        if position is not None and number == position.line:
            pad = "".join(c if c == "\t" else " " for c in text[:position.column - 1])
            carets = max(min(position.width, len(text) - position.column + 1), 1)
            out.append(f"    {' ' * width} | {pad}{'^' * carets}")
    return "\n".join(out)


def query_error(step: str, where: str, query: str, message: str, position: Position | None = None) -> PlanError:
    """A plan error on an SQL step: the step, its file:line, what is wrong and where, the query."""
    at = f"at {position.describe()} of the query" if position is not None else "the query"
    return step_error(step, where, f"{message}\n  {at}:\n{show(query, position)}")


class _Refused(Exception):
    def __init__(self, message: str, position: Position | None = None) -> None:
        super().__init__(message)
        self.message, self.position = message, position


# -- reading the query ------------------------------------------------------------------------------

def parse(query: str, step: str, where: str) -> exp.Query:
    """The query's syntax tree; a syntax error names the line and column."""
    try:
        statements = [s for s in sqlglot.parse(query, dialect=_SparkSql) if s is not None]
    except ParseError as exc:
        error = exc.errors[0] if exc.errors else {}
        highlight = str(error.get("highlight") or "")
        line, column = int(error.get("line") or 1), int(error.get("col") or 1)
        width = len(highlight) if highlight and "\n" not in highlight else 1
        position = Position(line, max(column - width + 1, 1), width)
        raise query_error(step, where, query, f"syntax error in the query: {_syntax_message(error)}",
                          position) from None
    except TokenError as exc:
        raise query_error(step, where, query, f"syntax error in the query: cannot read it ({exc}); is a quote "
                                              "or a backtick left open?") from None
    if len(statements) != 1:
        raise query_error(step, where, query, f"give one query, not {len(statements)} statements")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise query_error(step, where, query, "an SQL step runs a query (SELECT ...), not an "
                                              f"{type(tree).__name__.upper()} statement")
    return tree


def _syntax_message(error: dict[str, Any]) -> str:
    description = str(error.get("description") or "cannot parse")
    description = re.sub(r"<Token token_type: TokenType\.SENTINEL[^>]*>", "the end of the query", description)
    description = re.sub(r"<Token token_type: [^,]*, text: ([^,]*),[^>]*>", r"'\1'", description)
    missing = re.match(r"Required keyword: '\w+' missing for <class '[\w.]*\.(\w+)'>", description)
    if missing:
        description = f"an incomplete {missing.group(1).upper()} expression"
    highlight = error.get("highlight")
    if description == "Invalid expression / Unexpected token" and highlight:
        return f"unexpected {highlight!r}"
    return f"{description} (near {highlight!r})" if highlight else description


def _position(query: str, node: exp.Expr) -> Position | None:
    """Where ``node`` (or the first part of it that sqlglot placed) is in the query."""
    for part in node.walk():
        meta = part.meta
        if "start" in meta and "end" in meta:
            return Position.at(query, meta["start"], meta["end"] - meta["start"] + 1)
    return None


def _keyword_position(query: str, *words: str) -> Position | None:
    """Where the first of ``words`` (a keyword, upper case) is in the query."""
    for token in _SparkSql().tokenize(query):
        if " ".join(token.text.upper().split()) in words:
            return Position.at(query, token.start, token.end - token.start + 1)
    return None


@dataclass(frozen=True)
class Reference:
    """A name the query reads in FROM or JOIN, where it is, and its alias (or "")."""

    name: str
    start: int  # offsets of the name in the query (quotes included), end inclusive
    end: int
    alias: str


def references(tree: exp.Expr) -> list[Reference]:
    """The names of tables the query reads (not its WITH names), in order of appearance."""
    with_names = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    found = []
    for table in tree.find_all(exp.Table):
        identifier = table.this
        if not isinstance(identifier, exp.Identifier) or "start" not in identifier.meta:
            continue
        if not table.args.get("db") and identifier.name in with_names:
            continue
        qualified = ".".join(p.name for p in (table.args.get("catalog"), table.args.get("db"), identifier) if p)
        start = (table.args.get("catalog") or table.args.get("db") or identifier).meta.get("start",
                                                                                            identifier.meta["start"])
        found.append(Reference(qualified, start, identifier.meta["end"], table.alias))
    return sorted(found, key=lambda r: r.start)


def _is_aggregate(node: exp.Expr) -> bool:
    return isinstance(node, exp.AggFunc) or (isinstance(node, exp.Anonymous) and node.name.lower() in MORE_AGGREGATES)


def _owned(select: exp.Select, kind: Any) -> Iterable[Any]:
    """The nodes of ``kind`` in ``select`` itself, not in a query nested in it."""
    for node in select.find_all(kind):
        if node.find_ancestor(exp.Select) is select:
            yield node


def _aggregates(select: exp.Select) -> bool:
    if select.args.get("group") or select.args.get("having"):
        return True
    return any(_is_aggregate(n) and not n.find_ancestor(exp.Window) for n in _owned(select, exp.Func))


def window_calls(tree: exp.Expr) -> list[exp.Anonymous]:
    return [f for f in tree.find_all(exp.Anonymous) if f.name.lower() in WINDOW_FUNCTIONS]


def shape_of(query: str, tree: exp.Expr) -> str:
    """What the query is (see the module's docstring); raises _Refused for what a stream cannot do."""
    over = next(tree.find_all(exp.Window), None)
    if over is not None:
        top = find_top_n(tree)
        if top is not None:  # run as an aggregate (headrace/plan/sql_top_n.py)
            return WINDOWED if any(is_window_call(p) for p in top.over.args["partition_by"]) else AGGREGATE
        raise _Refused("OVER (...) window functions are not supported on a stream (Spark refuses non-time "
                       "windows on streaming queries), but for the first N rows per key: SELECT ... FROM (SELECT "
                       "..., ROW_NUMBER() OVER (PARTITION BY key ORDER BY ...) AS rn FROM stream) WHERE rn <= N; "
                       "otherwise group by window(ts, '1 minute') or session_window(ts, '5 minutes')",
                       _keyword_position(query, "OVER") or _position(query, over))
    if next(tree.find_all(exp.SetOperation), None) is not None:
        raise _Refused("UNION, INTERSECT and EXCEPT are not supported in an SQL step (Spark cannot combine a "
                       "stream with a table that way, and de-duplicating needs state); unite streams with "
                       "stream.union(...) before the query", _keyword_position(query, "UNION", "UNION ALL",
                                                                             "INTERSECT", "EXCEPT"))
    for select in tree.find_all(exp.Select):
        if select.args.get("order"):
            raise _Refused("ORDER BY is not supported on a stream (Spark sorts a stream only in complete mode, "
                           "which headrace does not use); sort in the sink's system, or in a function step",
                           _keyword_position(query, "ORDER BY"))
        if select.args.get("limit"):
            raise _Refused("LIMIT is not supported in an SQL step: a stream has no end to count to",
                           _keyword_position(query, "LIMIT"))
    distinct = next((d for d in tree.find_all(exp.Distinct) if isinstance(d.parent, exp.AggFunc)
                     and not (isinstance(d.parent, exp.Count) and len(d.expressions) == 1)), None)
    if distinct is not None:
        raise _Refused("of the aggregates over DISTINCT values, a stream takes COUNT(DISTINCT one_column) (counted "
                       "exactly from the set of values of each group); for several columns count "
                       "DISTINCT struct(a, b), and for others aggregate the distinct values in a query of their "
                       "own", _position(query, distinct.parent or distinct))
    aggregating = [s for s in tree.find_all(exp.Select) if _aggregates(s)]
    distinct_selects = [s for s in tree.find_all(exp.Select) if s.args.get("distinct")]
    if distinct_selects:
        if any(s is not tree for s in distinct_selects):
            raise _Refused("DISTINCT in a nested query is not supported on a stream; put it on the outer SELECT "
                           "(Spark de-duplicates a stream there, emitting each distinct row once)",
                           _keyword_position(query, "DISTINCT"))
        if aggregating:
            raise _Refused("DISTINCT on the result of GROUP BY or an aggregate is a second aggregation, which a "
                           "stream cannot run after the first (the groups are distinct already): drop DISTINCT",
                           _keyword_position(query, "DISTINCT"))
        return DISTINCT
    if len(aggregating) > 1:
        if all(_groups_by_window(select, tree) for select in aggregating):
            return CHAINED_WINDOWS
        raise _Refused("the query aggregates twice (a GROUP BY or aggregate inside another), and not each in "
                       "windows; Spark runs stateful steps one after another in one query in append mode only: group "
                       "each by window(...), the later ones over window_time(<the earlier window>) or by the earlier "
                       "window itself (GROUP BY w), or sink the first "
                       "aggregate and aggregate it again in another pipeline", _keyword_position(query, "GROUP BY"))
    if not aggregating:
        return STATELESS
    if window_calls(tree):
        return WINDOWED
    _check_updates_are_exact(query, aggregating[0])
    return AGGREGATE


def _groups_by_window(select: exp.Select, tree: exp.Expr) -> bool:
    """Whether the SELECT's own GROUP BY holds a window() or session_window() call, or an earlier
    window's column (``GROUP BY w``, ``w`` an earlier window: the same windows, regrouped)."""
    group = select.args.get("group")
    if group is None:
        return False
    return bool(window_calls(group)) or any(reads_earlier_window(key, tree) for key in group.expressions)


def _window_aliases(tree: exp.Expr) -> set[str]:
    """The names the query gives its window() and session_window() columns (``w`` of ``window(ts,
    '10 seconds') AS w``; ``window`` and ``session_window`` unnamed), which a later window may read."""
    names = {"window", "session_window"}
    for alias in tree.find_all(exp.Alias):
        if isinstance(alias.this, exp.Anonymous) and alias.this.name.lower() in WINDOW_FUNCTIONS:
            names.add(alias.alias)
    return names


def reads_earlier_window(time: exp.Expr, tree: exp.Expr) -> bool:
    """Whether a window's time argument is an earlier window's time: ``window_time(w)`` or ``w``
    itself, ``w`` a window column of the query (Spark takes a window column as its end - 1 µs)."""
    if isinstance(time, exp.Anonymous) and time.name.lower() == "window_time" and time.expressions:
        time = time.expressions[0]
    return isinstance(time, exp.Column) and time.name in _window_aliases(tree)


def _joined_shape(query: str, tree: exp.Expr, shape: str, streams: dict[str, Any]) -> str:
    """The shape of a query that joins streams (``streams``: each by the name the query calls
    it), or _Refused: Spark's stream-stream join emits each match once (append mode), so the
    query may go on to windows but not to an aggregate without one, nor to DISTINCT."""
    for name, node in streams.items():
        if node.event_time is None:
            raise _Refused(f"the query joins streams, and stream {name!r} ({node.name!r}) has no event time: Spark "
                           "keeps a join's records until the watermark shows no match can come; declare it with "
                           ".with_event_time('field', max_out_of_orderness) (or event_time= on the source)")
    sides = {name: StreamSide(name, str(node.event_time)) for name, node in streams.items()}
    if shape in (AGGREGATE, DISTINCT) and not (shape == AGGREGATE and group_time(tree, sides) is not None):
        what = "DISTINCT" if shape == DISTINCT else "an aggregate without a window (update mode)"
        raise _Refused(f"{what} cannot follow a join of streams in one query: Spark runs a stream-stream join in "
                       "append mode only; group by window(...) or by a stream's event-time field (each group "
                       "is emitted once, when the watermark passes it), or sink the join and aggregate in "
                       "another pipeline", _keyword_position(query, "DISTINCT", "GROUP BY"))
    try:
        check_equi_joins(tree, sides)
        check_joins_bounded(tree, sides)
        check_window_joins(tree, sides, aggregates=shape != STATELESS)
        check_time_keys(tree, sides)
    except Unbounded as unbounded:
        raise _Refused(unbounded.message, _position(query, unbounded.node)) from None
    return JOINED


def group_time(tree: exp.Expr, sides: dict[str, StreamSide]) -> exp.Column | None:
    """The event-time field of a joined stream that the query's aggregate (its GROUP BY, or its
    top N's PARTITION BY) groups by, named with the stream's name in the query; or None. Spark
    closes each group when the watermark passes it, and emits it once (append mode)."""
    top = find_top_n(tree)
    if top is not None:
        keys = list(top.over.args["partition_by"])
    else:
        group = next((s.args["group"] for s in tree.find_all(exp.Select) if s.args.get("group")), None)
        keys = list(group.expressions) if group is not None else []
    return next((key for key in keys if isinstance(key, exp.Column) and key.table in sides
                 and key.name == sides[key.table].event_time), None)


def _check_updates_are_exact(query: str, select: exp.Select) -> None:
    """An aggregate without a window runs in update mode: each micro-batch emits the groups it
    changed, and a sink keeps a group's last row. A filter on the aggregate's results (HAVING,
    or a WHERE around it) would leave a group that stops matching in the sink with a value it
    no longer has, since update mode emits nothing for it: refused."""
    if select.args.get("having"):
        raise _Refused("HAVING on a GROUP BY without a window is not supported on a stream: the query runs in "
                       "update mode, and a group that stops matching HAVING would stay in the sink with an old "
                       "value (update mode cannot take a row back); filter the results where they are stored, or "
                       "group by window(...) (append mode: each window's final value, once)",
                       _keyword_position(query, "HAVING"))
    outer = select.find_ancestor(exp.Select)
    while outer is not None:
        if outer.args.get("where"):
            raise _Refused("a WHERE on the results of a GROUP BY without a window is not supported on a stream: "
                           "the query runs in update mode, and a group that stops matching would stay in the sink "
                           "with an old value (update mode cannot take a row back); filter the results where they "
                           "are stored, or group by window(...)", _position(query, outer.args["where"]))
        outer = outer.find_ancestor(exp.Select)


def keeps_column(tree: exp.Expr, column: str, qualifiers: set[str]) -> bool:
    """Whether the outer SELECT passes ``column`` through unchanged under its own name
    (``*``, ``t.*``, ``column`` or ``t.column``, ``column AS column``)."""
    if not isinstance(tree, exp.Select):
        return False
    for item in tree.expressions:
        target = item.this if isinstance(item, exp.Alias) else item
        if isinstance(target, exp.Star) or (isinstance(target, exp.Column) and isinstance(target.this, exp.Star)):
            table = target.table if isinstance(target, exp.Column) else ""
            if not table or table in qualifiers:
                return True
        elif (isinstance(target, exp.Column) and target.name == column and item.alias_or_name == column
              and (not target.table or target.table in qualifiers)):
            return True
    return False


# -- the plan node -----------------------------------------------------------------------------------

def sql_node(plan: Plan, step: str, where: str, query: Any) -> SqlNode:
    """The SQL step ``step`` running ``query`` over the plan's streams and tables, checked."""
    if not isinstance(query, str) or not query.strip():
        raise step_error(step, where, f"sql needs a query string, got {query!r}; e.g. p.sql(\"SELECT url, count(*) "
                                      "AS n FROM clicks GROUP BY url\")")
    tree = parse(query, step, where)
    queryable = [n.name for n in plan.nodes.values() if not isinstance(n, SinkNode)]
    all_streams = ", ".join(n for n in queryable if not isinstance(plan.nodes[n], TableNode)) or "none"
    all_tables = ", ".join(n for n in queryable if isinstance(plan.nodes[n], TableNode)) or "none"
    refs = references(tree)
    for ref in refs:
        if ref.name not in queryable:
            position = Position.at(query, ref.start, ref.end - ref.start + 1)
            what = (f"{ref.name!r} is a sink; a query reads sources, steps and tables" if ref.name in plan.nodes
                    else f"unknown stream or table {ref.name!r}")
            raise query_error(step, where, query, f"{what}; pipeline {plan.name!r} has the streams {all_streams} "
                                                  f"and the tables {all_tables}", position)
    read = {ref.name: _resolve(plan, ref.name) for ref in refs}
    streams = [r for r in refs if not isinstance(plan.nodes[r.name], TableNode)]
    if not streams:
        raise query_error(step, where, query, "the query reads no stream, only tables; an SQL step reads one "
                                              f"stream (pipeline {plan.name!r} has the streams {all_streams})")
    stream = plan.nodes[read[streams[0].name]]
    try:
        shape = shape_of(query, tree)
        if len(streams) > 1:
            shape = _joined_shape(query, tree, shape, {r.alias or r.name: plan.nodes[read[r.name]] for r in streams})
    except _Refused as refused:
        raise query_error(step, where, query, refused.message, refused.position) from None
    for call in window_calls(tree):
        at = _position(query, call)
        function = call.name.lower()
        if stream.event_time is None:
            raise query_error(step, where, query, f"{function}() needs event time, and the stream {stream.name!r} "
                                                  "has none: declare it with .with_event_time('field', "
                                                  "max_out_of_orderness) (or event_time= on the source) and query "
                                                  "that stream", at)
        time = call.expressions[0] if call.expressions else None
        times = {plan.nodes[read[r.name]].event_time for r in streams}
        if shape == CHAINED_WINDOWS and time is not None and reads_earlier_window(time, tree):
            continue
        if not (isinstance(time, exp.Column) and time.name in times):
            got = time.sql(dialect=_SparkSql) if time is not None else "nothing"
            owner = (f"{stream.event_time!r} of stream {stream.name!r}" if len(streams) == 1 else
                     "of one of the streams (" + ", ".join(sorted(repr(t) for t in times if t)) + ")")
            raise query_error(step, where, query, f"{function}() must read the event-time field {owner}, whose "
                                                  f"watermark closes the windows; it reads {got}", at)
    qualifiers = {streams[0].alias or streams[0].name}
    event_time = (stream.event_time if shape == STATELESS and stream.event_time is not None
                  and keeps_column(tree, stream.event_time, qualifiers) else None)
    if shape == JOINED:  # grouped by a stream's event time: each result at that time, when the outer SELECT keeps it
        sides = {r.alias or r.name: StreamSide(r.alias or r.name, str(plan.nodes[read[r.name]].event_time))
                 for r in streams}
        time = group_time(tree, sides)
        event_time = time.name if time is not None and keeps_column(tree, time.name, {time.table}) else None
    inputs = tuple(dict.fromkeys(read.values()))
    return SqlNode(step, inputs, where, None, event_time, query=query, shape=shape, reads=tuple(read.items()),
                   each_record=shape == STATELESS and projects_each_record(tree, refs))


# What a SELECT may hold and still give one row per record of its stream, and a FROM's table.
_PROJECTION_PARTS = frozenset({"expressions", "from_", "hint"})
_PLAIN_TABLE_PARTS = frozenset({"this", "db", "catalog", "alias"})
# Spark's generators, which give several rows (or none) per row, by the names sqlglot leaves unparsed.
_GENERATORS = frozenset({"explode", "explode_outer", "posexplode", "posexplode_outer", "inline", "inline_outer",
                         "stack", "json_tuple", "variant_explode", "variant_explode_outer"})


def projects_each_record(tree: exp.Expr, refs: list[Reference]) -> bool:
    """Whether a ``stateless`` query (no aggregate, no OVER: ``shape_of``) gives one row for each
    record of the one stream it reads: a SELECT of expressions over that stream alone, with nothing
    that drops, adds or combines rows (WHERE, a join, DISTINCT, a generator, a nested query, a
    sample)."""
    if not isinstance(tree, exp.Select) or len(refs) != 1:
        return False
    if any(value for part, value in tree.args.items() if part not in _PROJECTION_PARTS):
        return False
    source = tree.args["from_"].this
    if not isinstance(source, exp.Table) or any(v for k, v in source.args.items() if k not in _PLAIN_TABLE_PARTS):
        return False
    return not any(isinstance(n, exp.UDTF) or isinstance(n, exp.Select) and n is not tree
                   or isinstance(n, exp.Anonymous) and n.name.lower() in _GENERATORS for n in tree.walk())


def _resolve(plan: Plan, name: str) -> str:
    """The step a name in a query reads: a source given ``event_time=`` is read with its event
    time (the query's ``clicks`` is the step ``clicks_event_time``), any other name is its step."""
    node = plan.nodes[name]
    if isinstance(node, SourceNode):
        declared = plan.nodes.get(f"{name}_event_time")
        if isinstance(declared, EventTimeNode) and declared.inputs == (name,):
            return declared.name
    return name


# -- the query Spark runs ----------------------------------------------------------------------------

def without_distinct(query: str) -> str:
    """``query`` with the DISTINCT of its outer SELECT blanked out (spaces, so every position
    stays where it was): Spark de-duplicates the stream after it (``dropDuplicates``)."""
    depth, after_select = 0, False
    for token in _SparkSql().tokenize(query):
        word = token.text.upper()
        if after_select and word == "DISTINCT":
            return query[:token.start] + " " * (token.end - token.start + 1) + query[token.end + 1:]
        after_select = depth == 0 and word == "SELECT"
        depth += {"(": 1, ")": -1}.get(token.text, 0)
    raise AssertionError(f"no outer SELECT DISTINCT in {query!r}")


def _as_set_size(value: exp.Expr, where: exp.Expr | None = None) -> exp.Expr:
    values: exp.Expr = exp.Anonymous(this="collect_set", expressions=[value.copy()])
    if where is not None:
        values = exp.Filter(this=values, expression=where.copy())
    return exp.cast(exp.Anonymous(this="size", expressions=[values]), "bigint")


def top_n_as_aggregate_query(query: str, types: dict[str, str]) -> str:
    """``query`` with a top N per key as the aggregate Spark runs (``headrace/plan/sql_top_n.py``),
    or unchanged; ``types``: the Spark types of its input columns, by name."""
    if "OVER" not in query.upper():  # no numbered rows: nothing to parse (a stateless query runs each batch)
        return query
    tree = parse(query, "", "")
    top = find_top_n(tree) if isinstance(tree, exp.Select) else None
    if top is None or not isinstance(tree, exp.Select):
        return query
    return top_n_as_aggregate(tree, top, _SparkSql, types)


@functools.lru_cache(maxsize=256)
def cross_joins_as_inner(query: str) -> str:
    """``query`` with each CROSS join (``FROM a, b`` too) an INNER join without a condition: Spark moves
    the WHERE into an inner join's condition, but runs no cross join of two streams. Unchanged when
    it has none."""
    tree = parse(query, "", "")
    crossed = [join for join in tree.find_all(exp.Join) if join.kind == "CROSS"]
    if not crossed:
        return query
    for join in crossed:
        join.set("kind", "INNER")
    return tree.sql(dialect=_SparkSql)


def window_joins_as_columns(query: str, event_times: dict[str, str]) -> tuple[str, dict[str, JoinWindow]]:
    """``query`` with its window joins on window columns (``sql_joins.window_join_columns``), and
    the window each name it reads needs as a column; ``event_times``: the event time of each
    stream it reads, by name. Unchanged, and no window, when it joins no windows."""
    tree = parse(query, "", "")
    names = {ref.alias or ref.name: ref.name for ref in references(tree) if ref.name in event_times}
    sides = {called: StreamSide(called, event_times[name]) for called, name in names.items()}
    changed, windows = window_join_columns(tree, sides)
    if not windows:
        return query, {}
    return changed.sql(dialect=_SparkSql), {names[called]: window for called, window in windows.items()}


@functools.lru_cache(maxsize=256)
def exact_distinct_counts(query: str) -> str:
    """``query`` with each ``COUNT(DISTINCT x)`` (and its ``FILTER (WHERE ...)``) as the size of
    the set of x's values: Spark refuses distinct aggregates on a stream, and a set per group
    (which skips nulls, as COUNT does) counts exactly. The query unchanged when it has none."""
    tree = parse(query, "", "")

    def distinct_count(node: exp.Expr) -> bool:
        return isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct)

    if not any(distinct_count(node) for node in tree.walk()):
        return query

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Filter) and distinct_count(node.this):
            return _as_set_size(node.this.this.expressions[0], node.expression)
        if distinct_count(node) and not isinstance(node.parent, exp.Filter):
            return _as_set_size(node.this.expressions[0])
        return node

    return tree.transform(swap).sql(dialect=_SparkSql)


@dataclass(frozen=True)
class Rewritten:
    """The query with view names in place of the names it reads; ``spans`` maps each change
    (start and end in the new text, start and end in the query) so positions map back."""

    text: str
    spans: tuple[tuple[int, int, int, int], ...]

    def original_offset(self, offset: int) -> int:
        """Where the character at ``offset`` of the new text was in the query."""
        shift = 0
        for new_start, new_end, old_start, old_end in self.spans:
            if offset < new_start:
                break
            if offset <= new_end:
                return old_start
            shift = new_end - old_end
        return offset - shift


def rewrite(query: str, views: dict[str, str]) -> Rewritten:
    """``query`` reading the temp view ``views[name]`` for each name (which keeps its name as
    the alias, so ``clicks.url`` still means what it did)."""
    parts, spans, last, length = [], [], 0, 0
    for ref in _references_of(query):
        if ref.name not in views:
            continue
        original = query[ref.start:ref.end + 1]
        replacement = f"`{views[ref.name]}`" + ("" if ref.alias else f" AS {original}")
        parts.append(query[last:ref.start])
        length += ref.start - last
        spans.append((length, length + len(replacement) - 1, ref.start, ref.end))
        parts.append(replacement)
        length += len(replacement)
        last = ref.end + 1
    parts.append(query[last:])
    return Rewritten("".join(parts), tuple(spans))


@functools.lru_cache(maxsize=256)
def _references_of(query: str) -> tuple[Reference, ...]:
    """The names ``query`` reads (parsed once: a stateless step's query is rewritten each micro-batch)."""
    return tuple(references(parse(query, "", "")))


def restore_names(text: str, views: dict[str, str]) -> str:
    """Spark's message about the rewritten query, with the query's own names again."""
    for name, view in views.items():
        text = re.sub(rf"(`?spark_catalog`?\.)?(`?default`?\.)?`?{re.escape(view)}`?", name, text)
    return text
