"""Window joins of two streams (docs/joins.md, docs/sql.md), fluent and in SQL, against Spark's own
window join: each side's ``window(time)`` column after ``withWatermark``, joined on it, written here
in plain PySpark over the same micro-batches, read by a Python data source of this file. Batch by
batch, the pairs, the unmatched records of outer joins and the records dropped as late must be
Spark's. Then what a window join refuses in SQL, and the watermark delay ``explain`` shows for a
window after an interval join, checked against the batch its window comes out in."""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

import headrace as hr
from headrace.errors import PlanError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, Watermark

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the data source below reaches Spark's workers
S = 1_000
FAR = 10**12  # the end of the input: a marker this late moves the watermark past every window
LEFT_SCHEMA = {"k": "string", "lv": "long", "lt": "long"}
RIGHT_SCHEMA = {"k": "string", "rv": "long", "rt": "long"}
LEFT_DELAY, RIGHT_DELAY = 1 * S, 0
# Micro-batch by micro-batch, both sides at once, in windows of 10 s. The watermark is the smaller of
# the left's largest event time - 1 s and the right's largest: 7 s after batch 0, 17 s after batch 1,
# 29 s after batch 2, 35 s after batch 3.
# * batch 1: the left b at 5 s arrives with the watermark at 7 s; its window [0 s, 10 s) is open, and
#   the right b at 9 s waits in it: a pair. The left c at 18 s waits for the right c at 11 s (batch 2).
# * batch 2: the left d at 15 s (watermark 17 s; window [10 s, 20 s)) pairs with the right d at 19 s;
#   the left a at 6 s and the right a at 3 s are late (their window ended at 10 s).
# * batch 3: a second left z in [30 s, 40 s); the right z at 25 s is on time ([20 s, 30 s) ends after 29 s).
LEFT = [[{"k": "a", "lv": 1, "lt": 8 * S}, {"k": "e", "lv": 7, "lt": 2 * S}],
        [{"k": "b", "lv": 2, "lt": 5 * S}, {"k": "c", "lv": 3, "lt": 18 * S}],
        [{"k": "d", "lv": 4, "lt": 15 * S}, {"k": "z", "lv": 5, "lt": 30 * S}, {"k": "a", "lv": 8, "lt": 6 * S}],
        [{"k": "y", "lv": 6, "lt": 31 * S}, {"k": "z", "lv": 9, "lt": 38 * S}]]
RIGHT = [[{"k": "b", "rv": 10, "rt": 9 * S}, {"k": "e", "rv": 15, "rt": 4 * S}],
         [{"k": "d", "rv": 11, "rt": 19 * S}, {"k": "b", "rv": 16, "rt": 12 * S}],
         [{"k": "a", "rv": 12, "rt": 3 * S}, {"k": "z", "rv": 13, "rt": 35 * S}, {"k": "c", "rv": 17, "rt": 11 * S}],
         [{"k": "x", "rv": 14, "rt": 33 * S}, {"k": "z", "rv": 18, "rt": 25 * S}]]
KINDS = ("inner", "left", "right", "full")
Row = tuple[Any, ...]  # k, lv, lt, rv, rt, window start, window end (times in ms)


# -- Spark's own window join, in plain PySpark --------------------------------------------------------

class Steps(DataSource):
    """A stream of explicit micro-batches: offset n is step n of ``steps`` (JSON rows), read once
    the file ``released`` says n steps are offered."""

    @classmethod
    def name(cls) -> str:
        return "window_join_steps"

    def schema(self) -> str:
        return self.options["schema"]

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return StepsReader(dict(self.options))


class StepsReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def initialOffset(self) -> dict[str, int]:
        return {"step": 0}

    def latestOffset(self) -> dict[str, int]:  # type: ignore[override]
        with open(self.options["released"]) as handle:
            return {"step": int(handle.read() or 0)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition(step) for step in range(start["step"], end["step"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from (tuple(row) for row in json.loads(self.options["steps"])[partition.value])


def spark_side(spark: Any, batches: list[list[dict[str, Any]]], value: str, time: str, delay_ms: int,
               released: str) -> DataFrame:
    """One side as Spark's docs join windows: the watermark on its event time, the window of that
    time as a column (which carries the watermark), the time itself a plain column. The end of the
    input is a marker row far in the future, dropped after the watermark has seen it (above a
    filter Catalyst cannot push below the watermark)."""
    steps = [[[r["k"], r[value], r[time], False] for r in batch] for batch in batches] + [[["", 0, FAR, True]]]
    df = (spark.readStream.format(Steps.name()).option("schema", f"k string, {value} long, {time} long, end boolean")
          .option("steps", json.dumps(steps)).option("released", released).load())
    df = df.withColumn(time, F.timestamp_millis(time)).withWatermark(time, f"{delay_ms} milliseconds")
    df = df.filter(F.spark_partition_id() >= 0).filter(~F.col("end"))
    df = df.withColumn("window", F.window(time, "10 seconds"))
    return df.select("k", "window", value, F.col(time).alias(time, metadata={}))


def ms(column: str) -> Any:
    return F.unix_millis(F.col(column))


def spark_join(spark: Any, how: str, folder: Any) -> tuple[dict[int, list[Row]], dict[int, int]]:
    """Spark's window join of kind ``how``, run micro-batch by micro-batch (a step of both sides
    offered at a time): the rows of each batch, and the rows it dropped as late."""
    released = str(folder / "released")
    with open(released, "w") as handle:
        handle.write("0")
    left = spark_side(spark, LEFT, "lv", "lt", LEFT_DELAY, released)
    right = spark_side(spark, RIGHT, "rv", "rt", RIGHT_DELAY, released)
    joined = left.join(right, on=["k", "window"], how=how).select(
        "k", "lv", ms("lt"), "rv", ms("rt"), ms("window.start"), ms("window.end"))
    rows: dict[int, list[Row]] = {}
    query = joined.writeStream.foreachBatch(lambda df, batch: rows.__setitem__(batch, [tuple(r) for r in df.collect()])
                                            ).option("checkpointLocation", str(folder / "checkpoint")).start()
    try:
        for step in range(1, len(LEFT) + 2):
            with open(released, "w") as handle:
                handle.write(str(step))
            query.processAllAvailable()
        return rows, dropped(query.recentProgress)
    finally:
        query.stop()


@pytest.fixture(scope="module")
def spark_joins(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[int, list[Row]],
                                                                                         dict[int, int]]]:
    """Each kind of Spark's window join (``spark_join``), by kind."""
    spark.dataSource.register(Steps)
    spark.conf.set("spark.sql.streaming.statefulOperator.allowMultiple", "false")  # as headrace runs one join
    return {how: spark_join(spark, how, tmp_path_factory.mktemp(f"spark_window_join_{how}")) for how in KINDS}


def dropped(progress: list[dict[str, Any]]) -> dict[int, int]:
    """The rows each batch's stateful operators dropped as late, by batch id."""
    return {p["batchId"]: sum(op.get("numRowsDroppedByWatermark", 0) for op in p["stateOperators"])
            for p in progress}


def test_spark_joins_the_late_left_record_in_its_open_window_and_drops_two(spark_joins):
    rows, drops = spark_joins["inner"]
    assert ("b", 2, 5 * S, 10, 9 * S, 0, 10 * S) in [row for batch in rows.values() for row in batch]
    assert ("d", 4, 15 * S, 11, 19 * S, 10 * S, 20 * S) in [row for batch in rows.values() for row in batch]
    assert sum(drops.values()) == 2


# -- headrace -----------------------------------------------------------------------------------------

def millis(value: datetime.datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def by_batch(sink: TestSink) -> dict[int, Counter[Row]]:
    return {batch: Counter((r["k"], r["lv"], millis(r["lt"]), r["rv"], millis(r["rt"]), millis(r["window_start"]),
                            millis(r["window_end"])) for r in rows) for batch, rows in sink.batches.items()}


def sides(p: hr.Pipeline) -> tuple[hr.Stream, hr.Stream]:
    left = p.source("l", TestSource(LEFT, schema=LEFT_SCHEMA), event_time="lt", max_out_of_orderness=LEFT_DELAY)
    right = p.source("r", TestSource(RIGHT, schema=RIGHT_SCHEMA), event_time="rt", max_out_of_orderness=RIGHT_DELAY)
    return left, right


SQL_WINDOW_JOIN = """SELECT coalesce(a.k, b.k) AS k, a.lv, a.lt, b.rv, b.rt,
                            coalesce(window(a.lt, '10 seconds'), window(b.rt, '10 seconds')) AS window
                       FROM l a {how} JOIN r b
                         ON a.k = b.k AND window(a.lt, '10 seconds') = window(b.rt, '10 seconds')"""


def run_join(how: str, in_sql: bool, tmp_path: Any) -> tuple[TestSink, PipelineRun]:
    p = hr.Pipeline(f"window_join_{how}_{'sql' if in_sql else 'fluent'}")
    left, right = sides(p)
    joined = (p.sql(SQL_WINDOW_JOIN.format(how="FULL OUTER" if how == "full" else how.upper()), name="joined")
              if in_sql else left.join(right, on="k", how=how, window=hr.Tumbling("10s"), name="joined"))
    sink = TestSink()
    joined.sink("out", sink)
    run = PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start()
    run.wait(until_exhausted=True)
    return sink, run


@pytest.mark.parametrize("in_sql", [False, True], ids=["fluent", "sql"])
@pytest.mark.parametrize("how", KINDS)
def test_a_window_join_gives_spark_s_window_join_batch_by_batch(how, in_sql, spark, spark_joins, tmp_path):
    expected_rows, expected_drops = spark_joins[how]
    sink, run = run_join(how, in_sql, tmp_path)
    got = by_batch(sink)
    assert {b: rows for b, rows in got.items() if rows} == {
        b: Counter(rows) for b, rows in expected_rows.items() if rows}
    assert {b: n for b, n in dropped(run.progress_log).items() if n} == {b: n for b, n in expected_drops.items() if n}


# -- late records of a window join -------------------------------------------------------------------

def model_late() -> list[tuple[str, str, int]]:
    """(side, key, event time) of each record whose window ended at or before the watermark of
    its micro-batch: the smaller of the sides' largest event times (less their delays) before it."""
    late, seen_left, seen_right = [], [], []
    for left_batch, right_batch in zip(LEFT, RIGHT):
        mark = min(max(seen_left) - LEFT_DELAY, max(seen_right) - RIGHT_DELAY) if seen_left else None
        for side, batch, time in (("left", left_batch, "lt"), ("right", right_batch, "rt")):
            late += [(side, r["k"], r[time]) for r in batch if mark is not None and r[time] // 10_000 * 10_000
                     + 10_000 <= mark]
        seen_left += [r["lt"] for r in left_batch]
        seen_right += [r["rt"] for r in right_batch]
    return late


def test_a_window_join_s_late_records_are_those_whose_window_had_ended(spark, spark_joins, tmp_path):
    p = hr.Pipeline("window_join_late")
    left, right = sides(p)
    joined = left.join(right, on="k", how="left", window=hr.Tumbling("10s"), name="joined")
    pairs, late = TestSink(), TestSink()
    joined.sink("pairs", pairs)
    joined.late_records().sink("late", late)
    result = PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start().wait(until_exhausted=True)
    assert sorted((r["side"], r["key"], millis(r["event_time"])) for r in late.rows()) == sorted(model_late())
    assert result.late_rows_dropped == len(model_late()) == sum(spark_joins["left"][1].values())
    expected = Counter(row for rows in spark_joins["left"][0].values() for row in rows)
    assert sum(by_batch(pairs).values(), Counter()) == expected


# -- SQL: what a window join refuses as the step is added ----------------------------------------------

def sql_refusal(query: str) -> str:
    p = hr.Pipeline("window_join_refused")
    sides(p)
    with pytest.raises(PlanError) as caught:
        p.sql(query, name="joined")
    return str(caught.value)


ON = "SELECT a.k, b.rv FROM l a JOIN r b ON a.k = b.k AND "


@pytest.mark.fast
def test_sql_takes_equal_windows_of_both_event_times_as_the_join_s_bound():
    p = hr.Pipeline("window_join_accepted")
    sides(p)
    for query in (ON + "window(a.lt, '10 seconds') = window(b.rt, '10 seconds')",
                  ON + "window(b.rt, INTERVAL 10 SECONDS) = window(a.lt, '10 seconds', '10 seconds')",
                  "SELECT * FROM l a, r b WHERE a.k = b.k AND window(a.lt, '1 minute') = window(b.rt, '60 seconds')",
                  SQL_WINDOW_JOIN.format(how="FULL OUTER")):
        assert p.sql(query).node.shape == "join of streams", query


@pytest.mark.fast
@pytest.mark.parametrize("condition, message", [
    ("window(a.lt, '10 seconds', '5 seconds') = window(b.rt, '10 seconds', '5 seconds')",
     r"window\(a.lt, '10 seconds', '5 seconds'\) is a sliding window: a window join takes tumbling windows"),
    ("window(a.lt, '10 seconds') = window(b.rt, '20 seconds')",
     r"window\(a.lt, '10 seconds'\) and window\(b.rt, '20 seconds'\) are not the same window"),
    ("window(a.lt, '10 seconds') = window(b.rt, '10 seconds', '10 seconds', '2 seconds')",
     r"window\(a.lt, '10 seconds'\) and window\(b.rt, '10 seconds', '10 seconds', '2 seconds'\) are not the same "
     r"window: a window join puts both sides' records in one window; give both the same duration and start"),
    ("window(a.lt, 'ten seconds') = window(b.rt, 'ten seconds')",
     r"cannot read the window's duration in window\(a.lt, 'ten seconds'\); write it as window\(t, '10 seconds'\)"),
])
def test_sql_refuses_windows_that_are_not_one_tumbling_window(condition, message):
    text = sql_refusal(ON + condition)
    assert re.search(r"step 'joined' \(test_window_joins.py:\d+\): " + message, text), text
    assert "at line 1, column" in text


@pytest.mark.fast
def test_sql_refuses_an_aggregate_after_a_window_join_and_an_interval_beside_it():
    text = sql_refusal("SELECT b.rv, count(*) AS n FROM l a JOIN r b ON a.k = b.k AND window(a.lt, '10 seconds') = "
                       "window(b.rt, '10 seconds') GROUP BY b.rv, window(b.rt, '1 minute')")
    assert "an aggregate cannot follow a window join in one query: Spark judges the joined streams by their " \
           "windows" in text, text
    p = hr.Pipeline("window_join_and_interval")
    sides(p)
    p.source("m", TestSource([], schema={"k": "string", "mt": "long"}), event_time="mt")
    with pytest.raises(PlanError, match=r"the query joins streams by window, and stream 'c' otherwise: a window join "
                                        r"judges its streams by their windows"):
        p.sql("SELECT a.k FROM l a JOIN r b ON a.k = b.k AND window(a.lt, '10 seconds') = window(b.rt, '10 seconds') "
              "JOIN m c ON c.k = a.k AND c.mt BETWEEN a.lt - INTERVAL 5 SECONDS AND a.lt", name="three")


@pytest.mark.fast
def test_an_unbounded_sql_join_is_told_both_bounds_it_can_have():
    text = sql_refusal("SELECT a.k FROM l a JOIN r b ON a.k = b.k")
    assert ("AND b.rt BETWEEN a.lt - INTERVAL 10 SECONDS AND a.lt + INTERVAL 10 SECONDS (an interval join), or AND "
            "window(b.rt, '10 seconds') = window(a.lt, '10 seconds') (a window join)") in text, text


# -- the watermark delay after a join ------------------------------------------------------------------

BID = {"auction": "long", "price": "long", "at": "long"}
AUCTION = {"id": "long", "seller": "string", "opened": "long"}
MINUTE, HOUR = 60 * S, 3600 * S


def joined_then_counted(bids: TestSource, auctions: TestSource, within: Any = ("-1h", "0s"),
                        window: Any = None) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline("delay_after_join")
    left = p.source("bids", bids, event_time="at", max_out_of_orderness="2s")
    right = p.source("auctions", auctions, event_time="opened")
    joined = left.join(right, on={"auction": "id"}, within=None if window else within, window=window,
                       name="with_seller")
    sink = TestSink()
    joined.key_by("seller").window(hr.Tumbling("1m"), name="per_minute").aggregate(n=hr.count()).sink("out", sink)
    return p, sink


def delay_line(p: hr.Pipeline, step: str) -> str:
    lines = p.explain().splitlines()
    at = next(n for n, line in enumerate(lines) if line.strip().startswith(f"{step} "))
    return next(line.strip() for line in lines[at + 1:] if line.strip().startswith("watermark delay:"))


@pytest.mark.fast
def test_explain_shows_each_stateful_step_s_watermark_delay():
    p, _ = joined_then_counted(TestSource([], schema=BID), TestSource([], schema=AUCTION))
    assert delay_line(p, "with_seller") == ("watermark delay: 2s behind the largest event time seen: max "
                                            "out-of-orderness 2s")
    assert delay_line(p, "per_minute") == (
        "watermark delay: 1h 2s 1ms behind the largest event time seen: max out-of-orderness 2s, + 1h 1ms held back "
        "by join 'with_seller' (after an interval join Spark's watermark trails by the interval's wider bound + 1 ms)")
    windowed, _ = joined_then_counted(TestSource([], schema=BID), TestSource([], schema=AUCTION),
                                      window=hr.Tumbling("10s"))
    assert delay_line(windowed, "per_minute") == ("watermark delay: 2s behind the largest event time seen: max "
                                                  "out-of-orderness 2s")
    wider, _ = joined_then_counted(TestSource([], schema=BID), TestSource([], schema=AUCTION), within=("-5s", "30s"))
    assert delay_line(wider, "per_minute").startswith("watermark delay: 32s 1ms behind")
    in_sql = hr.Pipeline("delay_in_sql")
    sides(in_sql)
    in_sql.sql("SELECT a.k, window(a.lt, '1 minute') AS window, count(*) AS n FROM l a JOIN r b ON a.k = b.k AND "
               "b.rt BETWEEN a.lt - INTERVAL 5 SECONDS AND a.lt GROUP BY a.k, window(a.lt, '1 minute')",
               name="per_k").sink("out", TestSink())
    assert delay_line(in_sql, "per_k") == (
        "watermark delay: 1s behind the largest event time seen: max out-of-orderness 1s; an aggregate after the "
        "query's interval join waits the interval's wider bound + 1 ms more")


@pytest.mark.parametrize("join, held_back", [({"within": ("-1h", "0s")}, HOUR + 1),
                                              ({"window": hr.Tumbling("10s")}, 0)], ids=["interval", "window"])
def test_a_window_after_a_join_comes_out_when_the_watermark_passes_its_end_by_the_delay(join, held_back, spark,
                                                                                       tmp_path):
    """The minute [0, 1m) of a bid at 20 s comes out once the watermark has passed its end by what
    explain shows the join holds it back by (an interval join: 1h 1ms; a window join, whose results
    keep their event time's watermark: nothing); a ``Watermark`` marker sets the watermark itself,
    the bids' max out-of-orderness aside. Not with the watermark 1 ms short: in the batch after."""
    end = MINUTE + held_back  # the join's watermark reaches the minute's end here
    bids = TestSource([[{"auction": 1, "price": 5, "at": 20 * S}], Watermark(end - 1), Watermark(end)],
                      schema=BID, flush=False)
    auctions = TestSource([[{"id": 1, "seller": "ann", "opened": 20 * S}], Watermark(end - 1), Watermark(end)],
                          schema=AUCTION, flush=False)
    p, sink = joined_then_counted(bids, auctions, **join)
    run = PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start()
    steps: list[int] = []  # the last batch id after each step of the input
    run.wait(until_exhausted=True, on_settled=lambda r: steps.append(len(r.progress_log) - 1))
    out = {batch: [(r["seller"], millis(r["window_start"]), r["n"]) for r in rows]
           for batch, rows in sink.batches.items() if rows}
    assert list(out.values()) == [[("ann", 0, 1)]]
    (batch,) = out
    assert steps[1] < batch <= steps[2], (steps, out)


def test_the_delay_example_of_docs_joins_md_prints_what_it_shows(spark, capsys):
    """Run as written; the one window it prints is the one whose end the watermark after the join
    (the smaller of the sides' largest event times, less the delay explain prints) has reached."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "joins.md").read_text()
    code = next(block for block in doc.split("```python\n")[1:] if 'hr.Pipeline("bids_per_minute")' in block)
    namespace: dict[str, Any] = {}
    exec(compile(code.split("```", 1)[0], "docs/joins.md", "exec"), namespace)
    shown = doc.split("<!-- bids_per_minute output -->\n```\n", 1)[1].split("```", 1)[0]
    printed = capsys.readouterr().out
    assert printed == shown
    bids, auctions = (source.steps for source in (namespace["bids"], namespace["auctions"]))
    watermark = min(max(r["at"] for batch in bids for r in batch),
                    max(r["opened"] for batch in auctions for r in batch))
    after_join = watermark - (HOUR + 1)
    opened = {a["id"]: a for batch in auctions for a in batch}
    minutes = Counter((opened[b["auction"]]["seller"], b["at"] // MINUTE) for batch in bids for b in batch
                      if -HOUR <= opened[b["auction"]]["opened"] - b["at"] <= 0)
    assert printed.splitlines()[1:] == [f"{seller} 00:{minute:02} bids: {n}" for (seller, minute), n
                                        in sorted(minutes.items()) if (minute + 1) * MINUTE <= after_join]
