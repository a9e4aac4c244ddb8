"""NEXMark q0-q22 hand-written in PySpark, as a PySpark engineer would: ``spark.readStream`` over the
JSON-lines folders, Spark's own operators where it has them.

Each function returns an :class:`Output`: the streaming DataFrame, its output mode, and for q10 the
columns its files are partitioned by. Where Spark has no streaming operator for a query, the
nearest native form is used, and said so in the function's docstring:

* **A bounded input ends with a flush row.** Spark leaves the last event-time windows of a bounded
  input open. A stateful query therefore reads its folders and the ``flush`` folder beside them
  (``{events,flush}/<kind>``; Spark's file source takes files oldest first, and the flush file is
  the newest): its one row, a day after every event, moves the watermark past every window. It is
  dropped right after the watermark, by a filter on the event-time column (Spark pushes a filter on
  another column below the watermark, where the row would not move it).
* **Aggregates of aggregates** (q4, q6) run their second level on the driver, per micro-batch
  (``Output.then``), over the rows the first level emits once they are final.
* **COUNT(DISTINCT)** (q15, q16) is ``size(collect_set(...))``, and **top-N** (q19) a sorted, sliced
  ``collect_list``: Spark refuses distinct aggregates and ``ROW_NUMBER`` on a stream.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from benchmarks.nexmark_events import (
    BID_FIELDS,
    SCHEMAS,
    EventsConfig,
    flush_ms,
    folder,
    longest_auction_ms,
    side_input_path,
    with_flush,
)
from benchmarks.nexmark_reference import RANK_CONDITIONS

Rows = list[dict[str, Any]]


@dataclass
class Output:
    df: DataFrame
    mode: str = "append"
    partition_by: tuple[str, ...] = ()  # written as JSON files partitioned by these columns (q10)
    then: Callable[[Rows], Rows] | None = None  # a second level, run on each micro-batch's rows on the driver


class Sources:
    """The folders as Spark streams, one file of each kind per micro-batch."""

    def __init__(self, spark: SparkSession, root: str, config: EventsConfig) -> None:
        self.spark, self.root, self.config = spark, root, config

    def read(self, kind: str) -> DataFrame:
        """``kind``'s events, without event time."""
        return self._files(kind, folder(self.root, kind))

    def timed(self, kind: str, column: str = "dateTime") -> DataFrame:
        """``kind``'s events with a watermark on ``column``, which the flush row moves past every window."""
        delay = f"{self.config.max_delay_ms} milliseconds"
        df = self._files(kind, with_flush(self.root, kind)).withWatermark(column, delay)
        return df.filter(F.col(column) < F.timestamp_millis(F.lit(flush_ms(self.config))))

    def side_input(self) -> DataFrame:
        return self.spark.read.csv(side_input_path(self.root), header=True, schema="key long, value string")

    def _files(self, kind: str, path: str) -> DataFrame:
        schema = ", ".join(f"{name} {type_}" for name, type_ in SCHEMAS[kind].items())
        return (self.spark.readStream.schema(schema).option("maxFilesPerTrigger", 1)
                .json(f"{path}/*.jsonl"))


def euros(price: str = "price") -> Column:
    return F.expr(f"0.908 * {price}")


def q0(src: Sources) -> Output:
    return Output(src.read("bid").select("auction", "bidder", "price", "dateTime", "extra"))


def q1(src: Sources) -> Output:
    return Output(src.read("bid").select("auction", "bidder", euros().alias("price"), "dateTime", "extra"))


def q2(src: Sources) -> Output:
    return Output(src.read("bid").filter(F.col("auction") % 123 == 0).select("auction", "price"))


def q3(src: Sources) -> Output:
    """An inner join of two streams without a time bound: Spark keeps both sides for ever."""
    auctions = src.read("auction").filter(F.col("category") == 10).alias("A")
    persons = src.read("person").filter(F.col("state").isin("OR", "ID", "CA")).alias("P")
    return Output(auctions.join(persons, F.col("A.seller") == F.col("P.id"))
                  .select("P.name", "P.city", "P.state", "A.id"))


