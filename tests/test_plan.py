"""Building a plan, without Spark: validation messages, JSON and explain.

Every validation error names the step and the line of this file that defined it; the
tests find that line with ``line_of`` rather than hard-coding it.
"""

from __future__ import annotations

import datetime
import inspect
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, TypedDict

import pytest

import headrace as hr
from headrace.spark.lowerings import lowering_of
from headrace.spark.specs import output_mode, python_chains
from headrace.testing import TestSink, TestSource

FILE = "test_plan.py"
EVENTS = {"user": "string", "kind": "string", "amount": "long", "ts": "long"}


def next_line() -> int:
    """The number of the line after the caller's."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


def source(p: hr.Pipeline, name: str = "events", event_time: str | None = None, **schema: str) -> hr.Stream:
    return p.source(name, TestSource([], schema=schema or EVENTS), event_time=event_time)


def fails(match: str) -> Any:
    return pytest.raises(hr.PlanError, match=match)


# -- names -----------------------------------------------------------------------------------

@pytest.mark.fast
def test_duplicate_names_name_both_definitions():
    p = hr.Pipeline("dupes")
    events = source(p)
    first = next_line()
    events.filter(hr.col("amount") > 0, name="positive").sink("out", TestSink())
    with pytest.raises(hr.PlanError) as error:
        line = next_line()
        events.filter(hr.col("amount") < 0, name="positive")
    assert str(error.value) == (
        f"step 'positive' ({FILE}:{line}): the name is already used by the native step defined at "
        f"{FILE}:{first}; every step needs a unique name (it identifies the step's state)")
    with fails(rf"step 'out' \({FILE}:\d+\): the name is already used by the sink step"):
        events.sink("out", TestSink())
    with fails(r"step 'events' .* already used by the source step"):
        source(p)


@pytest.mark.fast
def test_generated_names_are_unique_and_stable():
    p = hr.Pipeline("names")
    events = source(p)
    a = events.filter(hr.col("amount") > 0)
    b = a.filter(lambda e: e["kind"] == "buy")
    c = b.filter(hr.col("amount") < 100, name="filter_3")  # taken by hand: the generator skips it
    d = c.filter(hr.col("amount") != 7)
    assert [s.node.name for s in (a, b, c, d)] == ["filter", "filter_2", "filter_3", "filter_4"]


@pytest.mark.fast
def test_pipeline_name_and_guarantee_are_checked():
    with fails(r"pipeline name 'has space' must be a non-empty identifier"):
        hr.Pipeline("has space")
    with fails(r"unknown guarantee 'twice'; use one of exactly-once, at-least-once, at-most-once"):
        hr.Pipeline("p", guarantee="twice")


# -- unknown columns -----------------------------------------------------------------------------

@pytest.mark.parametrize("build, step, what", [
    (lambda s: s.filter(hr.col("amout") > 1), "filter", "column"),
    (lambda s: s.select("user", "amout"), "select", "column"),
    (lambda s: s.with_columns(double=hr.col("amout") * 2), "with_columns", "column"),
    (lambda s: s.key_by("usr"), "key_by", "key field"),
    (lambda s: s.key_by("user").aggregate(total=hr.sum("amout")), "aggregate", "column"),
    (lambda s: s.with_event_time("time"), "event_time", "event-time field"),
    (lambda s: s.join(s.pipeline.table("t", [{"user": "u", "x": 1}]), on="usr"), "join", "join field"),
])
@pytest.mark.fast
def test_an_unknown_column_names_the_step_the_line_and_the_known_columns(build, step, what):
    p = hr.Pipeline("columns")
    events = source(p)
    with pytest.raises(hr.PlanError) as error:
        build(events)
    message = str(error.value)
    # The step is defined on the lambda's line, in this file.
    assert message.startswith(f"step '{step}' ({FILE}:{build.__code__.co_firstlineno}): unknown {what} ")
    assert re.search(r"; the stream from '(events|key_by)' has user, kind, amount, ts$", message), message


@pytest.mark.fast
def test_a_projection_cannot_name_a_column_twice():
    p = hr.Pipeline("twice")
    with fails(r"step 'pick' .*: select names the column 'user' twice"):
        source(p).select("user", user=hr.col("kind"), name="pick")


@pytest.mark.fast
def test_columns_known_after_each_step_are_checked_too():
    p = hr.Pipeline("later")
    picked = source(p).select("user", total=hr.col("amount") * 2, name="pick")
    with fails(rf"step 'again' \({FILE}:\d+\): unknown column 'amount'; the stream from 'pick' has user, total"):
        picked.filter(hr.col("amount") > 0, name="again")
    # Spark SQL text is not parsed: its columns are not checked when the plan is built.
    picked.filter(hr.expr("anything > 0"), name="sql")


@pytest.mark.fast
def test_join_on_a_column_the_table_lacks():
    p = hr.Pipeline("joins")
    table = p.table("countries", [{"code": "fr", "name": "France"}])
    with fails(r"step 'join' .*: table 'countries' has no column 'user'; it has code, name"):
        source(p).join(table, on="user")
    with fails(r"step 'clash' .*: the stream from 'third' and table 'named' both have a column 'kind' that is "
               r"not a join field; rename one of them"):
        source(p, "third").join(p.table("named", [{"user": "u", "kind": "k"}]), on="user", name="clash")
    with fails(r"how must be 'inner' or 'left', got 'outer'"):
        source(p, "more").join(table, on="user", how="outer")
    with fails(r"table 'empty' .*: an empty table needs schema="):
        p.table("empty", [])
    with fails(r"table 'both' .*: give either rows=\[...\] or path=..."):
        p.table("both")
    with fails(r"format must be parquet, json or csv, got 'xlsx'"):
        p.table("sheet", path="x.xlsx", format="xlsx")


# -- windows and event time ----------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: hr.Tumbling(0), "hr.Tumbling ({where}): the window size must be positive, got 0"),
    (lambda: hr.Tumbling("-5s"), "hr.Tumbling ({where}): the window size must be positive, got '-5s'"),
    (lambda: hr.Sliding("10s", "0s"), "hr.Sliding ({where}): the window size and slide must be positive, "
                                      "got size='10s' slide='0s'"),
    (lambda: hr.Sliding("1s", "5s"), "hr.Sliding ({where}): the slide ('5s') is larger than the window size "
                                     "('1s'); records between windows would be lost: use a slide <= size"),
    (lambda: hr.Session(datetime.timedelta(0)), "hr.Session ({where}): the gap must be positive, "
                                                "got datetime.timedelta(0)"),
    (lambda: hr.Tumbling("ten seconds"), "hr.Tumbling ({where}): size: cannot read 'ten seconds' as a duration"),
])
@pytest.mark.fast
def test_bad_window_shapes_name_the_line_that_built_them(make, message):
    with pytest.raises(hr.PlanError) as error:
        make()
    assert str(error.value).startswith(message.format(where=f"{FILE}:{make.__code__.co_firstlineno}"))


@pytest.mark.fast
def test_valid_window_shapes():
    assert hr.Sliding("10s", "10s").slide_ms == 10_000
    assert hr.Tumbling(datetime.timedelta(minutes=1)).size_ms == 60_000
    assert str(hr.Session("90s")) == "session gap 90s"


@pytest.mark.fast
def test_windowing_a_stream_without_event_time():
    p = hr.Pipeline("no_time")
    keyed = source(p).key_by("user")
    with pytest.raises(hr.PlanError) as error:
        line = next_line()
        keyed.window(hr.Tumbling("1m"), name="per_minute")
    assert str(error.value) == (
        f"step 'per_minute' ({FILE}:{line}): the stream from 'key_by' has no event time; declare it with "
        ".with_event_time('field', max_out_of_orderness) (or event_time= on the source) before windowing")
    # A map whose output drops the event-time field drops the event time with it.
    timed = source(p, "timed", event_time="ts")
    untimed = timed.map(lambda e: {"user": e["user"]}, schema={"user": "string"}, name="strip")
    with fails(r"step 'window' .*: the stream from 'strip' has no event time"):
        untimed.window(hr.Tumbling("1m"))
    kept = timed.map(lambda e: e, schema={"user": "string", "ts": "timestamp"}, name="keep")
    kept.window(hr.Tumbling("1m"), name="fine")  # no error: the field, hence the event time, is kept


@pytest.mark.fast
def test_event_time_field_and_delay_are_checked():
    p = hr.Pipeline("times")
    with fails(r"step 'event_time' .*: event-time field 'user' is a string; it must be a timestamp or epoch"):
        source(p).with_event_time("user")
    with fails(r"max_out_of_orderness must not be negative, got '-1s'"):
        source(p, "again").with_event_time("ts", "-1s")
    stream = source(p, "third").with_event_time("ts", "2s")
    assert stream.node.schema == (("user", "string"), ("kind", "string"), ("amount", "long"), ("ts", "timestamp"))
    assert stream.node.to_json()["delay_ms"] == 2000


@pytest.mark.fast
def test_emit_must_be_final_or_updates():
    p = hr.Pipeline("emit")
    with fails(r"step 'window' .*: emit must be 'final' or 'updates', got 'early'"):
        source(p, event_time="ts").window(hr.Tumbling("1s")).count(emit="early")


@pytest.mark.fast
def test_stateful_steps_that_spark_cannot_chain_are_refused():
    """A window's results may feed another window (tests/test_multi_stage.py); these may not."""
    p = hr.Pipeline("chained")
    counts = source(p, event_time="ts").key_by("user").window(hr.Tumbling("1s"), name="per_second").count()
    with pytest.raises(hr.PlanError) as error:
        line = next_line()
        counts.key_by("user").sum("count", name="total")
    assert str(error.value) == (
        f"step 'total' ({FILE}:{line}): it reads the results of window 'per_second' ({FILE}:{line - 3}), and this "
        "step is a rolling aggregate, which emits updates (Spark's update mode), and Spark runs stateful steps one "
        "after another in one query only in append mode; use a window with emit='final'; sink those results and "
        "continue in another pipeline")
    rolling = source(p, "more").key_by("user").count(name="n")
    with fails(r"step 'again' .*: it reads the results of rolling aggregate 'n' .*, which emits updates"):
        rolling.key_by("user").reduce(lambda a, b: a, name="again")
    with fails(r"step 'windowed' .*: it reads the results of window 'per_second' .*, through the event-time "
               r"declaration 'window_start_time' .*: a watermark declared again after a stateful step"):
        (counts.with_event_time("window_start", name="window_start_time")
         .window(hr.Tumbling("1m"), name="windowed").count())


