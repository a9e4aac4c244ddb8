"""Joins of two streams (docs/joins.md) against a model in plain Python: every kind of interval
join and a window join in one query with late and out-of-order records, a join chained into a
window across a restart from the checkpoint, and every join refused as the pipeline is built.
tests/test_chaos.py kills a join's driver; tests/test_examples.py runs examples/auction_bids.py."""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from pyspark import cloudpickle

import headrace as hr
from headrace.environment import checkpoints
from headrace.errors import PlanError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, run_to_completion

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the process function below reaches Spark's workers
S = 1_000
BID = {"auction": "long", "price": "long", "bt": "long"}
AUCTION = {"id": "long", "seller": "string", "at": "long"}
# Micro-batch by micro-batch, both sides at once. The watermark (no out-of-orderness allowed)
# is the smaller of the sides' largest event times before the batch: 8 s in batch 1, 31 s in
# batch 2. In batch 2, the bid at 1 s and the auction at 2 s are late (dropped); the auction at
# 33 s is out of order but on time.
BIDS = [[{"auction": 1, "price": 10, "bt": 5 * S}, {"auction": 2, "price": 20, "bt": 6 * S},
         {"auction": 5, "price": 50, "bt": 8 * S}],
        [{"auction": 1, "price": 11, "bt": 30 * S}, {"auction": 3, "price": 30, "bt": 31 * S}],
        [{"auction": 1, "price": 12, "bt": 1 * S}, {"auction": 4, "price": 40, "bt": 50 * S},
         {"auction": 3, "price": 31, "bt": 34 * S}]]
AUCTIONS = [[{"id": 1, "seller": "ann", "at": 4 * S}, {"id": 9, "seller": "zoe", "at": 9 * S}],
            [{"id": 2, "seller": "bob", "at": 12 * S}, {"id": 3, "seller": "cat", "at": 40 * S},
             {"id": 1, "seller": "ann", "at": 25 * S}],
            [{"id": 1, "seller": "ann", "at": 2 * S}, {"id": 4, "seller": "dan", "at": 55 * S},
             {"id": 3, "seller": "cat", "at": 33 * S}]]
WITHIN = (-10 * S, 10 * S)
WINDOW = 20 * S


# -- the model -------------------------------------------------------------------------------------

def on_time(batches: list[list[dict[str, Any]]], time: str, other: list[list[dict[str, Any]]],
            other_time: str, lag: int, window: int | None = None) -> list[dict[str, Any]]:
    """The records Spark keeps: a record is late when its event time (in a join of ``window``s,
    its window's end) is at or before the watermark it is judged by, the smaller of the sides'
    largest event times seen before the batch (``lag`` batches earlier still, as Spark judges a
    query of several stateful steps)."""
    kept, marks = [], []
    seen_mine: list[int] = []
    seen_other: list[int] = []
    for number, batch in enumerate(batches):
        judged = number - 1 - lag  # the watermark after the batch before (or ``lag`` earlier)
        mark = marks[judged] if 0 <= judged < len(marks) else None
        kept += [r for r in batch if mark is None or (r[time] if window is None else r[time] // window * window
                                                      + window) > mark]
        seen_mine += [r[time] for r in batch]
        seen_other += [r[other_time] for r in other[number]]
        marks.append(min(max(seen_mine), max(seen_other)) if seen_mine and seen_other else None)
    return kept


