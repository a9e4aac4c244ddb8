"""NEXMark q0-q22 in headrace, as a user writes them from headrace's docs: the published SQL through
``p.sql`` where headrace takes it, else other Spark SQL or fluent steps.

Each function adds its sources to the pipeline and returns the stream of the query's answer; the
benchmark adds the sink. The queries headrace cannot run yet are written too, as the published SQL
(in Spark's dialect): headrace refuses them when the pipeline is built, and they run as soon as it
takes them.
"""

from __future__ import annotations

from typing import Any

import headrace as hr
from benchmarks.nexmark_events import SCHEMAS, EventsConfig, folder, longest_auction_ms, side_input_path
from benchmarks.nexmark_reference import RANK_CONDITIONS


class Sources:
    """The folders as headrace Files sources (bounded unless told), one file of each kind per micro-batch."""

    def __init__(self, root: str, config: EventsConfig, *, bounded: bool = True) -> None:
        self.root, self.config, self.bounded = root, config, bounded

    def read(self, p: hr.Pipeline, kind: str, *, event_time: bool | str = False) -> hr.Stream:
        """The events of ``kind``, with their ``dateTime`` as event time (``event_time=True``) or another field."""
        files = hr.sources.Files(folder(self.root, kind), schema=SCHEMAS[kind], bounded=self.bounded,
                                 max_files_per_batch=1)
        time = "dateTime" if event_time is True else event_time or None
        return p.source(kind, files, event_time=time, max_out_of_orderness=self.config.max_delay_ms)