@pytest.mark.fast
def test_final_windows_cannot_share_a_pipeline_with_updating_steps():
    p = hr.Pipeline("modes")
    keyed = source(p, event_time="ts").key_by("user")
    line = next_line()
    keyed.window(hr.Tumbling("1s"), name="final_counts").count().sink("a", TestSink())
    keyed.count(name="running").sink("b", TestSink())
    with pytest.raises(hr.PlanError) as error:
        p.explain()
    assert str(error.value).startswith(
        f"step 'final_counts' ({FILE}:{line}): a window with emit='final' cannot share pipeline 'modes' with step "
        f"'running' ({FILE}:{line + 1}), which emits updates")


@pytest.mark.fast
def test_a_reduce_needs_a_pipeline_of_its_own_and_known_field_types():
    p = hr.Pipeline("reduces")
    keyed = source(p).key_by("user")
    keyed.reduce(lambda a, b: b, name="latest").sink("a", TestSink())
    keyed.count(name="n").sink("b", TestSink())
    with fails(r"step 'latest' .*: a reduce cannot share pipeline 'reduces' with the stateful step 'n'"):
        p.validate()
    other = hr.Pipeline("untyped")
    computed = source(other).with_columns(half=hr.col("amount") / 2)
    with fails(r"step 'reduce' .*: reduce needs a stream whose field types are known"):
        computed.key_by("user").reduce(lambda a, b: b)
    with fails(r"reduce needs a function, got 3"):
        source(other, "x").key_by("user").reduce(3)  # type: ignore[arg-type]


