"""Every operator of the fluent API, through real pipelines on local Spark.

Each test builds a small pipeline on :class:`TestSource` micro-batches, runs it to the
end of its input with ``run_to_completion`` and checks what each :class:`TestSink`
received. Runs cost seconds each, so one pipeline often checks several operators on
separate branches (which also exercises several sinks on one query).
"""

from __future__ import annotations

import datetime
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet
import pytest
from pyspark import cloudpickle

import headrace as hr
from headrace.spark.specs import python_chains
from headrace.testing import TestSink, TestSource, Watermark, run_to_completion

UTC = datetime.UTC

# Spark's Python workers cannot import this test module (tests/ is not a package on their
# path), so the functions defined here travel by value, as those of a script would.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def at(ms: int) -> datetime.datetime:
    """Epoch milliseconds as the UTC datetime a TestSink returns."""
    return datetime.datetime.fromtimestamp(ms / 1000, tz=UTC)


def bag(rows: list[dict[str, Any]], *fields: str) -> Counter[tuple[Any, ...]]:
    """The rows as a multiset of tuples of ``fields`` (order of rows does not matter)."""
    return Counter(tuple(row[f] for f in fields) for row in rows)


ORDERS = {"item": "string", "qty": "long", "price": "double", "ts": "long"}
ORDER_ROWS = [
    {"item": "apple", "qty": 3, "price": 0.5, "ts": 1_000},
    {"item": "pear", "qty": 0, "price": 0.8, "ts": 2_000},
    {"item": "plum", "qty": 7, "price": 0.25, "ts": 3_000},
]


# -- stateless steps ---------------------------------------------------------------------------

@dataclass
class Piece:
    item: str
    n: int


def split_qty(order: dict[str, Any]) -> list[Piece]:
    """One record per unit, at most two; none for an empty order."""
    return [Piece(order["item"], i) for i in range(min(order["qty"], 2))]


def add_total(batch: pa.RecordBatch) -> pa.RecordBatch:
    qty = batch.column("qty").to_pylist()
    price = batch.column("price").to_pylist()
    return pa.RecordBatch.from_pydict({"item": batch.column("item"),
                                       "total": pa.array([q * p for q, p in zip(qty, price)], pa.float64())})