def model_join(how: str, matches: Callable[[dict[str, Any], dict[str, Any]], bool],
               lag: int) -> Counter[tuple[Any, ...]]:
    window = WINDOW if matches is same_window else None  # a window join judges records by their window's end
    bids = on_time(BIDS, "bt", AUCTIONS, "at", lag, window)
    auctions = on_time(AUCTIONS, "at", BIDS, "bt", lag, window)
    rows: Counter[tuple[Any, ...]] = Counter()
    for b in bids:
        for a in auctions:
            if b["auction"] == a["id"] and matches(b, a):
                rows[(b["auction"], b["price"], b["bt"], a["id"], a["seller"], a["at"])] += 1
    if how in ("left", "full"):
        for b in bids:
            if not any(b["auction"] == a["id"] and matches(b, a) for a in auctions):
                rows[(b["auction"], b["price"], b["bt"], None, None, None)] += 1
    if how in ("right", "full"):
        for a in auctions:
            if not any(b["auction"] == a["id"] and matches(b, a) for b in bids):
                rows[(None, None, None, a["id"], a["seller"], a["at"])] += 1
    return rows


def within(b: dict[str, Any], a: dict[str, Any]) -> bool:
    return WITHIN[0] <= a["at"] - b["bt"] <= WITHIN[1]


def same_window(b: dict[str, Any], a: dict[str, Any]) -> bool:
    return b["bt"] // WINDOW == a["at"] // WINDOW


# -- headrace ----------------------------------------------------------------------------------------