# -- a stream that goes nowhere, missing ends ------------------------------------------------------

@pytest.mark.fast
def test_a_stream_that_goes_nowhere_names_its_last_step():
    p = hr.Pipeline("dangling")
    events = source(p)
    events.sink("out", TestSink())
    line = next_line()
    events.filter(lambda e: e["amount"] > 10, name="big").select("user", name="who")
    for check in (p.validate, p.explain, p.to_json):
        with pytest.raises(hr.PlanError) as error:
            check()
        assert str(error.value) == (f"step 'who' ({FILE}:{line}): this stream goes nowhere: send it to a sink "
                                    "with .sink(...) or remove the step")
    keyed = hr.Pipeline("keyed_only")
    orders = source(keyed)
    orders.sink("all", TestSink())
    orders.key_by("user", name="by_user")
    with fails(r"step 'by_user' .*: this stream goes nowhere"):
        keyed.validate()


@pytest.mark.fast
def test_a_pipeline_needs_a_source_and_a_sink():
    with fails(r"pipeline 'empty' has no source; add one with pipeline.source"):
        hr.Pipeline("empty").validate()
    p = hr.Pipeline("no_sink")
    source(p)
    with fails(r"pipeline 'no_sink' has no sink; send a stream somewhere with stream.sink"):
        p.explain()
    with fails(r"source 'x' .*: expected a headrace source connector, got list"):
        p.source("x", [])  # type: ignore[arg-type]
    with fails(r"sink 'y' .*: expected a headrace sink connector, got str"):
        source(p, "z").sink("y", "console")  # type: ignore[arg-type]