def shout(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.assign(item=frame["item"].str.upper())


def test_stateless_steps_each_on_its_own_branch(spark, tmp_path):
    p = hr.Pipeline("stateless")
    orders = p.source("orders", TestSource([ORDER_ROWS[:2], ORDER_ROWS[2:]], schema=ORDERS))
    sinks = {name: TestSink() for name in ("mapped", "flat", "kept_fn", "native", "arrow", "pandas")}

    orders.map(lambda o: {"item": o["item"], "cost": o["qty"] * o["price"]},
               schema={"item": "string", "cost": "double"}, name="cost").sink("mapped", sinks["mapped"])
    orders.flat_map(split_qty, name="split").sink("flat", sinks["flat"])
    orders.filter(lambda o: o["qty"] > 0, name="nonempty_fn").sink("kept_fn", sinks["kept_fn"])
    (orders.filter(hr.col("qty") > 0, name="nonempty_expr")
     .select("item", hr.col("qty").alias("units"), doubled=hr.col("qty") * 2, name="pick")
     .with_columns(big=hr.col("units") >= 5, units=hr.col("units") + 100, name="more")
     # a batch step without a schema keeps its input's columns, even those of unknown type
     .map_batches(lambda frame: frame[frame["doubled"] > 0], format="pandas", name="positive")
     .sink("native", sinks["native"]))
    orders.map_batches(add_total, schema={"item": "string", "total": "double"}, name="totals") \
        .sink("arrow", sinks["arrow"])
    orders.map_batches(shout, format="pandas", name="shout").sink("pandas", sinks["pandas"])

    out = run_to_completion(p, state_dir=str(tmp_path))

    assert bag(out["mapped"], "item", "cost") == Counter({("apple", 1.5): 1, ("pear", 0.0): 1, ("plum", 1.75): 1})
    assert list(out["mapped"][0]) == ["item", "cost"]
    assert bag(out["flat"], "item", "n") == Counter({("apple", 0): 1, ("apple", 1): 1, ("plum", 0): 1,
                                                     ("plum", 1): 1})
    assert bag(out["kept_fn"], "item", "qty", "price", "ts") == bag(
        [o for o in ORDER_ROWS if o["qty"] > 0], "item", "qty", "price", "ts")
    assert sorted(out["native"], key=lambda r: r["item"]) == [
        {"item": "apple", "units": 103, "doubled": 6, "big": False},
        {"item": "plum", "units": 107, "doubled": 14, "big": True},
    ]
    assert bag(out["arrow"], "item", "total") == Counter({("apple", 1.5): 1, ("pear", 0.0): 1, ("plum", 1.75): 1})
    assert bag(out["pandas"], "item", "qty", "price", "ts") == bag(
        [{**o, "item": o["item"].upper()} for o in ORDER_ROWS], "item", "qty", "price", "ts")


# -- fusion ------------------------------------------------------------------------------------

def parse(order: dict[str, Any]) -> dict[str, Any]:
    return {"item": order["item"], "units": order["qty"], "ts": order["ts"]}


def test_consecutive_python_steps_run_as_one_fused_stage(spark, tmp_path):
    p = hr.Pipeline("fused")
    orders = p.source("orders", TestSource([ORDER_ROWS], schema=ORDERS))
    (orders.map(parse, schema={"item": "string", "units": "long", "ts": "long"}, name="parse")
     .filter(lambda o: o["units"] > 0, name="nonempty")
     .key_by(lambda o: o["item"][0], name="initial")
     .map(lambda o: {"item": o["key"] + o["item"][1:], "units": o["units"] * 10},
          schema={"item": "string", "units": "long"}, name="tag")
     .flat_map(lambda o: [o] * 2, schema={"item": "string", "units": "long"}, name="twice")
     .map_batches(lambda b: b.filter(pa.compute.less(b.column("units"), 50)), name="small")
     .filter(hr.col("units") > 0, name="native_positive")
     .map(lambda o: {"item": o["item"].upper()}, schema={"item": "string"}, name="upper")
     .sink("out", TestSink()))

    # parse .. small (through the key function): one stage; the native filter ends it; upper is alone.
    chain = ["parse", "nonempty", "initial_fn", "tag", "twice", "small"]
    assert python_chains(p.plan) == [chain, ["upper"]]
    lines = p.explain().splitlines()
    stage = f"lowered as: fused Python stage #1 (mapInArrow: {' -> '.join(chain)})"
    for step in chain:
        line = next(i for i, text in enumerate(lines) if text.strip().startswith(step + " "))
        assert stage in lines[line + 1]
    assert sum("fused Python stage #1" in line for line in lines) == len(chain)
    assert any("fused Python stage #2 (mapInArrow: upper)" in line for line in lines)
    native = next(i for i, text in enumerate(lines) if text.strip().startswith("native_positive "))
    assert "lowered as: native Spark expressions" in lines[native + 1]

    out = run_to_completion(p, state_dir=str(tmp_path))
    # apple: 30 units, twice; pear: dropped (0 units); plum: 70 units, not small.
    assert out["out"] == [{"item": "APPLE"}, {"item": "APPLE"}]


@pytest.mark.fast
def test_a_python_step_with_two_consumers_ends_its_chain():
    p = hr.Pipeline("branching")
    orders = p.source("orders", TestSource([ORDER_ROWS], schema=ORDERS))
    parsed = orders.map(parse, schema={"item": "string", "units": "long", "ts": "long"}, name="parse")
    parsed.filter(lambda o: o["units"] > 1, name="many").sink("a", TestSink())
    parsed.filter(lambda o: o["units"] == 1, name="one").sink("b", TestSink())
    assert python_chains(p.plan) == [["parse"], ["many"], ["one"]]


# -- event time and windows --------------------------------------------------------------------

READINGS = {"sensor": "string", "site": "string", "value": "long", "ts": "long"}
# (sensor, site, value, event time in ms)
READING_ROWS = [
    {"sensor": "a", "site": "x", "value": 1, "ts": 1_000},
    {"sensor": "a", "site": "y", "value": 3, "ts": 3_000},
    {"sensor": "b", "site": "x", "value": 10, "ts": 5_000},
    {"sensor": "a", "site": "x", "value": 5, "ts": 12_000},
]


def test_tumbling_sliding_and_session_windows_on_long_millisecond_event_time(spark, tmp_path):
    p = hr.Pipeline("windows")
    readings = p.source("readings", TestSource([READING_ROWS[:2], READING_ROWS[2:]], schema=READINGS),
                        event_time="ts", max_out_of_orderness="1s")
    keyed = readings.key_by("sensor")
    sinks = {name: TestSink() for name in ("tumbling", "sliding", "session", "sites", "whole")}
    (keyed.window(hr.Tumbling("10s"), name="per_10s")
     .aggregate(n=hr.count(), total=hr.sum("value"), low=hr.min("value"), high=hr.max("value"),
                avg=hr.mean("value"))
     .sink("tumbling", sinks["tumbling"]))
    keyed.window(hr.Sliding("10s", "5s"), name="every_5s").count().sink("sliding", sinks["sliding"])
    keyed.window(hr.Session("3s"), name="sessions").aggregate(n=hr.count(), total=hr.sum("value")) \
        .sink("session", sinks["session"])
    (readings.key_by("sensor", "site").window(hr.Tumbling("10s"), name="per_site")
     .aggregate(n=hr.count()).sink("sites", sinks["sites"]))
    # The whole stream as one group, in windows shifted by an offset: [-5 s, 5 s), [5 s, 15 s).
    readings.window(hr.Tumbling("10s", offset="5s"), name="shifted").count().sink("whole", sinks["whole"])

    out = run_to_completion(p, state_dir=str(tmp_path))

    tumbling = out["tumbling"]
    assert list(tumbling[0]) == ["sensor", "window_start", "window_end", "n", "total", "low", "high", "avg"]
    # The bounded input's end fires the last windows ([10 s, 20 s) has not closed before it).
    assert bag(tumbling, "sensor", "window_start", "window_end", "n", "total", "low", "high", "avg") == Counter({
        ("a", at(0), at(10_000), 2, 4, 1, 3, 2.0): 1,
        ("b", at(0), at(10_000), 1, 10, 10, 10, 10.0): 1,
        ("a", at(10_000), at(20_000), 1, 5, 5, 5, 5.0): 1,
    })
    assert bag(out["sliding"], "sensor", "window_start", "window_end", "count") == Counter({
        ("a", at(-5_000), at(5_000), 2): 1, ("a", at(0), at(10_000), 2): 1,
        ("a", at(5_000), at(15_000), 1): 1, ("a", at(10_000), at(20_000), 1): 1,
        ("b", at(0), at(10_000), 1): 1, ("b", at(5_000), at(15_000), 1): 1,
    })
    assert bag(out["session"], "sensor", "window_start", "window_end", "n", "total") == Counter({
        ("a", at(1_000), at(6_000), 2, 4): 1,    # 1 s and 3 s: one session, until 3 s + gap
        ("b", at(5_000), at(8_000), 1, 10): 1,
        ("a", at(12_000), at(15_000), 1, 5): 1,
    })
    assert list(out["sites"][0]) == ["sensor", "site", "window_start", "window_end", "n"]
    assert bag(out["sites"], "sensor", "site", "window_start", "n") == Counter({
        ("a", "x", at(0), 1): 1, ("a", "y", at(0), 1): 1, ("b", "x", at(0), 1): 1, ("a", "x", at(10_000), 1): 1,
    })
    assert sorted(out["whole"], key=lambda r: r["window_start"]) == [
        {"window_start": at(-5_000), "window_end": at(5_000), "count": 2},
        {"window_start": at(5_000), "window_end": at(15_000), "count": 2},
    ]


STAMPED = {"user": "string", "clicks": "long", "at": "timestamp"}


def test_timestamp_event_time_and_final_emission(spark, tmp_path):
    """with_event_time on a timestamp field; emit="final" fires each window once, when the
    watermark passes its end (here moved by a Watermark marker), and the end of input fires the rest."""
    start = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
    second = datetime.timedelta(seconds=1)
    batches = [
        [{"user": "u1", "clicks": 1, "at": start + 1 * second}, {"user": "u2", "clicks": 4, "at": start + 2 * second}],
        [{"user": "u1", "clicks": 2, "at": start + 4 * second}],
        Watermark(start + 30 * second),  # closes [12:00:00, 12:00:10)
        [{"user": "u1", "clicks": 7, "at": start + 31 * second}],
    ]
    p = hr.Pipeline("timestamps")
    clicks = p.source("clicks", TestSource(batches, schema=STAMPED)).with_event_time("at", "2s", name="stamped")
    final = TestSink()
    clicks.key_by("user").window(hr.Tumbling("10s")).aggregate(total=hr.sum("clicks")).sink("final", final)

    seen: list[int] = []  # rows in the sink after each step of the input
    out = run_to_completion(p, state_dir=str(tmp_path), on_step=lambda run: seen.append(len(final.rows())))

    first, later = (start, start + 10 * second), (start + 30 * second, start + 40 * second)
    assert bag(out["final"], "user", "window_start", "window_end", "total") == Counter({
        ("u1", *first, 3): 1, ("u2", *first, 4): 1, ("u1", *later, 7): 1})
    assert seen[:2] == [0, 0], "a final window must not fire before the watermark passes its end"
    assert seen[2] == 2, "both windows of [12:00:00, 12:00:10) fire once the watermark passes 12:00:10"
    assert seen[-1] == 3


# -- keyed streams: rolling aggregates, updating windows, reduce ------------------------------

SALES = {"shop": "string", "region": "string", "amount": "long", "ts": "long"}
SALE_BATCHES = [
    [{"shop": "s1", "region": "north", "amount": 5, "ts": 1_000},
     {"shop": "s1", "region": "south", "amount": 2, "ts": 2_000},
     {"shop": "s2", "region": "north", "amount": 8, "ts": 3_000}],
    [{"shop": "s1", "region": "north", "amount": 11, "ts": 4_000}],
]


def test_rolling_aggregates_per_key_and_updating_windows(spark, tmp_path):
    """Rolling aggregates emit, for every key a micro-batch touches, the key's result so far;
    a window with emit="updates" emits its running result in each batch that changes it."""
    p = hr.Pipeline("rolling")
    sales = p.source("sales", TestSource(SALE_BATCHES, schema=SALES), event_time="ts")
    by_shop = sales.key_by("shop")
    names = ("count", "sum", "min", "max", "mean", "several", "two_keys", "key_fn", "window_updates")
    sinks = {name: TestSink() for name in names}
    by_shop.count(name="n").sink("count", sinks["count"])
    by_shop.sum("amount", name="total").sink("sum", sinks["sum"])
    by_shop.min("amount", name="low").sink("min", sinks["min"])
    by_shop.max("amount", name="high").sink("max", sinks["max"])
    by_shop.mean("amount", name="avg").sink("mean", sinks["mean"])
    by_shop.aggregate(n=hr.count(), total=hr.sum("amount"), top=hr.max("amount"), name="all") \
        .sink("several", sinks["several"])
    sales.key_by("shop", "region").count(name="per_region").sink("two_keys", sinks["two_keys"])
    sales.key_by(lambda sale: sale["region"][0].upper(), name="initial").sum("amount", name="by_initial") \
        .sink("key_fn", sinks["key_fn"])
    by_shop.window(hr.Tumbling("10s"), name="windowed").aggregate(total=hr.sum("amount"), emit="updates") \
        .sink("window_updates", sinks["window_updates"])
    assert "output mode update" in p.explain()

    steps: list[dict[str, int]] = []
    out = run_to_completion(p, state_dir=str(tmp_path),
                            on_step=lambda run: steps.append({n: len(s.rows()) for n, s in sinks.items()}))

    # The first batch's results, then the second's (only s1 and its keys are touched again).
    def per_batch(name: str, *fields: str) -> list[Counter[tuple[Any, ...]]]:
        rows, first = out[name], steps[0][name]
        return [bag(rows[:first], *fields), bag(rows[first:], *fields)]

    assert per_batch("count", "shop", "count") == [Counter({("s1", 2): 1, ("s2", 1): 1}), Counter({("s1", 3): 1})]
    assert per_batch("sum", "shop", "sum") == [Counter({("s1", 7): 1, ("s2", 8): 1}), Counter({("s1", 18): 1})]
    assert per_batch("min", "shop", "min") == [Counter({("s1", 2): 1, ("s2", 8): 1}), Counter({("s1", 2): 1})]
    assert per_batch("max", "shop", "max") == [Counter({("s1", 5): 1, ("s2", 8): 1}), Counter({("s1", 11): 1})]
    assert per_batch("mean", "shop", "mean") == [Counter({("s1", 3.5): 1, ("s2", 8.0): 1}),
                                                 Counter({("s1", 6.0): 1})]
    assert list(out["several"][0]) == ["shop", "n", "total", "top"]
    assert per_batch("several", "shop", "n", "total", "top") == [
        Counter({("s1", 2, 7, 5): 1, ("s2", 1, 8, 8): 1}), Counter({("s1", 3, 18, 11): 1})]
    assert list(out["two_keys"][0]) == ["shop", "region", "count"]
    assert per_batch("two_keys", "shop", "region", "count") == [
        Counter({("s1", "north", 1): 1, ("s1", "south", 1): 1, ("s2", "north", 1): 1}),
        Counter({("s1", "north", 2): 1})]
    assert list(out["key_fn"][0]) == ["key", "sum"]
    assert per_batch("key_fn", "key", "sum") == [Counter({("N", 13): 1, ("S", 2): 1}), Counter({("N", 24): 1})]
    assert per_batch("window_updates", "shop", "window_start", "window_end", "total") == [
        Counter({("s1", at(0), at(10_000), 7): 1, ("s2", at(0), at(10_000), 8): 1}),
        Counter({("s1", at(0), at(10_000), 18): 1})]


def keep_largest(kept: dict[str, Any], sale: dict[str, Any]) -> dict[str, Any]:
    """Reduce: the sale with the largest amount so far, with the number of sales seen."""
    best = sale if sale["amount"] > kept["amount"] else kept
    return {**best, "seen": kept["seen"] + 1}


def test_reduce_folds_each_keys_records_with_a_python_function(spark, tmp_path):
    p = hr.Pipeline("reducing")
    sales = p.source("sales", TestSource(SALE_BATCHES, schema=SALES))
    counted = sales.with_columns(seen=hr.lit(1).cast("long"), name="one")
    counted.key_by("shop").reduce(keep_largest, name="largest").sink("out", TestSink())
    assert "stateful processor" in p.explain()

    out = run_to_completion(p, state_dir=str(tmp_path))["out"]
    assert bag(out, "shop", "region", "amount", "ts", "seen") == Counter({
        ("s1", "north", 5, 1_000, 2): 1,   # batch 1: s1's two sales, the larger kept
        ("s2", "north", 8, 3_000, 1): 1,   # a single record is its own result
        ("s1", "north", 11, 4_000, 3): 1,  # batch 2 continues from the state of batch 1
    })


# -- joins with static tables ------------------------------------------------------------------

CLICKS = {"user": "string", "page": "string"}
CLICK_ROWS = [{"user": "ann", "page": "home"}, {"user": "bob", "page": "cart"}, {"user": "cid", "page": "home"}]
USERS = [{"user": "ann", "country": "fr"}, {"user": "bob", "country": "de"}]


def test_joins_with_static_tables_from_rows_parquet_and_csv(spark, tmp_path):
    parquet = tmp_path / "users.parquet"
    pyarrow.parquet.write_table(pa.Table.from_pylist(USERS), parquet)
    csv = tmp_path / "users.csv"
    csv.write_text("user,country\nann,fr\nbob,de\n")

    p = hr.Pipeline("joins")
    clicks = p.source("clicks", TestSource([CLICK_ROWS[:2], CLICK_ROWS[2:]], schema=CLICKS))
    from_rows = p.table("users", USERS)
    from_parquet = p.table("users_parquet", path=str(parquet), format="parquet")
    from_csv = p.table("users_csv", path=str(csv), format="csv", schema={"user": "string", "country": "string"})
    sinks = {name: TestSink() for name in ("inner", "left", "parquet", "csv")}
    clicks.join(from_rows, on="user", name="known").sink("inner", sinks["inner"])
    clicks.join(from_rows, on="user", how="left", name="all").sink("left", sinks["left"])
    clicks.join(from_parquet, on=["user"], how="left", name="via_parquet").sink("parquet", sinks["parquet"])
    clicks.join(from_csv, on="user", name="via_csv").sink("csv", sinks["csv"])

    out = run_to_completion(p, state_dir=str(tmp_path / "state"))

    matched = Counter({("ann", "home", "fr"): 1, ("bob", "cart", "de"): 1})
    assert bag(out["inner"], "user", "page", "country") == matched
    assert sorted(out["inner"][0]) == ["country", "page", "user"]
    assert bag(out["left"], "user", "page", "country") == matched + Counter({("cid", "home", None): 1})
    assert bag(out["parquet"], "user", "page", "country") == matched + Counter({("cid", "home", None): 1})
    assert bag(out["csv"], "user", "page", "country") == matched


# -- union and several sinks ---------------------------------------------------------------------

def test_union_of_streams_with_the_same_fields(spark, tmp_path):
    p = hr.Pipeline("merged")
    web = p.source("web", TestSource([[{"user": "ann", "page": "home"}], [{"user": "bob", "page": "cart"}]],
                                     schema=CLICKS))
    # Same fields in another order, as a second source: united by name.
    app = p.source("app", TestSource([[{"page": "feed", "user": "cid"}]], schema={"page": "string", "user": "string"}))
    marked = web.with_columns(page=hr.col("page").upper(), name="loud")
    both = marked.union(app, name="both")
    both.sink("all", TestSink())
    both.key_by("user").count().sink("counts", TestSink())

    out = run_to_completion(p, state_dir=str(tmp_path))
    assert bag(out["all"], "user", "page") == Counter({("ann", "HOME"): 1, ("bob", "CART"): 1, ("cid", "feed"): 1})
    assert bag(out["counts"], "user", "count") == Counter({("ann", 1): 1, ("bob", 1): 1, ("cid", 1): 1})


def test_several_sinks_same_stream_and_different_branches(spark, tmp_path):
    """One stream to two sinks; a window count to one sink and a filtered stream to another;
    every sink gets exactly its rows."""
    p = hr.Pipeline("fan_out")
    readings = p.source("readings", TestSource([READING_ROWS[:3], READING_ROWS[3:]], schema=READINGS),
                        event_time="ts")
    big = readings.filter(hr.col("value") >= 3, name="big")
    first, second, windows, small, upper = TestSink(), TestSink(), TestSink(), TestSink(), TestSink()
    big.sink("first", first)
    big.sink("second", second)
    readings.key_by("sensor").window(hr.Tumbling("10s"), name="per_10s").count().sink("windows", windows)
    readings.filter(lambda r: r["value"] < 3, name="below_3").sink("small", small)
    # A window after a Python step, beside the native window: each gets its own watermark.
    relabelled = readings.map(lambda r: {"sensor": r["sensor"].upper(), "ts": r["ts"]},
                              schema={"sensor": "string", "ts": "timestamp"}, name="relabel")
    relabelled.key_by("sensor").window(hr.Tumbling("10s"), name="relabelled_10s").count().sink("upper", upper)

    out = run_to_completion(p, state_dir=str(tmp_path))

    expected_big = Counter({("a", 3, at(3_000)): 1, ("b", 10, at(5_000)): 1, ("a", 5, at(12_000)): 1})
    assert bag(out["first"], "sensor", "value", "ts") == expected_big
    assert bag(out["second"], "sensor", "value", "ts") == expected_big
    assert bag(out["small"], "sensor", "value", "ts") == Counter({("a", 1, at(1_000)): 1})
    assert bag(out["windows"], "sensor", "window_start", "count") == Counter({
        ("a", at(0), 2): 1, ("b", at(0), 1): 1, ("a", at(10_000), 1): 1})
    assert sorted(out["windows"][0]) == ["count", "sensor", "window_end", "window_start"]
    assert bag(out["upper"], "sensor", "window_start", "count") == Counter({
        ("A", at(0), 2): 1, ("B", at(0), 1): 1, ("A", at(10_000), 1): 1})
    # Each sink commits the same batch ids (one query): the two sinks of one stream agree batch by batch.
    assert first.batches == second.batches


def test_a_count_window_over_the_whole_stream_is_one_group(spark, tmp_path):
    p = hr.Pipeline("unkeyed_count")
    values = TestSource([[{"v": 1}, {"v": 2}, {"v": 3}], [{"v": 4}, {"v": 5}]], schema={"v": "long"})
    out = TestSink()
    p.source("values", values).window(hr.Count(2)).aggregate(total=hr.sum("v")).sink("out", out)
    run_to_completion(p, state_dir=str(tmp_path))
    assert [(r["pane_kind"], r["total"]) for r in out.rows()] == [("count", 3), ("count", 7)]