def winning_bids(src: Sources) -> DataFrame:
    """Each auction and its winning bid (highest price, earliest of equal ones), once the auction has ended.

    The auctions' watermark is on ``expires``, so the aggregate emits an auction when it has ended.
    ``A.expires <= B.dateTime + <the longest auction>``, true of every match, bounds the join's state."""
    auctions, bids = src.timed("auction", "expires").alias("A"), src.timed("bid").alias("B")
    longest = longest_auction_ms(src.config)
    joined = auctions.join(bids, F.expr("A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires "
                                        f"AND A.expires <= B.dateTime + INTERVAL {longest} MILLISECONDS"))
    auction = [F.col(f"A.{name}").alias(name) for name in SCHEMAS["auction"]]
    bid = [F.col(f"B.{name}").alias(f"bid_{name}") for name in SCHEMAS["bid"]]
    best_first = F.struct(F.col("B.price"), -F.unix_millis(F.col("B.dateTime")))
    return (joined.groupBy("A.id", "A.expires").agg(F.max_by(F.struct(*auction, *bid), best_first).alias("w"))
            .select("w.*"))


def q4(src: Sources) -> Output:
    """Winning bids as in q9; the average per category on the driver (a running sum and count)."""
    totals: dict[int, tuple[int, int]] = {}

    def averages(rows: Rows) -> Rows:
        for row in rows:
            total, count = totals.get(row["category"], (0, 0))
            totals[row["category"]] = (total + row["final"], count + 1)
        return [{"category": c, "avg_final": totals[c][0] / totals[c][1]} for c in {r["category"] for r in rows}]

    return Output(winning_bids(src).select("category", F.col("bid_price").alias("final")), then=averages)


def q5(src: Sources) -> Output:
    """Counts per auction and sliding window, then per window the auctions with the most (a chained aggregate)."""
    counts = (src.timed("bid").groupBy(F.window("dateTime", "10 seconds", "2 seconds"), "auction")
              .agg(F.count(F.lit(1)).alias("num")))
    per_window = counts.groupBy("window").agg(F.max("num").alias("most"),
                                              F.collect_list(F.struct("auction", "num")).alias("counts"))
    return Output(per_window.select(F.explode("counts").alias("c"), "most").filter(F.col("c.num") >= F.col("most"))
                  .select("c.auction", "c.num"))


def q6(src: Sources) -> Output:
    """Winning bids as in q9; per seller, the average of the last 11 (ROWS BETWEEN 10 PRECEDING AND CURRENT
    ROW) on the driver, in the order the auctions end."""
    last: dict[int, deque[int]] = {}

    def averages(rows: Rows) -> Rows:
        out = []
        for row in sorted(rows, key=lambda r: (r["expires"], r["id"])):
            prices = last.setdefault(row["seller"], deque(maxlen=11))
            prices.append(row["bid_price"])
            out.append({"seller": row["seller"], "avg_price": sum(prices) / len(prices)})
        return out

    return Output(winning_bids(src).select("id", "expires", "seller", "bid_price"), then=averages)


def q7(src: Sources) -> Output:
    """The highest price per tumbling window, joined back to the bids of the window (both ends included)."""
    highest = (src.timed("bid").groupBy(F.window("dateTime", "10 seconds")).agg(F.max("price").alias("maxprice"))
               .select(F.window_time("window").alias("last_instant"), "maxprice"))  # the window's end - 1 µs
    bids = src.timed("bid")
    on = (F.col("price") == F.col("maxprice")) & F.expr(
        "dateTime BETWEEN last_instant + INTERVAL 1 MICROSECOND - INTERVAL 10 SECONDS "
        "AND last_instant + INTERVAL 1 MICROSECOND")
    return Output(bids.join(highest, on).select("auction", "price", "bidder", "dateTime", "extra"))