# -- Python steps and their schemas ----------------------------------------------------------------

@dataclass
class Purchase:
    user: str
    amount: int


class Total(TypedDict):
    user: str
    total: float


def to_purchase(event: dict[str, Any]) -> Purchase:
    return Purchase(event["user"], event["amount"])


def to_totals(event: dict[str, Any]) -> list[Total]:
    return [{"user": event["user"], "total": float(event["amount"])}]


def untyped(event):  # noqa: ANN001, ANN201 - no annotations on purpose
    return event


@pytest.mark.fast
def test_a_map_needs_an_output_schema():
    p = hr.Pipeline("schemas")
    events = source(p)
    with pytest.raises(hr.PlanError) as error:
        line = next_line()
        events.map(untyped, name="parse")
    assert str(error.value) == (
        f"step 'parse' ({FILE}:{line}): map needs the output schema of untyped at {FILE}:"
        f"{untyped.__code__.co_firstlineno}: annotate its return type with a dataclass or TypedDict, or pass "
        "schema={'field': 'type', ...}")
    with fails(r"step 'flat_map' .*: flat_map needs the output schema of .*<lambda>"):
        events.flat_map(lambda e: [e])
    with fails(r"step 'map' .*: map needs a function, got 'upper'"):
        events.map("upper", schema={"user": "string"})  # type: ignore[arg-type]
    with fails(r"unknown type 'text'"):
        events.map(untyped, schema={"user": "text"})
    with fails(r"map_batches .*: format must be 'arrow' or 'pandas', got 'polars'"):
        events.map_batches(lambda b: b, format="polars")

    # Schemas from annotations: a dataclass for map, a list of TypedDicts for flat_map.
    assert events.map(to_purchase).node.schema == (("user", "string"), ("amount", "long"))
    assert events.flat_map(to_totals).node.schema == (("user", "string"), ("total", "double"))
    assert events.map(untyped, schema="user string, amount int").node.schema == (("user", "string"),
                                                                                 ("amount", "int"))
    # filter and map_batches without a schema keep their input's columns.
    assert events.filter(lambda e: True).node.schema == source(p, "same").node.schema
    assert events.map_batches(lambda b: b).node.schema == source(p, "same2").node.schema


# -- aggregates ------------------------------------------------------------------------------------

@pytest.mark.parametrize("aggs, message", [
    ({"n": "count"}, r"n='count' is not an aggregate; use hr.count\(\), hr.sum\(col\)"),
    ({"m": hr.Agg("median", "amount")}, r"m=median\('amount'\) is not an aggregate"),
    ({"s": hr.Agg("sum")}, r"s=sum\(\) needs a column, e.g. hr.sum\('price'\)"),
    ({"s": hr.sum("kind")}, r"s=sum\('kind'\): column 'kind' is a string; sum needs a number"),
    ({"avg": hr.mean("user")}, r"avg=mean\('user'\): column 'user' is a string; mean needs a number"),
    ({"user": hr.count()}, r"the aggregate user=count\(\) would replace the output column 'user'"),
    ({}, r"give at least one aggregate, e.g. aggregate\(n=hr.count\(\), total=hr.sum\('x'\)\)"),
])
@pytest.mark.fast
def test_bad_aggregates(aggs, message):
    p = hr.Pipeline("aggs")
    keyed = source(p).key_by("user")
    with pytest.raises(hr.PlanError, match=message) as error:
        line = next_line()
        keyed.aggregate(name="stats", **aggs)
    assert str(error.value).startswith(f"step 'stats' ({FILE}:{line}): ")


@pytest.mark.fast
def test_window_aggregates_cannot_reuse_the_window_columns():
    p = hr.Pipeline("window_aggs")
    windowed = source(p, event_time="ts").key_by("user").window(hr.Tumbling("1s"), name="w")
    with fails(r"step 'w' .*: the aggregate window_end=max\('ts'\) would replace the output column 'window_end'"):
        windowed.aggregate(window_end=hr.max("ts"))
    counted = windowed.aggregate(n=hr.count(), total=hr.sum("amount"), top=hr.max("amount"), avg=hr.mean("amount"))
    assert counted.node.schema == (("user", "string"), ("window_start", "timestamp"), ("window_end", "timestamp"),
                                   ("n", "long"), ("total", "long"), ("top", "long"), ("avg", "double"))


