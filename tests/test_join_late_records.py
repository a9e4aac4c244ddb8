"""The late side output of a join of two streams (docs/joins.md, "Late records"): the records
Spark's join dropped, each once, against a model of Spark's rule written in plain Python."""

from __future__ import annotations

import datetime
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from input_files import write_in_order
from test_stream_joins import AUCTIONS, WITHIN, S
from test_stream_joins import BIDS as JOINS_BIDS

import headrace as hr
from headrace.errors import PlanError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink

BID = {"auction": "long", "price": "long", "bt": "timestamp"}
AUCTION = {"id": "long", "seller": "string", "at": "timestamp"}
# tests/test_stream_joins.py's records, micro-batch by micro-batch, both sides at once, with one
# bid more. The watermark (no out-of-orderness allowed) is the smaller of the sides' largest
# event times: 8 s after batch 0, 31 s after batch 1. In batch 2, the bids at 1 s and 20 s and
# the auction at 2 s are late for the watermark after batch 1, which a query with one stateful
# step judges by; the bid at 20 s is on time for the watermark after batch 0 (8 s), which a
# query of several stateful steps judges by.
BIDS = [*JOINS_BIDS[:2], [*JOINS_BIDS[2][:2], {"auction": 2, "price": 21, "bt": 20 * S}, *JOINS_BIDS[2][2:]]]


# -- the model -------------------------------------------------------------------------------------

def watermarks() -> list[int | None]:
    """The watermark after each batch: the smaller of the sides' largest event times so far."""
    marks, bids, auctions = [], [], []
    for bid_batch, auction_batch in zip(BIDS, AUCTIONS):
        bids += [r["bt"] for r in bid_batch]
        auctions += [r["at"] for r in auction_batch]
        marks.append(min(max(bids), max(auctions)))
    return marks