def millis(value: datetime.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def got(sink: TestSink) -> Counter[tuple[Any, ...]]:
    return Counter((r["auction"], r["price"], millis(r["bt"]), r["id"], r["seller"], millis(r["at"]))
                   for r in sink.rows())


def sources(p: hr.Pipeline) -> tuple[hr.Stream, hr.Stream]:
    bids = p.source("bids", TestSource(BIDS, schema=BID), event_time="bt")
    auctions = p.source("auctions", TestSource(AUCTIONS, schema=AUCTION), event_time="at")
    return bids, auctions


@pytest.mark.fast
def test_the_data_keeps_clear_of_the_late_boundary():
    # judged by the watermark after the batch before or after the one before that, the same records are late
    for time, other, other_time, rows in (("bt", AUCTIONS, "at", BIDS), ("at", BIDS, "bt", AUCTIONS)):
        assert on_time(rows, time, other, other_time, 0) == on_time(rows, time, other, other_time, 1)
    assert len(on_time(BIDS, "bt", AUCTIONS, "at", 0)) == 7  # the bid at 1 s is late
    assert len(on_time(AUCTIONS, "at", BIDS, "bt", 0)) == 7  # the auction at 2 s is late
    # judged by their window's end (a window join), the same records are late for the watermark after the batch
    # before, but not for the one before that: the window of the bid at 1 s and the auction at 2 s ends at 20 s
    for rows, time, other, other_time in ((BIDS, "bt", AUCTIONS, "at"), (AUCTIONS, "at", BIDS, "bt")):
        assert on_time(rows, time, other, other_time, 0, WINDOW) == on_time(rows, time, other, other_time, 0)
        assert len(on_time(rows, time, other, other_time, 1, WINDOW)) == 8


def test_every_kind_of_join_and_a_window_join_in_one_query(spark, tmp_path):
    p = hr.Pipeline("joins_all_kinds")
    bids, auctions = sources(p)
    sinks = {}
    for how in ("inner", "left", "right", "full"):
        sinks[how] = TestSink()
        bids.join(auctions, on={"auction": "id"}, how=how, within=("-10s", "10s"), name=f"{how}_join").sink(
            how, sinks[how])
    windowed = TestSink()
    bids.join(auctions, on={"auction": "id"}, window=hr.Tumbling("20s"), name="window_join").sink("windowed", windowed)
    earlier = TestSink()  # a self-join: each bid with the other bids for its auction in the 30 s before it
    p.sql("SELECT b1.auction, b1.price, b2.price AS earlier FROM bids b1 JOIN bids b2 ON b1.auction = b2.auction "
          "AND b2.bt BETWEEN b1.bt - INTERVAL 30 SECONDS AND b1.bt AND b1.price <> b2.price",
          name="sql_self_join").sink("earlier", earlier)
    assert "native Spark stream-stream join (full_outer" in p.explain()
    result = PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start().wait(until_exhausted=True)
    # the late bid and the late auction, dropped and counted by each of the six joins (the self-join's
    # two sides are bids: the late bid twice)
    assert result.late_rows_dropped == 6 * 2
    for how, sink in sinks.items():
        assert got(sink) == model_join(how, within, lag=1), how
    bids = on_time(BIDS, "bt", AUCTIONS, "at", lag=1)
    assert Counter((r["auction"], r["price"], r["earlier"]) for r in earlier.rows()) == Counter(
        (b1["auction"], b1["price"], b2["price"]) for b1 in bids for b2 in bids
        if b1["auction"] == b2["auction"] and -30 * S <= b2["bt"] - b1["bt"] <= 0 and b1["price"] != b2["price"])
    # Spark judges late records by the watermark of the micro-batch before (several stateful steps); a batch
    # without data (the watermark moved) runs between those of the input, so that is the watermark after the
    # input's batch before (lag 0), which the window join, judging by the window's end, tells from lag 1
    assert got(windowed) == model_join("inner", same_window, lag=0)
    starts = {(r["auction"], millis(r["window_start"]), millis(r["window_end"])) for r in windowed.rows()}
    assert starts == {(row[0], row[2] // WINDOW * WINDOW, row[2] // WINDOW * WINDOW + WINDOW)
                      for row in model_join("inner", same_window, lag=0)}


def joined_then_windowed(name: str) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    bids, auctions = sources(p)
    per_seller = (bids.join(auctions, on={"auction": "id"}, how="inner", within=WITHIN, name="bids_auctions")
                  .key_by("seller").window(hr.Tumbling("1m"), name="per_seller")
                  .aggregate(bids=hr.count(), total=hr.sum("price")))
    sink = TestSink()
    per_seller.sink("per_seller_out", sink)
    in_sql = p.sql("SELECT a.seller, window(b.bt, '1 minute') AS window, count(*) AS bids, sum(b.price) AS total "
                   "FROM bids b JOIN auctions a ON b.auction = a.id "
                   "AND a.at >= b.bt - INTERVAL 10 SECONDS AND a.at <= b.bt + INTERVAL 10 SECONDS "
                   "GROUP BY a.seller, window(b.bt, '1 minute')", name="per_seller_sql")
    in_sql.sink("per_seller_sql_out", sink_sql := TestSink())
    return p, sink, sink_sql


def model_per_seller() -> list[tuple[Any, ...]]:
    totals: dict[tuple[str, int], list[int]] = {}
    for (_, price, bt, _, seller, _), n in model_join("inner", within, lag=1).items():
        entry = totals.setdefault((seller, bt // 60_000 * 60), [0, 0])
        entry[0] += n
        entry[1] += n * price
    return sorted((seller, start, n, total) for (seller, start), (n, total) in totals.items())


def per_seller_rows(sink: TestSink) -> list[tuple[Any, ...]]:
    return sorted((r["seller"], int(r["window_start"].timestamp()), r["bids"], r["total"]) for r in sink.rows())


def test_a_join_chained_into_a_window_restarts_from_its_checkpoint_with_the_same_output(spark, tmp_path):
    """The join and the window in the fluent API, and the same in one SQL query, side by side."""
    state = str(tmp_path / "state")
    first, sink, sink_sql = joined_then_windowed("joins_restart")
    assert "lowered as: native Spark window aggregate, append mode" in first.explain()
    run = PipelineRun(first, state_dir=state, progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=lambda r: r.request_stop("test"))  # after the first step
    assert not run.exhausted()
    second, sink_after, sink_sql_after = joined_then_windowed("joins_restart")
    sink_after.batches.update(sink.batches)
    sink_sql_after.batches.update(sink_sql.batches)
    PipelineRun(second, state_dir=state, progress="quiet").start().wait(until_exhausted=True)
    assert per_seller_rows(sink_after) == model_per_seller()
    assert per_seller_rows(sink_sql_after) == model_per_seller()
    # which step each of Spark's stateful operators belongs to (the web UI's state by partition), against
    # Spark's own name for each operator in the checkpoint: the SQL step holds a join and an aggregate
    root = tmp_path / "state" / "joins_restart"
    kinds = {int(folder.name): json.loads((folder / "_metadata" / "metadata").read_text().splitlines()[1])[
        "operatorInfo"]["operatorName"] for folder in (root / "checkpoint" / "state").iterdir()}
    steps = checkpoints.read_state_operators(str(root))
    assert sorted((kinds[operator], step) for operator, step in steps.items()) == [
        ("stateStoreSave", "per_seller"), ("stateStoreSave", "per_seller_sql"),
        ("symmetricHashJoin", "bids_auctions"), ("symmetricHashJoin", "per_seller_sql")]


# An auction's event time is its end: grouped by it after the join, each auction's result is final,
# and emitted once, when the watermark passes the end. An auction lasts at most 30 s. Every record
# is on time (the watermark before batch 1 is 8 s, before batch 2 25 s); the bid at 25 s for
# auction 1 comes after it ended, and matches nothing.
ENDING = {"id": "long", "seller": "long", "at": "long", "ends": "long"}
ENDING_AUCTIONS = [[{"id": 1, "seller": 7, "at": 0, "ends": 20 * S},
                    {"id": 2, "seller": 8, "at": 2 * S, "ends": 30 * S}],
                   [{"id": 3, "seller": 7, "at": 12 * S, "ends": 40 * S}],
                   [{"id": 4, "seller": 7, "at": 35 * S, "ends": 60 * S}]]
BIDS_TO_THE_END = [[{"auction": 1, "price": 10, "bt": 5 * S}, {"auction": 2, "price": 15, "bt": 6 * S},
                    {"auction": 1, "price": 12, "bt": 8 * S}],
                   [{"auction": 1, "price": 11, "bt": 15 * S}, {"auction": 2, "price": 25, "bt": 18 * S},
                    {"auction": 3, "price": 30, "bt": 19 * S}, {"auction": 1, "price": 99, "bt": 25 * S}],
                   [{"auction": 3, "price": 33, "bt": 38 * S}, {"auction": 4, "price": 40, "bt": 45 * S},
                    {"auction": 2, "price": 26, "bt": 29 * S}]]


class SalesSoFar(hr.KeyedProcessFunction):
    """Per seller (a long), each sale with the seller's total so far, in the order the auctions end. A
    micro-batch's results come in any order, each ended after those of the batches before, so they wait
    for the timer the next batch's watermark passes (at the end of the input: for the last records)."""

    waiting = hr.ListState()
    total = hr.ValueState(default=0)

    def process(self, record, ctx):
        self.waiting.append((ctx.timestamp, record["id"], record["price"]))
        ctx.register_event_time_timer((ctx.watermark or 0) + 1)

    def on_timer(self, timer, ctx):
        assert isinstance(ctx.key, int), ctx.key  # not the decimal an integer key travels in
        for _, auction, price in sorted(self.waiting.get()):
            self.total.set(self.total.get() + price)
            ctx.emit({"seller": ctx.key, "auction": auction, "so_far": self.total.get()})
        self.waiting.clear()


def model_sales_so_far() -> list[tuple[int, int, int]]:
    sellers = {a["id"]: a["seller"] for batch in ENDING_AUCTIONS for a in batch}
    totals: Counter[int] = Counter()
    rows = []
    for auction, _, best, _, _ in sorted(model_winners(), key=lambda row: (row[1], row[0])):
        totals[sellers[auction]] += best
        rows.append((sellers[auction], auction, totals[sellers[auction]]))
    return sorted(rows)


def model_winners() -> Counter[tuple[Any, ...]]:
    """Each auction, its end, its highest bid's price and time, and how many bids it had."""
    bids = [b for batch in BIDS_TO_THE_END for b in batch]
    rows: Counter[tuple[Any, ...]] = Counter()
    for a in (a for batch in ENDING_AUCTIONS for a in batch):
        during = [b for b in bids if b["auction"] == a["id"] and a["at"] <= b["bt"] <= a["ends"]]
        if during:
            best = max(during, key=lambda b: b["price"])
            rows[(a["id"], a["ends"], best["price"], best["bt"], len(during))] += 1
    return rows


def test_a_join_grouped_by_an_event_time_emits_each_group_once_when_it_has_ended(spark, tmp_path):
    """The top bid per auction (ROW_NUMBER over a comma join, as NEXMark's q9 is written), then a process
    step over those results, and an aggregate per auction (GROUP BY after JOIN ... ON), all partitioned by
    the auctions' event time, in one query."""
    p = hr.Pipeline("joins_until_the_end")
    p.source("bids", TestSource(BIDS_TO_THE_END, schema=BID), event_time="bt")
    p.source("auctions", TestSource(ENDING_AUCTIONS, schema=ENDING), event_time="ends")
    bound = "b.bt BETWEEN timestamp_millis(a.at) AND a.ends AND a.ends <= b.bt + INTERVAL 30 SECONDS"
    top, totals = TestSink(), TestSink()
    winners = p.sql(f"""SELECT id, seller, ends, price, bt FROM (
                SELECT a.id, a.seller, a.ends, b.price, b.bt,
                       ROW_NUMBER() OVER (PARTITION BY a.id, a.ends ORDER BY b.price DESC, b.bt) AS rank
                  FROM auctions a, bids b WHERE a.id = b.auction AND {bound}) WHERE rank <= 1""",
          name="winning_bids")
    winners.sink("top", top)
    sales = TestSink()  # the results go on to a process step in the same query, each at its auction's end
    winners.key_by("seller").process(SalesSoFar(), schema={"seller": "long", "auction": "long", "so_far": "long"},
                                     name="sales_so_far").sink("sales", sales)
    p.sql(f"""SELECT a.id, a.ends, max(b.price) AS best, count(*) AS bids
                FROM auctions a JOIN bids b ON a.id = b.auction AND {bound} GROUP BY a.id, a.ends""",
          name="per_auction").sink("totals", totals)
    result = PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start().wait(until_exhausted=True)

    assert result.late_rows_dropped == 0
    expected = model_winners()
    assert Counter((r["id"], millis(r["ends"]), r["price"], millis(r["bt"]), None) for r in top.rows()) == Counter(
        {(*row[:4], None): n for row, n in expected.items()})
    by_auction = Counter((r["id"], millis(r["ends"]), r["best"], r["bids"]) for r in totals.rows())
    assert by_auction == Counter({(i, ends, best, bids): n for (i, ends, best, _, bids), n in expected.items()})
    assert sorted((r["seller"], r["auction"], r["so_far"]) for r in sales.rows()) == model_sales_so_far()


# -- refused as the pipeline is built ------------------------------------------------------------------

def refusal(build: Callable[[hr.Pipeline, hr.Stream, hr.Stream], Any]) -> str:
    p = hr.Pipeline("refused_join")
    bids, auctions = sources(p)
    with pytest.raises(PlanError) as caught:
        build(p, bids, auctions)
        p.validate()
    return str(caught.value)


JOINED = "SELECT b.auction, a.seller FROM bids b JOIN auctions a ON b.auction = a.id"
BOUND = " AND a.at BETWEEN b.bt - INTERVAL 1 MINUTE AND b.bt"


@pytest.mark.parametrize("build, message", [
    (lambda p, b, a: p.sql(JOINED),
     r"step 'sql' \(test_stream_joins.py:\d+\): the join of stream 'a' is not bounded in event time from below and "
     r"above by another stream's: Spark would keep every record of both sides in its state forever. Add a condition "
     r"on both event times to its ON clause, e.g. AND a.at BETWEEN b.bt - INTERVAL 10 SECONDS AND b.bt \+ INTERVAL "
     r"10 SECONDS \(an interval join\), or AND window\(a.at, '10 seconds'\) = window\(b.bt, '10 seconds'\) \(a window "
     r"join\)\n  at line 1, column 45 of the query:"),
    (lambda p, b, a: p.sql(JOINED + " AND a.at > b.bt - INTERVAL 1 MINUTE"),
     r"the join of stream 'a' is not bounded in event time from above by another stream's"),
    (lambda p, b, a: p.sql(JOINED.replace("auctions a", "plain a") + BOUND)
     if p.source("plain", TestSource([], schema=AUCTION)) else None,
     r"the query joins streams, and stream 'a' \('plain'\) has no event time"),
    (lambda p, b, a: p.sql("SELECT a.seller, count(*) AS n FROM bids b JOIN auctions a ON b.auction = a.id" + BOUND
                           + " GROUP BY a.seller"),
     r"an aggregate without a window \(update mode\) cannot follow a join of streams in one query"),
    (lambda p, b, a: p.sql(JOINED.replace("SELECT", "SELECT DISTINCT") + BOUND),
     r"DISTINCT cannot follow a join of streams in one query"),
    (lambda p, b, a: p.sql("SELECT count(*) AS n FROM bids b JOIN auctions a ON b.auction = a.id" + BOUND
                           + " GROUP BY window(b.price, '1 minute')"),
     r"window\(\) must read the event-time field of one of the streams \('at', 'bt'\)"),

    (lambda p, b, a: b.join(a, on={"auction": "id"}),
     r"step 'join' \(test_stream_joins.py:\d+\): a join of two streams keeps every record of both sides .* "
     r"needs a bound in event time: within=\(lower, upper\)"),
    (lambda p, b, a: b.join(a, on={"auction": "id"}, how="outer", within="5s"),
     r"how must be one of 'inner', 'left', 'right', 'full', got 'outer'"),
    (lambda p, b, a: b.join(a, on={"auction": "id"}, within=("10s", "-10s")),
     r"within's lower bound \('10s'\) is after its upper bound \('-10s'\)"),
    (lambda p, b, a: b.join(a, on={"auction": "id"}, window=hr.Sliding("10s", "5s")),
     r"a window join takes tumbling windows \(hr.Tumbling\), got Sliding"),
    (lambda p, b, a: b.join(a, on={"auction": "id"}, within="5s", window=hr.Tumbling("5s")),
     r"give within= or window=, not both"),
    (lambda p, b, a: b.join(a, on={"auction": "seller"}, within="5s"),
     r"the right stream \('auctions_event_time'\) has no field 'seller'|join field 'auction' is a long"),
    (lambda p, b, a: b.join(a, on="price", within="5s"),
     r"the right stream \('auctions_event_time'\) has no field 'price'; it has id, seller, at"),
    (lambda p, b, a: b.join(a.select("id", "seller", "at", price=hr.col("id")), on={"auction": "id"}, within="5s"),
     r"both have a field 'price' that is not a join field of the same name; rename one of them"),
    (lambda p, b, a: b.join(p.source("plain", TestSource([], schema=AUCTION)), on={"auction": "id"}, within="5s"),
     r"the right stream \('plain'\) has no event time; declare it \(event_time= on the source"),
    (lambda p, b, a: b.join(b.key_by("auction").window(hr.Tumbling("1m")).count(), on="auction", within="5s"),
     r"the right stream \('window'\) is the results of a stateful step"),
    (lambda p, b, a: b.join(a.select("id", "seller", bt=hr.col("at")).with_event_time("bt"), on={"auction": "id"},
                            within="5s"),
     r"both streams call their event time 'bt'; rename it on one side"),
    (lambda p, b, a: b.join(a, on={"auction": "id"}, how="full", within="5s").key_by("seller")
     .window(hr.Tumbling("1m")).count(),
     r"carry no event time: it is a full join"),
])
def test_a_join_spark_could_not_run_or_would_keep_forever_is_refused(build, message):
    assert re.search(message, refusal(build)), refusal(build)


# -- in a pipeline file --------------------------------------------------------------------------------

JOIN_FILE = """
pipeline: joins_in_a_file
sources:
  bids: {type: TestSource, batches: [], schema: "auction long, price long, bt long", event_time: bt}
  auctions: {type: TestSource, batches: [], schema: "id long, seller string, at long", event_time: at}
steps:
  - name: with_seller
    from: bids
    join: auctions
    on: {auction: id}
    how: left
    within: [-10s, 10s]
  - name: in_windows
    from: bids
    join: auctions
    on: {auction: id}
    in_window: {tumbling: 20s}
  - name: too_late
    from: with_seller
    late_records: true
sinks:
  out: {type: TestSink, from: with_seller}
  windows: {type: TestSink, from: in_windows}
  late: {type: TestSink, from: too_late}
"""


@pytest.mark.fast
def test_a_pipeline_file_joins_two_streams_as_the_fluent_api_does(tmp_path):
    from headrace.api.pipeline_file import load_pipeline_file

    path = tmp_path / "joins.yaml"
    path.write_text(JOIN_FILE)
    from_file = load_pipeline_file(path, environ={}).plan
    p = hr.Pipeline("joins_in_a_file")
    bids, auctions = sources(p)
    bids.join(auctions, on={"auction": "id"}, how="left", within=("-10s", "10s"), name="with_seller").late_records(
        name="too_late")
    bids.join(auctions, on={"auction": "id"}, window=hr.Tumbling("20s"), name="in_windows")
    for name in ("with_seller", "in_windows", "too_late"):
        mine, theirs = from_file.nodes[name].to_json(), p.plan.nodes[name].to_json()
        assert {k: v for k, v in mine.items() if k != "defined_at"} == \
            {k: v for k, v in theirs.items() if k != "defined_at"}
    path.write_text(JOIN_FILE.replace("    within: [-10s, 10s]\n", ""))
    with pytest.raises(PlanError, match=r"joins.yaml:\d+.*step 'with_seller'.*needs a bound in event time"):
        load_pipeline_file(path, environ={})


# -- as a Storm JoinBolt ---------------------------------------------------------------------------------

def join_bolt_topology(bolt: hr.JoinBolt) -> tuple[hr.TopologyBuilder, TestSink]:
    """BIDS and AUCTIONS as two spouts whose timestamp field is ``ts`` on both (as Storm has it)."""
    builder = hr.TopologyBuilder("join_bolt")
    renamed = [[{"ts" if k in ("bt", "at") else k: v for k, v in r.items()} for r in batch] for batch in BIDS]
    builder.set_spout("bids", TestSource(renamed, schema="auction long, price long, ts long"))
    renamed = [[{"ts" if k in ("bt", "at") else k: v for k, v in r.items()} for r in batch] for batch in AUCTIONS]
    builder.set_spout("auctions", TestSource(renamed, schema="id long, seller string, ts long"))
    builder.set_bolt("joiner", bolt, 2).fields_grouping("bids", "auction").fields_grouping("auctions", "id")
    sink = TestSink()
    builder.stream("joiner").sink("joined", sink)
    return builder, sink


def test_a_storm_join_bolt_is_a_window_join(spark, tmp_path):
    builder, sink = join_bolt_topology(
        hr.JoinBolt("bids", "auction").join("auctions", "id", "bids")
        .select("bids:auction, bids:price, auctions:seller").with_timestamp_field("ts").with_tumbling_window("20s"))
    assert "inner join of 'joiner__bids_time' with stream 'joiner__auctions_time'" in builder.pipeline.explain()
    run_to_completion(builder.create_topology(), state_dir=str(tmp_path))
    expected = Counter({(auction, price, seller): n for (auction, price, _, _, seller, _), n
                        in model_join("inner", same_window, lag=0).items()})
    assert Counter((r["auction"], r["price"], r["seller"]) for r in sink.rows()) == expected


def bolt() -> hr.JoinBolt:
    return hr.JoinBolt("bids", "auction")


@pytest.mark.parametrize("build, message", [
    (lambda: bolt().select("bids:auction").with_tumbling_window("20s"), r"joins nothing: call join"),
    (lambda: bolt().join("auctions", "id", "bids").with_tumbling_window("20s"), r"selects no field"),
    (lambda: bolt().join("auctions", "id", "bids").select("bids:auction"), r"has no window: call with_tumbling_window"),
    (lambda: bolt().join("auctions", "id", "bids").select("bids:auction").with_tumbling_window("20s"),
     r"has no timestamp field: call with_timestamp_field"),
    (lambda: bolt().join("auctions", "id", "persons"), r"'auctions' joins 'persons', which is not the bolt's first"),
    (lambda: bolt().join("auctions", "id", "bids").join("auctions", "id", "bids"), r"joins two streams; join the"),
    (lambda: bolt().select("bids:ts, auctions:ts"), r"select gives two fields the name 'ts'"),
    (lambda: bolt().select("auction"), r"select names each field as component:field, got 'auction'"),
    (lambda: bolt().join("auctions", "id", "bids").select("persons:name").with_tumbling_window("20s"),
     r"select names 'persons', which the bolt does not join; it joins auctions, bids"),
])
@pytest.mark.fast
def test_a_join_bolt_is_refused_with_the_reason(build, message):
    with pytest.raises(PlanError, match=r"JoinBolt\('bids', 'auction'\) \(test_stream_joins.py:\d+\): " + message):
        join_bolt_topology(build())


@pytest.mark.fast
def test_a_join_bolt_reads_only_the_streams_it_joins():
    builder, _ = join_bolt_topology(
        bolt().join("auctions", "id", "bids").select("bids:auction").with_timestamp_field("ts")
        .with_tumbling_window("20s"))
    builder.set_spout("persons", TestSource([], schema="id long"))
    declarer = builder.set_bolt("again", bolt().join("auctions", "id", "bids").select("bids:auction")
                                .with_timestamp_field("ts").with_tumbling_window("20s"))
    with pytest.raises(PlanError, match=r"bolt 'again': shuffle_grouping\('persons', stream='default'\) "
                                        r"\(test_stream_joins.py:\d+\): a JoinBolt reads the default streams of the "
                                        r"components it joins: bids, auctions"):
        declarer.shuffle_grouping("persons")


# -- the restart check -------------------------------------------------------------------------------------

def join_of(how: str = "inner", within: Any = "10s", window: Any = None) -> hr.Pipeline:
    p = hr.Pipeline("join_change")
    bids, auctions = sources(p)
    bids.join(auctions, on={"auction": "id"}, how=how, within=within, window=window, name="paired").sink(
        "out", TestSink())
    return p


@pytest.mark.fast
def test_a_restart_takes_another_interval_and_refuses_another_kind_of_join():
    from headrace.runtime.compatibility import compare, plan_record

    base = plan_record(join_of().plan)
    wider = compare(base, plan_record(join_of(within="1m").plan))
    assert wider.allowed
    assert [str(c) for v in wider.steps if v.name == "paired" for c in v.changes] == [
        "within_ms [-10000, 10000] → [-60000, 60000]"]
    for other in (join_of(how="left"), join_of(within=None, window=hr.Tumbling("10s"))):
        verdict = compare(base, plan_record(other.plan))
        assert not verdict.allowed
        assert "stateful step 'paired' (join" in verdict.message()
    assert "changed join kind inner → left" in compare(base, plan_record(join_of(how="left").plan)).message()