@pytest.mark.fast
def test_rolling_aggregate_schemas_and_names():
    p = hr.Pipeline("rolling")
    keyed = source(p).key_by("user", "kind")
    assert keyed.count().node.schema == (("user", "string"), ("kind", "string"), ("count", "long"))
    assert keyed.mean("amount").node.schema[-1] == ("mean", "double")
    assert [keyed.sum("amount").node.name, keyed.sum("amount").node.name] == ["sum", "sum_2"]
    by_fn = source(p, "other").key_by(lambda e: e["user"][:1], name="initial")
    assert by_fn.node.keys == ("key",)
    assert by_fn.count().node.schema == (("key", "string"), ("count", "long"))
    with fails(r"key_by .*: give at least one field or a function"):
        source(p, "third").key_by()
    keyed = source(p, "fourth", key="string", n="long")
    with fails(r"step 'key_fn' .*: the stream from 'fourth' already has a field 'key'"):
        keyed.key_by(lambda e: e["n"] % 2)
    assert keyed.key_by("key").count().node.schema == (("key", "string"), ("count", "long"))


# -- union -----------------------------------------------------------------------------------------

@pytest.mark.fast
def test_union_needs_the_same_fields_and_types():
    p = hr.Pipeline("unions")
    a = source(p, "a")
    with pytest.raises(hr.PlanError) as error:
        line = next_line()
        a.union(source(p, "b", user="string", amount="long"), name="both")
    assert str(error.value) == (
        f"step 'both' ({FILE}:{line}): streams with different fields cannot be united: 'a' has "
        "['amount', 'kind', 'ts', 'user'], 'b' has ['amount', 'user']")
    differently_typed = source(p, "c", user="string", kind="string", amount="double", ts="long")
    with fails(r"step 'union' .*: streams with different field types cannot be united: 'amount' is a long in "
               r"'a' and a double in 'c'"):
        a.union(differently_typed)
    with fails(r"union needs at least one other stream"):
        a.union(name="alone")
    with fails(r"stream 'a' belongs to another pipeline"):
        source(hr.Pipeline("other"), "x").union(a, name="mixed")
    # Same fields in another order are fine (united by name).
    reordered = source(p, "d", ts="long", amount="long", kind="string", user="string")
    assert a.union(reordered, name="ok").node.inputs == ("a", "d")


# -- guarantees ------------------------------------------------------------------------------------

@pytest.mark.fast
def test_exactly_once_with_an_at_least_once_sink_fails_when_built():
    p = hr.Pipeline("strict", guarantee="exactly-once")
    events = source(p)
    events.sink("kept", TestSink())
    line = next_line()
    events.sink("shown", hr.sinks.Console())
    with pytest.raises(hr.PlanError) as error:
        p.explain()
    assert str(error.value) == (
        f"pipeline 'strict' asks for exactly-once but can only give at-least-once: sink 'shown' (Console at "
        f"{FILE}:{line}) is at-least-once; use connectors that give exactly-once or ask for less")

    relaxed = hr.Pipeline("relaxed", guarantee="at-least-once")
    source(relaxed).sink("shown", hr.sinks.Console())
    assert "guarantee: at-least-once (events: exactly-once; shown: at-least-once)" in relaxed.explain()


# -- JSON and explain ------------------------------------------------------------------------------

def parse_event(event: dict[str, Any]) -> Purchase:
    return Purchase(event["user"], event["amount"])


def build_full_pipeline() -> hr.Pipeline:
    p = hr.Pipeline("shop")
    users = p.table("users", [{"user": "ann", "country": "fr"}])
    events = source(p, event_time="ts")
    enriched = events.filter(hr.col("kind") == "buy", name="buys").join(users, on="user", how="left",
                                                                         name="with_country")
    enriched.key_by("country").window(hr.Sliding("10s", "5s"), name="per_country").aggregate(
        n=hr.count(), total=hr.sum("amount")).sink("windows", TestSink())
    purchases = events.map(parse_event, name="parse").filter(lambda e: e.amount > 0, name="paid")
    purchases.sink("console", hr.sinks.Console(limit=3))
    return p