def q0(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    return p.sql("SELECT auction, bidder, price, dateTime, extra FROM bid")


def q1(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    return p.sql("SELECT auction, bidder, 0.908 * price AS price, dateTime, extra FROM bid")


def q2(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    return p.sql("SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0")


# A join of two streams needs a bound in event time (docs/joins.md); the published q3 and q20 have none.
# JOIN_SPAN is longer than the benchmark's event time (5 minutes at the default size), so every match of
# the published, unbounded join is found, and Spark forgets a record once it has passed.
JOIN_SPAN = "INTERVAL 1 HOUR"


def q3(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "auction", event_time=True)
    src.read(p, "person", event_time=True)
    return p.sql(f"""SELECT P.name, P.city, P.state, A.id
                       FROM auction AS A INNER JOIN person AS P ON A.seller = P.id
                        AND A.dateTime BETWEEN P.dateTime - {JOIN_SPAN} AND P.dateTime + {JOIN_SPAN}
                      WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""")


def winning_bids(p: hr.Pipeline, src: Sources, columns: str) -> hr.Stream:
    """Each auction's winning bid (highest price, earliest of equal ones) once the auction has ended, as q9
    finds it: ``columns`` of the auction (``A``) and the bid (``B``)."""
    src.read(p, "auction", event_time="expires")
    src.read(p, "bid", event_time=True)
    return p.sql(f"""SELECT {columns.replace("A.", "").replace("B.", "bid_")} FROM (
                       SELECT {", ".join(f"{c} AS {c.replace('A.', '').replace('B.', 'bid_')}"
                                         for c in columns.split(", "))},
                              ROW_NUMBER() OVER (PARTITION BY A.id, A.expires ORDER BY B.price DESC, B.dateTime ASC)
                              AS rownum
                         FROM auction A, bid B
                        WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
                          AND A.expires <= B.dateTime + INTERVAL {longest_auction_ms(src.config)} MILLISECONDS)
                      WHERE rownum <= 1""", name="winning_bids")


def after_this_batch(ctx: Any) -> int:
    """A time the watermark passes only in a later micro-batch: a timer there fires once every record of
    this batch has been handled (a timer at or behind the watermark would fire right after the record)."""
    return (ctx.watermark or 0) + 1


class RunningAverage(hr.KeyedProcessFunction):
    """Per category, the average of its auctions' final prices so far, emitted once for each micro-batch
    that adds to it, when the next one starts (one timer pending at a time)."""

    totals = hr.ValueState(default=(0, 0))
    pending = hr.ValueState(default=None)

    def process(self, record, ctx):
        total, count = self.totals.get()
        self.totals.set((total + record["bid_price"], count + 1))
        if self.pending.get() is not None:
            ctx.delete_event_time_timer(self.pending.get())
        self.pending.set(after_this_batch(ctx))
        ctx.register_event_time_timer(self.pending.get())

    def on_timer(self, timer, ctx):
        self.pending.clear()
        total, count = self.totals.get()
        ctx.emit({"category": ctx.key, "avg_final": total / count})


def q4(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The winning bids as q9, then a running average per category: the published SQL's outer GROUP BY."""
    winners = winning_bids(p, src, "A.id, A.expires, A.category, B.price")
    return winners.key_by("category").process(RunningAverage(), schema={"category": "long", "avg_final": "double"})


def q5(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The published SQL: bids per auction and sliding window, joined to each window's largest count. The
    second count reads the stream again; its maximum groups the first windows again (``GROUP BY w``)."""
    src.read(p, "bid", event_time=True)
    counts = """SELECT auction, count(*) AS num, window(dateTime, '10 seconds', '2 seconds') AS w
                  FROM bid GROUP BY auction, window(dateTime, '10 seconds', '2 seconds')"""
    return p.sql(f"""SELECT AuctionBids.auction, AuctionBids.num
                       FROM ({counts}) AS AuctionBids
                       JOIN (SELECT max(CountBids.num) AS maxn, CountBids.w FROM ({counts}) AS CountBids
                              GROUP BY CountBids.w) AS MaxBids
                         ON AuctionBids.w = MaxBids.w AND AuctionBids.num >= MaxBids.maxn""")


class LastElevenAverage(hr.KeyedProcessFunction):
    """Per seller, the average price of its last 11 auctions (ROWS BETWEEN 10 PRECEDING AND CURRENT ROW) in
    the order they end (then by id), one row per auction. A micro-batch's winners come in any order, each
    ended after every winner of the batches before, so they wait for the next batch and go in sorted."""

    waiting = hr.ListState()
    last = hr.ValueState(default=())

    def process(self, record, ctx):
        self.waiting.append((ctx.timestamp, record["id"], record["bid_price"]))
        ctx.register_event_time_timer(after_this_batch(ctx))

    def on_timer(self, timer, ctx):
        last = list(self.last.get())
        for _, _, price in sorted(self.waiting.get()):
            last = [*last, price][-11:]
            ctx.emit({"seller": ctx.key, "avg_price": sum(last) / len(last)})
        self.last.set(tuple(last))
        self.waiting.clear()


def q6(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The winning bids as q9, then per seller the average of the last 11 (the published SQL's AVG OVER)."""
    winners = winning_bids(p, src, "A.id, A.expires, A.seller, B.price")
    return winners.key_by("seller").process(LastElevenAverage(), schema={"seller": "long", "avg_price": "double"})


def q7(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The published SQL: each tumbling window's highest price, joined back to the window's bids from its start
    to its end, both included."""
    src.read(p, "bid", event_time=True)
    return p.sql("""SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra
                      FROM bid B
                      JOIN (SELECT MAX(price) AS maxprice, window.end AS dateTime
                              FROM bid GROUP BY window(dateTime, '10 seconds')) B1
                        ON B.price = B1.maxprice
                       AND B.dateTime BETWEEN B1.dateTime - INTERVAL 10 SECONDS AND B1.dateTime""")


def q8(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The published SQL: the persons and the sellers of each tumbling window, joined on id and window."""
    src.read(p, "person", event_time=True)
    src.read(p, "auction", event_time=True)
    return p.sql("""SELECT P.id, P.name, P.starttime
                      FROM (SELECT id, name, window.start AS starttime, window.end AS endtime
                              FROM person GROUP BY id, name, window(dateTime, '10 seconds')) P
                      JOIN (SELECT seller, window.start AS starttime, window.end AS endtime
                              FROM auction GROUP BY seller, window(dateTime, '10 seconds')) A
                        ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""")


def q9(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The published SQL, with the auctions' event time their end (``expires``) and the join bounded by it
    (an auction ends at most the longest auction's length after a bid on it): each auction's winning bid
    is emitted once, when the watermark passes its end. The PARTITION BY holds ``A.expires`` for that;
    it adds nothing else, since an auction has one end."""
    src.read(p, "auction", event_time="expires")
    src.read(p, "bid", event_time=True)
    longest = longest_auction_ms(src.config)
    return p.sql(f"""SELECT id, itemName, description, initialBid, reserve, dateTime, expires, seller, category, extra,
                            auction, bidder, price, bid_dateTime, bid_extra
                       FROM (SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime, B.extra AS bid_extra,
                                    ROW_NUMBER() OVER (PARTITION BY A.id, A.expires
                                                       ORDER BY B.price DESC, B.dateTime ASC) AS rownum
                               FROM auction A, bid B
                              WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
                                AND A.expires <= B.dateTime + INTERVAL {longest} MILLISECONDS)
                      WHERE rownum <= 1""")


def q10(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The rows with their partition columns (the benchmark's Files sink writes partition_by=["dt", "hm"])."""
    src.read(p, "bid")
    return p.sql("""SELECT auction, bidder, price, dateTime, extra,
                           date_format(dateTime, 'yyyy-MM-dd') AS dt, date_format(dateTime, 'HH:mm') AS hm
                      FROM bid""")


def q11(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid", event_time=True)
    return p.sql("""SELECT bidder, count(*) AS bid_count,
                           session_window.start AS starttime, session_window.end AS endtime
                      FROM bid
                     GROUP BY bidder, session_window(dateTime, '10 seconds')""")


def q12(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """Processing-time windows in SQL: the micro-batch's ``current_timestamp()`` (the published SQL's
    PROCTIME()) declared as the event time between two queries, then a tumbling window over it."""
    src.read(p, "bid")
    p.sql("SELECT bidder, current_timestamp() AS p_time FROM bid", name="with_p_time").with_event_time(
        "p_time", name="bid_p_time")
    return p.sql("""SELECT bidder, count(*) AS bid_count, window.start AS starttime, window.end AS endtime
                      FROM bid_p_time
                     GROUP BY bidder, window(p_time, '10 seconds')""")


def q13(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    p.table("side_input", path=side_input_path(src.root), format="csv", schema="key long, value string")
    return p.sql("""SELECT B.auction, B.bidder, B.price, B.dateTime, S.value
                      FROM bid B JOIN side_input S ON mod(B.auction, 10000) = S.key""")


def count_char(text: str | None, char: str | None) -> int:
    """q14's user function: how many times ``char`` occurs in ``text``."""
    return text.count(char) if text is not None and char else 0


def q14(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """The published SQL, with count_char registered for it (``p.udf``)."""
    src.read(p, "bid")
    p.udf("count_char", count_char, returns="long")
    return p.sql("""SELECT auction, bidder, 0.908 * price AS price,
                           CASE
                               WHEN HOUR(dateTime) >= 8 AND HOUR(dateTime) <= 18 THEN 'dayTime'
                               WHEN HOUR(dateTime) <= 6 OR HOUR(dateTime) >= 20 THEN 'nightTime'
                               ELSE 'otherTime'
                           END AS bidTimeType,
                           dateTime, extra, count_char(extra, 'c') AS c_counts
                      FROM bid
                     WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000""")


def bidding_statistics() -> str:
    """q15 and q16's columns, as the published SQL writes them."""
    counts = ["count(*) AS total_bids"] + [f"count(*) FILTER (WHERE {c}) AS {r}_bids"
                                           for r, c in RANK_CONDITIONS.items()]
    for field in ("bidder", "auction"):
        counts += [f"count(DISTINCT {field}) AS total_{field}s"]
        counts += [f"count(DISTINCT {field}) FILTER (WHERE {c}) AS {r}_{field}s" for r, c in RANK_CONDITIONS.items()]
    return ",\n".join(counts)


def q15(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    return p.sql(f"""SELECT date_format(dateTime, 'yyyy-MM-dd') AS day, {bidding_statistics()}
                       FROM bid GROUP BY date_format(dateTime, 'yyyy-MM-dd')""")


def q16(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    return p.sql(f"""SELECT channel, date_format(dateTime, 'yyyy-MM-dd') AS day,
                            max(date_format(dateTime, 'HH:mm')) AS minute, {bidding_statistics()}
                       FROM bid GROUP BY channel, date_format(dateTime, 'yyyy-MM-dd')""")


def q17(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    ranks = ", ".join(f"count(*) FILTER (WHERE {c}) AS {r}_bids" for r, c in RANK_CONDITIONS.items())
    return p.sql(f"""SELECT auction, date_format(dateTime, 'yyyy-MM-dd') AS day, count(*) AS total_bids, {ranks},
                            min(price) AS min_price, max(price) AS max_price, avg(price) AS avg_price,
                            sum(price) AS sum_price
                       FROM bid GROUP BY auction, date_format(dateTime, 'yyyy-MM-dd')""")


def q18(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    return p.sql("""SELECT auction, bidder, price, channel, url, dateTime, extra
                      FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC)
                                      AS rank_number
                              FROM bid)
                     WHERE rank_number <= 1""")


def q19(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid")
    return p.sql("""SELECT * FROM
                      (SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC, dateTime ASC)
                                 AS rank_number
                         FROM bid)
                     WHERE rank_number <= 10""")


def q20(p: hr.Pipeline, src: Sources) -> hr.Stream:
    src.read(p, "bid", event_time=True)
    src.read(p, "auction", event_time=True)
    return p.sql(f"""SELECT auction, bidder, price, channel, url, B.dateTime, B.extra,
                            itemName, description, initialBid, reserve, A.dateTime AS auction_dateTime, expires,
                            seller, category, A.extra AS auction_extra
                       FROM bid AS B INNER JOIN auction AS A ON B.auction = A.id
                        AND B.dateTime BETWEEN A.dateTime - {JOIN_SPAN} AND A.dateTime + {JOIN_SPAN}
                      WHERE A.category = 10""")


def q21(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """Spark's regexp_extract gives '' where Flink's gives NULL (no match): the filter tests for ''."""
    src.read(p, "bid")
    return p.sql("""SELECT auction, bidder, price, channel,
                           CASE
                               WHEN lower(channel) = 'apple' THEN '0'
                               WHEN lower(channel) = 'google' THEN '1'
                               WHEN lower(channel) = 'facebook' THEN '2'
                               WHEN lower(channel) = 'baidu' THEN '3'
                               ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2)
                           END AS channel_id
                      FROM bid
                     WHERE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) <> ''
                        OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')""")


def q22(p: hr.Pipeline, src: Sources) -> hr.Stream:
    """Flink's SPLIT_INDEX(url, '/', i) is Spark's split(url, '/')[i]."""
    src.read(p, "bid")
    return p.sql("""SELECT auction, bidder, price, channel,
                           split(url, '/')[3] AS dir1, split(url, '/')[4] AS dir2, split(url, '/')[5] AS dir3
                      FROM bid""")
