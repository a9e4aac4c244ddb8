"""Joins of two streams in the local runner (``run_locally``, no JVM), against expected outputs
written independently: the plain-Python models of tests/test_stream_joins.py and
tests/test_join_late_records.py (whose Spark-tier tests check them against Spark), and outputs
worked out by hand below. The last test runs join pipelines through both the local runner and
Spark and compares them micro-batch by micro-batch."""

from __future__ import annotations

import datetime
import json
from collections import Counter
from typing import Any

import pytest
import test_join_late_records as late_model
import test_stream_joins as joins_model
import test_window_joins as window_joins

import headrace as hr
from headrace.testing import TestSink, TestSource, Watermark, run_locally, run_to_completion
from headrace.testing.local import LocalRun

S = 1_000
MINUTE, HOUR = 60 * S, 3600 * S


def millis(value: datetime.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def bids_and_auctions(p: hr.Pipeline, bids: Any = joins_model.BIDS, bid_schema: Any = joins_model.BID,
                      auction_schema: Any = joins_model.AUCTION) -> tuple[hr.Stream, hr.Stream]:
    return (p.source("bids", TestSource(bids, schema=bid_schema), event_time="bt"),
            p.source("auctions", TestSource(joins_model.AUCTIONS, schema=auction_schema), event_time="at"))


def pairs(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    return Counter((r["auction"], r["price"], millis(r["bt"]), r["id"], r["seller"], millis(r["at"])) for r in rows)


# -- interval joins and a window join: tests/test_stream_joins.py's model ------------------------------

@pytest.mark.fast
def test_every_kind_of_interval_join_and_a_window_join_give_the_model_s_rows():
    """The data keeps clear of the late boundary (test_stream_joins.py checks it), so the model's
    rows are the same whichever micro-batch's watermark judges them."""
    p = hr.Pipeline("local_joins_all_kinds")
    bids, auctions = bids_and_auctions(p)
    for how in ("inner", "left", "right", "full"):
        bids.join(auctions, on={"auction": "id"}, how=how, within=("-10s", "10s"), name=f"{how}_join").sink(
            how, TestSink())
    bids.join(auctions, on={"auction": "id"}, window=hr.Tumbling("20s"), name="window_join").sink(
        "windowed", TestSink())
    run = LocalRun(p).run()
    out = run.sink_rows()
    for how in ("inner", "left", "right", "full"):
        assert pairs(out[how]) == joins_model.model_join(how, joins_model.within, lag=0), how
    assert pairs(out["windowed"]) == joins_model.model_join("inner", joins_model.same_window, lag=0)
    window = 20 * S
    assert {(r["auction"], millis(r["window_start"]), millis(r["window_end"])) for r in out["windowed"]} == {
        (row[0], row[2] // window * window, row[2] // window * window + window)
        for row in joins_model.model_join("inner", joins_model.same_window, lag=0)}
    # the late bid and the late auction, dropped and counted by each of the five joins
    assert run.late_rows_dropped == 5 * 2
    assert {step for batch in run.batches for step in batch.late_dropped} == {
        "inner_join", "left_join", "right_join", "full_join", "window_join"}


@pytest.mark.fast
def test_a_join_chained_into_a_window_gives_the_model_s_totals_per_seller():
    p = hr.Pipeline("local_join_then_window")
    bids, auctions = bids_and_auctions(p)
    (bids.join(auctions, on={"auction": "id"}, within=joins_model.WITHIN, name="bids_auctions")
     .key_by("seller").window(hr.Tumbling("1m"), name="per_seller")
     .aggregate(bids=hr.count(), total=hr.sum("price")).sink("out", sink := TestSink()))
    run_locally(p)
    assert joins_model.per_seller_rows(sink) == joins_model.model_per_seller()


# -- late records: tests/test_join_late_records.py's model -----------------------------------------------

def late_rows(rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    got: Counter[tuple[Any, ...]] = Counter()
    for r in rows:
        record = json.loads(r["record"])
        fields = tuple(sorted((k, v) for k, v in record.items() if k not in ("bt", "at")))
        got[(r["step"], r["side"], r["key"], millis(r["event_time"]), fields)] += 1
    return got


@pytest.mark.fast
def test_a_join_s_late_records_are_the_records_it_dropped_each_once():
    p = hr.Pipeline("local_join_late")
    bids, auctions = bids_and_auctions(p, late_model.BIDS, late_model.BID, late_model.AUCTION)
    joined = bids.join(auctions, on={"auction": "id"}, within=("-10s", "10s"), name="bids_auctions")
    joined.select("auction", "price", "bt", "seller", "at").sink("pairs", TestSink())
    joined.late_records().sink("late", TestSink())
    run = LocalRun(p).run()
    out = run.sink_rows()
    assert late_rows(out["late"]) == late_model.model_late("bids_auctions", lag=0)
    assert run.late_rows_dropped == 3
    assert Counter((r["auction"], r["price"], millis(r["bt"]), r["seller"], millis(r["at"])) for r in out["pairs"]) \
        == late_model.model_pairs(lag=0)
    # as Spark's to_json writes a record: its fields in order, a timestamp in ISO 8601 with milliseconds
    assert sorted(r["record"] for r in out["late"])[0] == '{"auction":1,"price":12,"bt":"1970-01-01T00:00:01.000Z"}'


@pytest.mark.fast
def test_two_joins_judge_by_the_watermark_before_each_micro_batch():
    """Spark judges the records of a query of several stateful steps by the watermark of the
    micro-batch before; a TestSource runs a micro-batch without data after each that moved the
    watermark, so that is the watermark after the data before (the model's ``lag=0``): the bid at
    20 s is late. Several keys come as a JSON object."""
    p = hr.Pipeline("local_join_late_two")
    bids, auctions = bids_and_auctions(p, late_model.BIDS, late_model.BID, late_model.AUCTION)
    interval = bids.join(auctions, on={"auction": "id"}, within=joins_model.WITHIN, how="left", name="interval")
    windowed = bids.join(auctions.select("id", "seller", "at", price=hr.col("id")),
                         on={"auction": "id", "price": "price"}, window=hr.Tumbling("20s"), name="windowed")
    interval.late_records().sink("late_interval", TestSink())
    windowed.late_records().sink("late_windowed", TestSink())
    out = run_locally(p)
    assert late_rows(out["late_interval"]) == late_model.model_late("interval", lag=0)
    # the window join judges by the window's end: the bid at 20 s is in [20 s, 40 s), open at 31 s
    assert sorted((r["side"], json.loads(r["key"]), millis(r["event_time"])) for r in out["late_windowed"]) == [
        ("left", {"auction": 1, "price": 12}, 1 * S), ("right", {"id": 1, "price": 1}, 2 * S)]


# -- window joins, worked out by hand ------------------------------------------------------------------

# tests/test_window_joins.py's micro-batches (left delay 1 s, right none; windows of 10 s). The
# watermark is 7 s after step 0, 17 s after step 1, 29 s after step 2, 35 s after step 3, then the
# end of the input. Micro-batch ids: step n is batch 2n; each moved the watermark, so batch 2n + 1
# runs without data and lets go of the windows it passed; the flush is batch 8, its own batch 9.
LEFT, RIGHT = window_joins.LEFT, window_joins.RIGHT
# (k, lv, lt, rv, rt, window start, window end) by batch: a pair in the batch of its later record
# (the left b at 5 s arrives at 7 s, its window [0, 10) still open); the left a at 6 s and the right
# a at 3 s are late (their window ended at 10 s, the watermark is 17 s)
INNER = {0: [("e", 7, 2 * S, 15, 4 * S, 0, 10 * S)],
         2: [("b", 2, 5 * S, 10, 9 * S, 0, 10 * S)],
         4: [("d", 4, 15 * S, 11, 19 * S, 10 * S, 20 * S), ("z", 5, 30 * S, 13, 35 * S, 30 * S, 40 * S),
             ("c", 3, 18 * S, 17, 11 * S, 10 * S, 20 * S)],
         6: [("z", 9, 38 * S, 13, 35 * S, 30 * S, 40 * S)]}
# an unmatched record once the watermark reaches its window's end: [0, 10) at 17 s (batch 3),
# [10, 20) at 29 s (batch 5), [20, 30) at 35 s (batch 7), [30, 40) at the end (batch 9)
LEFT_ONLY = {3: [("a", 1, 8 * S, None, None, 0, 10 * S)], 9: [("y", 6, 31 * S, None, None, 30 * S, 40 * S)]}
RIGHT_ONLY = {5: [("b", None, None, 16, 12 * S, 10 * S, 20 * S)], 7: [("z", None, None, 18, 25 * S, 20 * S, 30 * S)],
              9: [("x", None, None, 14, 33 * S, 30 * S, 40 * S)]}


def expected_window_join(how: str) -> dict[int, Counter[tuple[Any, ...]]]:
    parts = [INNER] + ([LEFT_ONLY] if how in ("left", "full") else []) + ([RIGHT_ONLY] if how in ("right", "full")
                                                                         else [])
    batches: dict[int, Counter[tuple[Any, ...]]] = {}
    for part in parts:
        for batch, rows in part.items():
            batches[batch] = batches.get(batch, Counter()) + Counter(rows)
    return batches


def window_sides(p: hr.Pipeline) -> tuple[hr.Stream, hr.Stream]:
    left = p.source("l", TestSource(LEFT, schema={"k": "string", "lv": "long", "lt": "long"}), event_time="lt",
                    max_out_of_orderness=1 * S)
    right = p.source("r", TestSource(RIGHT, schema={"k": "string", "rv": "long", "rt": "long"}), event_time="rt")
    return left, right


def window_rows_by_batch(sink: TestSink) -> dict[int, Counter[tuple[Any, ...]]]:
    return {batch: Counter((r["k"], r["lv"], millis(r["lt"]), r["rv"], millis(r["rt"]), millis(r["window_start"]),
                            millis(r["window_end"])) for r in rows) for batch, rows in sink.batches.items() if rows}


@pytest.mark.fast
@pytest.mark.parametrize("how", ["inner", "left", "right", "full"])
def test_a_window_join_judges_and_lets_go_of_records_by_their_window_s_end(how):
    p = hr.Pipeline(f"local_window_join_{how}")
    left, right = window_sides(p)
    joined = left.join(right, on="k", how=how, window=hr.Tumbling("10s"), name="joined")
    joined.sink("out", sink := TestSink())
    joined.late_records().sink("late", TestSink())
    run = LocalRun(p).run()
    assert window_rows_by_batch(sink) == expected_window_join(how)
    assert sorted((r["side"], r["key"], millis(r["event_time"])) for r in run.sink_rows()["late"]) == [
        ("left", "a", 6 * S), ("right", "a", 3 * S)]
    assert [b.late_dropped for b in run.batches if b.late_dropped] == [{"joined": 2}]


# -- the watermark after a join ------------------------------------------------------------------------

def joined_then_counted(within: Any = ("-1h", "0s"), window: Any = None) -> tuple[hr.Pipeline, TestSink]:
    """tests/test_window_joins.py's pipeline: the minute [0, 1m) of a bid at 20 s, with markers that
    set the watermark 1 ms before, then at, the end of that minute held back by the interval join."""
    end = MINUTE + HOUR + 1
    bids = TestSource([[{"auction": 1, "price": 5, "at": 20 * S}], Watermark(end - 1), Watermark(end)],
                      schema={"auction": "long", "price": "long", "at": "long"}, flush=False)
    auctions = TestSource([[{"id": 1, "seller": "ann", "opened": 10 * S}], Watermark(end - 1), Watermark(end)],
                          schema={"id": "long", "seller": "string", "opened": "long"}, flush=False)
    p = hr.Pipeline("local_delay_after_join")
    left = p.source("bids", bids, event_time="at", max_out_of_orderness="2s")
    right = p.source("auctions", auctions, event_time="opened")
    joined = left.join(right, on={"auction": "id"}, within=None if window else within, window=window,
                       name="with_seller")
    joined.key_by("seller").window(hr.Tumbling("1m"), name="per_minute").aggregate(n=hr.count()).sink(
        "out", sink := TestSink())
    return p, sink


@pytest.mark.fast
def test_a_window_after_an_interval_join_sees_the_watermark_the_join_holds_back():
    """Spark's watermark after the join trails by the interval's wider bound + 1 ms (1 h 1 ms, as
    explain says): the minute comes out with the marker at its end + 1 h 1 ms, not 1 ms before."""
    p, sink = joined_then_counted()
    steps: list[int] = []
    LocalRun(p).run(on_step=lambda run: steps.append(len(run.batches) - 1))
    out = {batch: [(r["seller"], millis(r["window_start"]), r["n"]) for r in rows]
           for batch, rows in sink.batches.items() if rows}
    assert list(out.values()) == [[("ann", 0, 1)]]
    (batch,) = out
    assert steps[1] < batch <= steps[2], (steps, out)


@pytest.mark.fast
def test_an_unmatched_record_let_go_by_a_left_join_counts_in_the_window_after_it():
    """within=(-5s, 10s) holds the watermark after the join back by 10 s 1 ms. The bid at 5 s for
    auction 7 matches nothing; when the watermark reaches 40 s the join lets it go (5 s <= 40 s -
    10 s - 1 ms) with the window's watermark at 29.999 s, past its window [0, 10s): the window judges
    it by the watermark of the micro-batch before, as Spark does, so it counts, and fires at once."""
    p = hr.Pipeline("local_left_join_then_window")
    bids = p.source("bids", TestSource([[{"auction": 7, "price": 1, "bt": 5 * S}],
                                        [{"auction": 1, "price": 2, "bt": 40 * S}]], schema=joins_model.BID),
                    event_time="bt")
    auctions = p.source("auctions", TestSource([[{"id": 1, "seller": "ann", "at": 30 * S}],
                                                [{"id": 1, "seller": "ann", "at": 41 * S}]],
                                               schema=joins_model.AUCTION), event_time="at")
    (bids.join(auctions, on={"auction": "id"}, how="left", within=("-5s", "10s"), name="bids_auctions")
     .key_by("auction").window(hr.Tumbling("10s"), name="per_auction").count().sink("out", sink := TestSink()))
    run = LocalRun(p).run()
    assert {batch: [(r["auction"], millis(r["window_start"]), r["count"]) for r in rows]
            for batch, rows in sink.batches.items() if rows} == {3: [(7, 0, 1)], 5: [(1, 40 * S, 1)]}
    assert run.late_rows_dropped == 0


@pytest.mark.fast
def test_a_window_after_a_window_join_sees_the_join_s_own_watermark():
    p, sink = joined_then_counted(window=hr.Tumbling("10s"))
    steps: list[int] = []
    LocalRun(p).run(on_step=lambda run: steps.append(len(run.batches) - 1))
    # the bid at 20 s and the auction opened at 10 s are in different windows: nothing pairs, and the
    # first marker, far past the minute's end, closes no window of a pair
    assert sink.batches == {} or all(not rows for rows in sink.batches.values())
    p, sink = joined_then_counted(window=hr.Tumbling("1m"))
    steps.clear()
    LocalRun(p).run(on_step=lambda run: steps.append(len(run.batches) - 1))
    out = {batch: rows for batch, rows in sink.batches.items() if rows}
    assert [(r["seller"], r["n"]) for rows in out.values() for r in rows] == [("ann", 1)]
    (batch,) = out
    assert steps[0] < batch <= steps[1], (steps, out)  # the first marker is past [0, 1m)'s end: no hold


# -- against Spark ------------------------------------------------------------------------------------

def join_pipelines() -> list[hr.Pipeline]:
    """A few join pipelines, built afresh for each run."""
    every_kind = hr.Pipeline("local_vs_spark_joins")
    bids, auctions = bids_and_auctions(every_kind, late_model.BIDS, late_model.BID, late_model.AUCTION)
    for how in ("inner", "full"):  # a full join lets out both sides' unmatched records
        joined = bids.join(auctions, on={"auction": "id"}, how=how, within=("-10s", "10s"), name=f"{how}_join")
        joined.sink(how, TestSink())
        joined.late_records().sink(f"{how}_late", TestSink())
    skewed = bids.join(auctions, on={"auction": "id"}, how="full", within=("-20s", "-2s"), name="skewed")
    skewed.sink("skewed_out", TestSink())
    skewed.late_records().sink("skewed_dropped", TestSink())
    windows = hr.Pipeline("local_vs_spark_window_joins")
    left, right = window_sides(windows)
    joined = left.join(right, on="k", how="full", window=hr.Tumbling("10s"), name="full_window")
    joined.sink("full", TestSink())
    joined.late_records().sink("full_late", TestSink())
    chained = hr.Pipeline("local_vs_spark_join_then_window")
    bids, auctions = bids_and_auctions(chained)
    (bids.join(auctions, on={"auction": "id"}, how="left", within=("-5s", "10s"), name="bids_auctions")
     .key_by("auction").window(hr.Tumbling("10s"), name="per_auction").aggregate(n=hr.count(), top=hr.max("price"))
     .sink("per_auction_out", TestSink()))
    return [every_kind, windows, chained, joined_then_counted()[0]]


def plain(batches: dict[int, list[dict[str, Any]]]) -> dict[int, Counter[tuple[Any, ...]]]:
    def value(v: Any) -> Any:
        return millis(v) if isinstance(v, datetime.datetime) else v
    return {batch: Counter(tuple(sorted((k, value(v)) for k, v in row.items())) for row in rows)
            for batch, rows in batches.items() if rows}


def test_join_pipelines_give_spark_s_micro_batches(spark, tmp_path_factory):
    for number in range(len(join_pipelines())):
        local = join_pipelines()[number]
        run_locally(local)
        on_spark = join_pipelines()[number]
        run_to_completion(on_spark, state_dir=str(tmp_path_factory.mktemp("state")))
        for mine, theirs in zip(local.plan.sinks(), on_spark.plan.sinks()):
            assert plain(mine.connector.batches) == plain(theirs.connector.batches), (local.name, mine.name)