@pytest.mark.fast
def test_to_json_describes_every_node():
    p = build_full_pipeline()
    plan = p.to_json()
    assert json.loads(json.dumps(plan)) == plan, "the plan's JSON must need no default= to serialise"
    assert plan["pipeline"] == "shop"
    assert plan["guarantee"] == "at-least-once"
    assert plan["guarantee_by_connector"] == ["events: exactly-once", "windows: exactly-once",
                                              "console: at-least-once"]
    nodes = {n["name"]: n for n in plan["nodes"]}
    assert list(nodes) == ["users", "events", "events_event_time", "buys", "with_country", "key_by", "per_country",
                           "windows", "parse", "paid", "console"]
    assert {name: n["kind"] for name, n in nodes.items()} == {
        "users": "table", "events": "source", "events_event_time": "event_time", "buys": "native",
        "with_country": "join", "key_by": "key_by", "per_country": "window_aggregate", "windows": "sink",
        "parse": "python", "paid": "python", "console": "sink"}
    assert nodes["with_country"]["inputs"] == ["buys", "users"]
    assert nodes["with_country"]["on"] == ["user"] and nodes["with_country"]["how"] == "left"
    assert nodes["buys"]["exprs"] == [["condition", {"op": "eq", "args": [{"op": "col", "args": ["kind"]},
                                                                        {"op": "lit", "args": ["buy"]}]}]]
    assert nodes["per_country"]["window"] == {"kind": "sliding", "size_ms": 10_000, "slide_ms": 5_000,
                                              "offset_ms": 0}
    assert nodes["per_country"]["aggs"] == {"n": {"func": "count", "column": None},
                                            "total": {"func": "sum", "column": "amount"}}
    assert nodes["per_country"]["keys"] == ["country"]
    assert nodes["per_country"]["schema"] == [["country", "string"], ["window_start", "timestamp"],
                                              ["window_end", "timestamp"], ["n", "long"], ["total", "long"]]
    assert nodes["events_event_time"]["event_time"] == "ts"
    assert nodes["parse"]["function"] == f"parse_event at {FILE}:{parse_event.__code__.co_firstlineno}"
    assert nodes["parse"]["mode"] == "map"
    assert nodes["console"]["connector"] == {"type": "Console", "limit": 3, "truncate": False}
    assert nodes["console"]["guarantee"] == "at-least-once"
    assert nodes["users"]["rows"] == 1
    for node in plan["nodes"]:
        assert re.fullmatch(rf"{FILE}:\d+", node["defined_at"]), node
    assert json.loads(p.plan.to_json_text()) == plan


def test_explain_shows_the_dag_the_lowering_and_the_guarantee():
    p = build_full_pipeline()
    text = p.explain()
    lines = text.splitlines()
    assert lines[0] == "pipeline 'shop'"
    assert lines[1] == ("  guarantee: at-least-once (events: exactly-once; windows: exactly-once; "
                        "console: at-least-once)")
    assert lines[2] == "  one Spark streaming query, output mode append"

    def entry(name: str) -> tuple[str, str]:
        index = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
        return lines[index], lines[index + 1]

    node, lowered = entry("buys")
    assert "filter (col('kind') == 'buy') <- events_event_time" in node
    assert "lowered as: native Spark expressions" in lowered
    assert re.search(rf"\[{FILE}:\d+\]$", lowered)
    assert "inner" not in entry("with_country")[0]
    assert "left join with table 'users' on user <- buys, users" in entry("with_country")[0]
    assert "native stream-static join (broadcast)" in entry("with_country")[1]
    assert "window sliding 10s every 5s: n=count(), total=sum('amount') (emit final) <- key_by" in \
        entry("per_country")[0]
    assert ("stateful processor (transformWithStateInPandas, state per key, event-time timers) because of sliding "
            "windows (a late record is counted once, not once per window it missed)") in entry("per_country")[1]
    assert "native Spark watermark (withWatermark)" in entry("events_event_time")[1]
    assert f"map parse_event at {FILE}:" in entry("parse")[0]
    assert "fused Python stage #1 (mapInArrow: parse -> paid)" in entry("parse")[1]
    assert "fused Python stage #1 (mapInArrow: parse -> paid)" in entry("paid")[1]
    assert "foreachBatch, committed by batch id" in entry("console")[1]
    assert "Python data source" in entry("events")[1]
    assert "static DataFrame (broadcast)" in entry("users")[1]
    assert "  real-time mode: not possible (Spark's real-time mode reads only Kafka sources)" in lines
    watermark = lines[lines.index(entry("per_country")[1]) + 1]
    assert watermark.strip() == ("watermark: the event-time declaration 'events_event_time' (field 'ts', max "
                                 "out-of-orderness 0 ms)")
    # Every node has its line and its lowering line, and each stateful step its watermark and delay lines.
    assert len(lines) == 5 + 2 * len(p.plan.nodes) + 2