def q8(src: Sources) -> Output:
    """Persons joined to auctions on their seller and tumbling window, one row per person and window."""
    persons = src.timed("person").select("id", "name", F.window("dateTime", "10 seconds").alias("window"))
    sellers = src.timed("auction").select("seller", F.window("dateTime", "10 seconds").alias("seller_window"))
    joined = persons.join(sellers, (F.col("id") == F.col("seller")) & (F.col("window") == F.col("seller_window")))
    return Output(joined.groupBy("id", "name", "window").agg(F.count(F.lit(1)))
                  .select("id", "name", F.col("window.start").alias("starttime")))


def q9(src: Sources) -> Output:
    bid = [F.col(f"bid_{name}").alias(name) for name in ("auction", "bidder", "price")]
    return Output(winning_bids(src).select(*SCHEMAS["auction"], *bid, "bid_dateTime", "bid_extra"))


def q10(src: Sources) -> Output:
    bids = src.read("bid").select("auction", "bidder", "price", "dateTime", "extra",
                                  F.date_format("dateTime", "yyyy-MM-dd").alias("dt"),
                                  F.date_format("dateTime", "HH:mm").alias("hm"))
    return Output(bids, partition_by=("dt", "hm"))


def q11(src: Sources) -> Output:
    sessions = src.timed("bid").groupBy("bidder", F.session_window("dateTime", "10 seconds"))
    return Output(sessions.agg(F.count(F.lit(1)).alias("bid_count"))
                  .select("bidder", "bid_count", F.col("session_window.start").alias("starttime"),
                          F.col("session_window.end").alias("endtime")))


def q12(src: Sources) -> Output:
    """Processing-time windows: ``current_timestamp()`` (the micro-batch's time) with a watermark; update
    mode, since nothing moves processing time past the last windows of a bounded input."""
    bids = src.read("bid").withColumn("p_time", F.current_timestamp()).withWatermark("p_time", "0 seconds")
    counts = bids.groupBy("bidder", F.window("p_time", "10 seconds")).agg(F.count(F.lit(1)).alias("bid_count"))
    return Output(counts.select("bidder", "bid_count", F.col("window.start").alias("starttime"),
                                F.col("window.end").alias("endtime")), mode="update")


def q13(src: Sources) -> Output:
    side = F.broadcast(src.side_input())
    return Output(src.read("bid").join(side, F.col("auction") % 10_000 == F.col("key"))
                  .select("auction", "bidder", "price", "dateTime", "value"))


def count_char(text: str | None, char: str | None) -> int:
    """q14's user function: how many times ``char`` occurs in ``text``."""
    return text.count(char) if text is not None and char else 0


def q14(src: Sources) -> Output:
    """``count_char`` as a Python UDF."""
    counter = F.udf(lambda text, char: count_char(text, char), "long")  # no type hints: not a pandas UDF
    hour = F.hour("dateTime")
    time_type = (F.when((hour >= 8) & (hour <= 18), "dayTime").when((hour <= 6) | (hour >= 20), "nightTime")
                 .otherwise("otherTime"))
    bids = src.read("bid").filter((euros() > 1_000_000) & (euros() < 50_000_000))
    return Output(bids.select("auction", "bidder", euros().alias("price"), time_type.alias("bidTimeType"),
                              "dateTime", "extra", counter("extra", F.lit("c")).alias("c_counts")))


def bidding_statistics() -> list[Column]:
    """q15 and q16's columns: bids, distinct bidders and distinct auctions, in total and per price rank."""
    conditions: dict[str, Column | None] = {"total": None, **{r: F.expr(c) for r, c in RANK_CONDITIONS.items()}}

    def rows(condition: Column | None) -> Column:
        return F.count(F.lit(1) if condition is None else F.when(condition, 1))

    def distinct(column: str, condition: Column | None) -> Column:
        values = F.col(column) if condition is None else F.when(condition, F.col(column))
        return F.size(F.collect_set(values))  # collect_set skips nulls: the rows the condition leaves out

    return ([rows(c).alias(f"{r}_bids") for r, c in conditions.items()]
            + [distinct(what, c).alias(f"{r}_{what}s")
               for what in ("bidder", "auction") for r, c in conditions.items()])