def late(side: str, lag: int, window: int | None = None) -> list[dict[str, Any]]:
    """A side's records at or before the watermark they are judged by (in a join of ``window``s,
    those whose window's end is): the one after the batch before (``lag`` 0), or after the one
    before that (``lag`` 1)."""
    batches, time = (BIDS, "bt") if side == "left" else (AUCTIONS, "at")
    marks, dropped = watermarks(), []
    for number, batch in enumerate(batches):
        judged = number - 1 - lag
        if judged >= 0:
            dropped += [r for r in batch
                        if (r[time] if window is None else r[time] // window * window + window) <= marks[judged]]
    return dropped


def model_late(step: str, lag: int) -> Counter[tuple[Any, ...]]:
    rows: Counter[tuple[Any, ...]] = Counter()
    for side, key, time in (("left", "auction", "bt"), ("right", "id", "at")):
        for record in late(side, lag):
            fields = tuple(sorted((k, v) for k, v in record.items() if k != time))
            rows[(step, side, str(record[key]), record[time], fields)] += 1
    return rows


def model_pairs(lag: int) -> Counter[tuple[Any, ...]]:
    dropped = [*late("left", lag), *late("right", lag)]
    bids = [b for batch in BIDS for b in batch if b not in dropped]
    auctions = [a for batch in AUCTIONS for a in batch if a not in dropped]
    return Counter((b["auction"], b["price"], b["bt"], a["seller"], a["at"]) for b in bids for a in auctions
                   if b["auction"] == a["id"] and WITHIN[0] <= a["at"] - b["bt"] <= WITHIN[1])


# -- headrace ----------------------------------------------------------------------------------------

def millis(value: datetime.datetime) -> int:
    return int(value.timestamp() * 1000)


def got_late(sink: TestSink, time_fields: tuple[str, ...] = ("bt", "at")) -> Counter[tuple[Any, ...]]:
    rows: Counter[tuple[Any, ...]] = Counter()
    for r in sink.rows():
        record = json.loads(r["record"])
        fields = tuple(sorted((k, v) for k, v in record.items() if k not in time_fields))
        rows[(r["step"], r["side"], r["key"], millis(r["event_time"]), fields)] += 1
    return rows


def got_pairs(sink: TestSink) -> Counter[tuple[Any, ...]]:
    return Counter((r["auction"], r["price"], millis(r["bt"]), r["seller"], millis(r["at"])) for r in sink.rows())


def write_inputs(folder: Path) -> None:
    """A file of bids and one of auctions per micro-batch (one of each is read in each), the
    bids with a line that is not JSON in the second file (a dead letter)."""
    for side, batches in (("bids", BIDS), ("auctions", AUCTIONS)):
        (folder / side).mkdir(parents=True, exist_ok=True)
        for number, batch in enumerate(batches):
            lines = [json.dumps(r) for r in batch] + (["{not json"] if side == "bids" and number == 1 else [])
            write_in_order(folder / side / f"{number}.jsonl", "\n".join(lines) + "\n", number)


def sources(p: hr.Pipeline, folder: Path, bounded: bool = True) -> tuple[hr.Stream, hr.Stream]:
    """Files read one by one: the micro-batches follow each other with no batch between them
    (a test source's watermark moves in a micro-batch without data of its own)."""
    if not (folder / "bids").exists():
        write_inputs(folder)
    bids = p.source("bids", hr.sources.Files(str(folder / "bids"), schema=BID, bounded=bounded,
                                             max_files_per_batch=1), event_time="bt")
    auctions = p.source("auctions", hr.sources.Files(str(folder / "auctions"), schema=AUCTION, bounded=bounded,
                                                     max_files_per_batch=1), event_time="at")
    return bids, auctions


@pytest.mark.fast
def test_the_model_tells_the_two_watermarks_apart():
    assert watermarks() == [8 * S, 31 * S, 50 * S]
    assert sorted(r["bt"] for r in late("left", 0)) == [1 * S, 20 * S]
    assert sorted(r["bt"] for r in late("left", 1)) == [1 * S]
    assert [r["at"] for r in late("right", 0)] == [r["at"] for r in late("right", 1)] == [2 * S]
    # in windows of 20 s: the bid at 1 s and the auction at 2 s ([0 s, 20 s)) are late for 31 s, not for 8 s
    assert sorted(r["bt"] for r in late("left", 0, 20 * S)) == [1 * S]
    assert [r["at"] for r in late("right", 0, 20 * S)] == [2 * S]
    assert late("left", 1, 20 * S) == late("right", 1, 20 * S) == []


def one_join(name: str, folder: Path) -> tuple[hr.Pipeline, TestSink, TestSink, TestSink]:
    p = hr.Pipeline(name)
    bids, auctions = sources(p, folder)
    joined = bids.join(auctions, on={"auction": "id"}, within=("-10s", "10s"), name="bids_auctions")
    pairs, dropped = TestSink(), TestSink()
    joined.select("auction", "price", "bt", "seller", "at").sink("pairs", pairs)
    joined.late_records().sink("late", dropped)
    p.dead_letters().sink("dead", dead := TestSink())
    return p, pairs, dropped, dead


def test_a_joins_late_records_are_the_records_spark_dropped_each_once(spark, tmp_path):
    """Beside the join's pairs and the dead letters of its sources."""
    p, pairs, dropped, dead = one_join("join_late", tmp_path / "in")
    assert "each side's records read again" in p.explain()
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait(until_exhausted=True)
    assert got_late(dropped) == model_late("bids_auctions", lag=0)
    assert sum(got_late(dropped).values()) == result.late_rows_dropped == 3  # what Spark's join counted
    assert got_pairs(pairs) == model_pairs(lag=0)
    assert [r["raw"] for r in dead.rows()] == ["{not json"]


def test_a_sigkill_of_the_driver_then_a_restart_gives_each_late_record_and_pair_once(tmp_path):
    from driver_process import KilledRun

    from headrace.connectors.files_sink import read_rows

    args = {"name": "join_late_killed", "input": str(tmp_path / "in"), "state_dir": str(tmp_path / "state"),
            "out": str(tmp_path / "late"), "pairs": str(tmp_path / "pairs")}
    write_inputs(tmp_path / "in")
    run = KilledRun(Path(__file__).resolve().parent / "join_late_driver.py", args, tmp_path / "driver.log")
    run.kill_after(2)
    assert run.committed() < len(BIDS), "the driver should have been killed mid-stream"
    expected = model_late("bids_auctions", lag=0)
    run.restart_until("every late record written", lambda: len(run.written()) >= sum(expected.values()))
    late_rows = Counter()
    for r in run.written():
        fields = tuple(sorted((k, v) for k, v in json.loads(r["record"]).items() if k not in ("bt", "at")))
        late_rows[(r["step"], r["side"], r["key"], millis(datetime.datetime.fromisoformat(r["event_time"])),
                   fields)] += 1
    assert late_rows == expected
    pairs = Counter((r["auction"], r["price"], millis(datetime.datetime.fromisoformat(r["bt"])), r["seller"],
                     millis(datetime.datetime.fromisoformat(r["at"]))) for r in read_rows(args["pairs"], "jsonl"))
    assert pairs == model_pairs(lag=0)


def test_two_joins_in_one_query_judge_by_the_watermark_before_as_spark_does(spark, tmp_path):
    """Two stateful steps: Spark judges each join's records by the watermark of the micro-batch
    before; the late records of both joins, the window join's (with several keys) by their window's
    end: none, those the interval join drops are in a window still open for that watermark."""
    p = hr.Pipeline("join_late_two")
    bids, auctions = sources(p, tmp_path / "in")
    interval = bids.join(auctions, on={"auction": "id"}, within=WITHIN, how="left", name="interval")
    windowed = bids.join(auctions.select("id", "seller", "at", price=hr.col("id")),
                         on={"auction": "id", "price": "price"}, window=hr.Tumbling("20s"), name="windowed")
    late_interval, late_windowed, pairs = TestSink(), TestSink(), TestSink()
    interval.late_records().sink("late_interval", late_interval)
    windowed.late_records().sink("late_windowed", late_windowed)
    windowed.sink("windowed_pairs", pairs)
    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait(until_exhausted=True)
    dropped = got_late(late_interval)
    assert sum(dropped.values()) + len(late_windowed.rows()) == result.late_rows_dropped
    assert dropped == model_late("interval", lag=1)
    keys = Counter((r["side"], json.loads(r["key"])["auction" if r["side"] == "left" else "id"])
                   for r in late_windowed.rows())
    assert keys == Counter([("left", r["auction"]) for r in late("left", 1, 20 * S)]
                           + [("right", r["id"]) for r in late("right", 1, 20 * S)])


@pytest.mark.fast
def test_the_late_records_of_a_join_whose_results_a_stateful_step_reads_are_refused(tmp_path):
    p = hr.Pipeline("join_late_refused")
    bids, auctions = sources(p, tmp_path)
    joined = bids.join(auctions, on={"auction": "id"}, within="5s", name="j")
    joined.late_records(name="j_late").sink("late", TestSink())
    joined.key_by("seller").window(hr.Tumbling("1m"), name="per_seller").count().sink("counts", TestSink())
    with pytest.raises(PlanError) as caught:
        p.validate()
    assert re.fullmatch(
        r"step 'j_late' \(test_join_late_records.py:\d+\): the late records of join 'j' \(test_join_late_records.py:"
        r"\d+\) cannot be taken while the stateful step 'per_seller' \(test_join_late_records.py:\d+\) reads the "
        r"join's results in the same pipeline: Spark would run the join twice; sink the join's results and go on "
        r"from that sink in another pipeline, or take no late records", str(caught.value)), str(caught.value)