@pytest.mark.fast
def test_explain_of_updating_and_python_steps():
    p = hr.Pipeline("updates")
    events = source(p)
    events.key_by(lambda e: e["user"], name="by").count(name="n").sink("counts", TestSink())
    assert output_mode(p.plan) == "update"
    assert "output mode update" in p.explain()
    lowering = lowering_of(p.plan)
    assert lowering["n"] == "native Spark groupBy aggregate, update mode"
    assert lowering["by_fn"] == "fused Python stage #1 (mapInArrow: by_fn)"
    assert python_chains(p.plan) == [["by_fn"]]
    reducing = hr.Pipeline("reducing")
    source(reducing).key_by("user").reduce(lambda a, b: b, name="latest").sink("out", TestSink())
    assert lowering_of(reducing.plan)["latest"] == "stateful processor (applyInPandasWithState), update mode"


@pytest.mark.fast
def test_building_a_plan_never_starts_spark():
    """Build, validate, explain and export a plan in a fresh interpreter: no JVM is started."""
    code = (
        "import json, headrace as hr\n"
        "from pyspark import SparkContext\n"
        "from headrace.testing import TestSource, TestSink\n"
        "p = hr.Pipeline('p')\n"
        "s = p.source('s', TestSource([], schema={'a': 'long', 't': 'long'}), event_time='t')\n"
        "s.map(lambda r: r, schema={'a': 'long', 't': 'timestamp'}).key_by('a').window(hr.Tumbling('1s'))"
        ".count().sink('o', TestSink())\n"
        "p.explain(); json.dumps(p.to_json())\n"
        "print(SparkContext._gateway is None and SparkContext._active_spark_context is None)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "True", result.stderr


# -- columns called like a step's options --------------------------------------------------------

@pytest.mark.fast
def test_a_column_can_be_called_name_ttl_or_emit():
    """A keyword argument that holds a column expression (or an aggregate) is a column, whatever
    it is called; a mapping names columns beside a step name; a wrong step name says why."""
    p = hr.Pipeline("column_names")
    events = source(p, event_time="ts")
    assert events.select("user", name=hr.col("kind"), n=hr.col("amount")).node.schema == (
        ("user", "string"), ("name", "string"), ("n", "long"))
    tagged = events.with_columns(name=hr.col("user"))
    assert (tagged.node.name, tagged.node.schema[-1]) == ("with_columns", ("name", "string"))
    named = events.with_columns({"name": hr.col("amount")}, name="tag")
    assert (named.node.name, named.node.schema[-1]) == ("tag", ("name", "long"))
    keyed = events.key_by("user")
    rolling = keyed.aggregate(name=hr.count(), ttl=hr.sum("amount"))
    assert rolling.node.schema == (("user", "string"), ("name", "long"), ("ttl", "long"))
    assert keyed.aggregate({"name": hr.count()}, name="per_user").node.name == "per_user"
    windowed = keyed.window(hr.Tumbling("1s")).aggregate(emit=hr.count(), name=hr.max("amount"))
    assert windowed.node.schema[-2:] == (("emit", "long"), ("name", "long"))
    with pytest.raises(hr.PlanError) as error:
        line = next_line()
        events.filter(hr.col("amount") > 0, name=hr.col("user"))
    assert str(error.value) == (
        f"filter ({FILE}:{line}): name= is the step's name and must be a string, got a column expression "
        "col('user'); a column called 'name' is added by select(...) or with_columns(...), e.g. "
        "with_columns(name=hr.col('x'))")
    for misuse in (lambda: events.key_by(lambda e: e["user"], name=hr.col("user")),
                   lambda: events.window(hr.Tumbling("1s"), name=hr.col("user")),
                   lambda: keyed.count(name=hr.count()), lambda: keyed.sum("amount", name=hr.lit(1))):
        with fails(r"name= is the step's name and must be a string, got (a column expression|an aggregate)"):
            misuse()
    with fails(r"step name 3 must be a non-empty string"):
        events.map(lambda e: e, schema=EVENTS, name=3)
    with fails(r"step 'with_columns_2' .*: the column 'name' is given twice, in the mapping and as name="):
        events.with_columns({"name": hr.lit(1)}, name=hr.lit(2))


@pytest.mark.fast
def test_a_sink_that_cannot_take_updates_is_refused_when_the_pipeline_is_built(tmp_path):
    p = hr.Pipeline("updates_into_files")
    count_line = next_line()
    counts = source(p).key_by("user").count(name="per_user")
    with pytest.raises(hr.PlanError) as error:
        line = next_line()
        counts.sink("files", hr.sinks.Files(str(tmp_path / "out"), format="jsonl"))
    assert str(error.value) == (
        f"sink 'files' ({FILE}:{line}): a Files sink cannot take the updates of step 'per_user' ({FILE}:{count_line}), "
        "which emits updates (Spark's update mode: each micro-batch emits again every group it changed): files keep "
        "every row they are given, so each group's updates would pile up as rows; write the updates to a sink that "
        "keeps each group's last update by its key: hr.sinks.Delta(..., key=[...]), hr.sinks.Kafka(..., key=[...]) "
        "on a compacted topic, hr.sinks.Postgres(..., key=[...]), hr.sinks.Redis(key_prefix=..., key=[...]) or "
        "hr.sinks.View(key=[...]); or emit each result once (a window with emit='final')")
    with fails(r"sink 'table' .*: a Postgres sink cannot take the updates of step 'per_user'.*: without key= it "
               "inserts each update as a new row"):
        counts.sink("table", hr.sinks.Postgres("per_user_counts"))
    with fails(r"sink 'backup' .*: a Failover sink \(its member 'backup', a Files sink\) cannot take the updates"):
        counts.sink("backup", hr.sinks.Failover(hr.sinks.Console(), hr.sinks.Files(str(tmp_path / "b"))))
    counts.sink("upserted", hr.sinks.Postgres("per_user_counts", key="user"))
    counts.sink("console", hr.sinks.Console())
    p.validate()
    # a sink on a stateless branch beside a step that emits updates gets each of its rows once
    q = hr.Pipeline("sql_updates_beside_files")
    clicks = source(q)
    clicks.sink("files", hr.sinks.Files(str(tmp_path / "c")))
    q.sql("SELECT user, count(*) AS n FROM events GROUP BY user", name="per_user").sink("out", TestSink())
    q.validate()


@pytest.mark.fast
def test_explain_says_where_the_watermark_is_taken():
    p = hr.Pipeline("watermark_places")
    events = source(p, event_time="ts")
    big = events.filter(hr.col("amount") > 2, name="big")
    big.key_by("user").window(hr.Tumbling("1s"), name="per_user").count().sink("out", TestSink())
    assert "watermark taken here: the filters after it run above it" in p.explain()
    q = hr.Pipeline("watermark_on_an_edge")
    events = source(q, event_time="ts")
    events.filter(lambda e: e["amount"] > 2, name="python_big").key_by("user").window(
        hr.Tumbling("1s"), name="a").count().sink("a_out", TestSink())
    events.key_by("user").window(hr.Tumbling("1s"), name="b").count().sink("b_out", TestSink())
    line = next(x for x in q.explain().splitlines() if "lowered as: native Spark watermark" in x)
    assert "watermark taken on the way into 'key_by_2' (a Python step with event time declares it again" in line
    assert "above it" not in line


BUILD_ONLY = """
import sys
import headrace as hr
p = hr.Pipeline("no_spark")
events = p.source("events", hr.sources.Files("/tmp/in", schema={"k": "string", "v": "long", "ts": "timestamp"}),
                  event_time="ts", max_out_of_orderness="5s")
clicks = p.source("clicks", hr.sources.Kafka("clicks", schema={"k": "string", "ts": "timestamp"}),
                  event_time="ts", max_out_of_orderness="5s")
words = p.source("words", hr.sources.Generator("words", limit=10))
counts = events.filter(hr.col("v") > 0).key_by("k").window(hr.Tumbling("10s")).aggregate(n=hr.count())
counts.sink("pg", hr.sinks.Postgres("counts"))
clicks.key_by("k").window(hr.Session("30s")).count().sink("files", hr.sinks.Files("/tmp/out"))
words.sink("out", hr.sinks.TestSink())
p.validate()
print(sorted(m for m in ("pyspark", "py4j") if m in sys.modules))
"""


@pytest.mark.fast
def test_building_and_checking_a_plan_never_loads_pyspark():
    done = subprocess.run([sys.executable, "-c", BUILD_ONLY], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