def q15(src: Sources) -> Output:
    day = F.date_format("dateTime", "yyyy-MM-dd").alias("day")
    return Output(src.read("bid").groupBy(day).agg(*bidding_statistics()), mode="update")


def q16(src: Sources) -> Output:
    day = F.date_format("dateTime", "yyyy-MM-dd").alias("day")
    minute = F.max(F.date_format("dateTime", "HH:mm")).alias("minute")
    return Output(src.read("bid").groupBy("channel", day).agg(minute, *bidding_statistics()), mode="update")


def q17(src: Sources) -> Output:
    day = F.date_format("dateTime", "yyyy-MM-dd").alias("day")
    ranks = [F.count(F.when(F.expr(c), 1)).alias(f"{r}_bids") for r, c in RANK_CONDITIONS.items()]
    return Output(src.read("bid").groupBy("auction", day).agg(
        F.count(F.lit(1)).alias("total_bids"), *ranks, F.min("price").alias("min_price"),
        F.max("price").alias("max_price"), F.avg("price").alias("avg_price"), F.sum("price").alias("sum_price")),
        mode="update")


def q18(src: Sources) -> Output:
    """Each bidder's last bid on each auction: ``max_by`` the time, in update mode."""
    last = (src.read("bid").groupBy("bidder", "auction")
            .agg(F.max_by(F.struct(*BID_FIELDS), "dateTime").alias("last")))
    return Output(last.select("last.*"), mode="update")


def q19(src: Sources) -> Output:
    """Each auction's ten highest bids (earliest first among equal prices), ranked, in update mode."""
    order = F.struct((-F.col("price")).alias("minus_price"), F.col("dateTime").alias("at"),
                     F.struct(*BID_FIELDS).alias("bid"))
    top = (src.read("bid").groupBy("auction").agg(F.slice(F.sort_array(F.collect_list(order)), 1, 10).alias("top"))
           .select(F.posexplode("top").alias("number", "entry")))
    return Output(top.select("entry.bid.*", (F.col("number") + 1).alias("rank_number")), mode="update")


def q20(src: Sources) -> Output:
    """An inner join of two streams without a time bound: Spark keeps both sides for ever."""
    auctions = src.read("auction").filter(F.col("category") == 10).alias("A")
    bids = src.read("bid").alias("B")
    auction = [F.col(f"A.{n}").alias(f"auction_{n}" if n in ("dateTime", "extra") else n)
               for n in SCHEMAS["auction"] if n != "id"]
    return Output(bids.join(auctions, F.col("B.auction") == F.col("A.id"))
                  .select(*[F.col(f"B.{n}") for n in BID_FIELDS], *auction))


def q21(src: Sources) -> Output:
    """Spark's ``regexp_extract`` gives '' where Flink's gives NULL (no match): the filter tests for ''."""
    found = F.regexp_extract("url", "(&|^)channel_id=([^&]*)", 2)
    channel = F.lower("channel")
    channel_id = (F.when(channel == "apple", "0").when(channel == "google", "1").when(channel == "facebook", "2")
                  .when(channel == "baidu", "3").otherwise(found))
    bids = src.read("bid").filter((found != "") | channel.isin("apple", "google", "facebook", "baidu"))
    return Output(bids.select("auction", "bidder", "price", "channel", channel_id.alias("channel_id")))


def q22(src: Sources) -> Output:
    parts = F.split("url", "/")
    return Output(src.read("bid").select("auction", "bidder", "price", "channel", parts[3].alias("dir1"),
                                         parts[4].alias("dir2"), parts[5].alias("dir3")))
