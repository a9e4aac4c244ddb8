"""NEXMark's winning bids (query 9, as SQL), then each seller's average over its last sales
(query 6, as a process step), in one pipeline (one Spark query). docs/sql.md shows it.

    python examples/nexmark_winning_bids.py

An auction's event time is its end (``expires``): grouped by it after the join, each auction's
winning bid comes out once, when the watermark passes its end. An auction here lasts at most 30 s.
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

S = 1_000  # a second in ms
auctions = TestSource(
    [
        [{"id": 1, "seller": 7, "dateTime": 0, "expires": 20 * S},
         {"id": 2, "seller": 8, "dateTime": 2 * S, "expires": 30 * S}],
        [{"id": 3, "seller": 7, "dateTime": 12 * S, "expires": 40 * S}],
        [{"id": 4, "seller": 7, "dateTime": 35 * S, "expires": 60 * S}],
    ],
    schema={"id": "long", "seller": "long", "dateTime": "long", "expires": "long"},
)
bids = TestSource(
    [
        [{"auction": 1, "bidder": 100, "price": 10, "dateTime": 5 * S},
         {"auction": 2, "bidder": 101, "price": 15, "dateTime": 6 * S},
         {"auction": 1, "bidder": 102, "price": 12, "dateTime": 8 * S}],
        [{"auction": 1, "bidder": 100, "price": 11, "dateTime": 15 * S},
         {"auction": 2, "bidder": 102, "price": 25, "dateTime": 18 * S},
         {"auction": 3, "bidder": 101, "price": 30, "dateTime": 19 * S},
         {"auction": 1, "bidder": 103, "price": 99, "dateTime": 25 * S}],  # after auction 1 ended
        [{"auction": 3, "bidder": 100, "price": 33, "dateTime": 38 * S},
         {"auction": 4, "bidder": 103, "price": 40, "dateTime": 45 * S},
         {"auction": 2, "bidder": 100, "price": 26, "dateTime": 29 * S}],
    ],
    schema={"auction": "long", "bidder": "long", "price": "long", "dateTime": "long"},
)

pipeline = hr.Pipeline("nexmark_winning_bids")
pipeline.source("auction", auctions, event_time="expires")
pipeline.source("bid", bids, event_time="dateTime")
winning = pipeline.sql("""
    SELECT id, seller, expires, bidder, price FROM (
      SELECT A.id, A.seller, A.expires, B.bidder, B.price,
             ROW_NUMBER() OVER (PARTITION BY A.id, A.expires ORDER BY B.price DESC, B.dateTime) AS rownum
        FROM auction A, bid B
       WHERE A.id = B.auction AND B.dateTime BETWEEN timestamp_millis(A.dateTime) AND A.expires
         AND A.expires <= B.dateTime + INTERVAL 30 SECONDS)
     WHERE rownum <= 1""", name="winning_bids")


class LastSales(hr.KeyedProcessFunction):
    """Per seller, the average price of its last 2 sales (query 6 takes 11), in the order the
    auctions end. A micro-batch's winners come in any order, each ended after those of the
    batches before, so they wait for the timer the next batch's watermark passes."""

    waiting = hr.ListState()
    last = hr.ValueState(default=())

    def process(self, record, ctx):
        self.waiting.append((ctx.timestamp, record["id"], record["price"]))
        ctx.register_event_time_timer((ctx.watermark or 0) + 1)

    def on_timer(self, timer, ctx):
        last = list(self.last.get())
        for _, auction, price in sorted(self.waiting.get()):
            last = [*last, price][-2:]
            ctx.emit({"seller": ctx.key, "auction": auction, "average": sum(last) / len(last)})
        self.last.set(tuple(last))
        self.waiting.clear()


averages = winning.key_by("seller").process(
    LastSales(), schema={"seller": "long", "auction": "long", "average": "double"}, name="last_sales")
winners, per_seller = TestSink(), TestSink()
winning.sink("winners_out", winners)
averages.sink("averages_out", per_seller)

if __name__ == "__main__":
    results = run_to_completion(pipeline)
    for row in sorted(results["winners_out"], key=lambda r: r["id"]):
        print(f"auction {row['id']} (seller {row['seller']}, ended {row['expires']:%M:%S}): "
              f"bidder {row['bidder']} at {row['price']}")
    for row in sorted(results["averages_out"], key=lambda r: (r["seller"], r["auction"])):
        print(f"seller {row['seller']} after auction {row['auction']}: average {row['average']:.1f}")
