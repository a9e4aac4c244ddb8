"""Bids joined with the auction they are for (an interval join of two streams), then each
seller's bids and takings per minute, in one pipeline (one Spark query). docs/joins.md shows it.

    python examples/auction_bids.py
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

S = 1_000  # a second in ms
auctions = TestSource(
    [
        [{"id": 1, "seller": "ann", "opened": 10 * S}, {"id": 2, "seller": "bob", "opened": 20 * S}],
        [{"id": 3, "seller": "ann", "opened": 90 * S}],
    ],
    schema={"id": "long", "seller": "string", "opened": "long"},
)
bids = TestSource(
    [
        [{"auction": 1, "price": 5, "at": 15 * S}, {"auction": 2, "price": 7, "at": 40 * S},
         {"auction": 1, "price": 9, "at": 50 * S}],
        [{"auction": 3, "price": 4, "at": 100 * S}, {"auction": 1, "price": 6, "at": 65 * S},
         {"auction": 9, "price": 100, "at": 70 * S}, {"auction": 2, "price": 3, "at": 150 * S}],
    ],
    schema={"auction": "long", "price": "long", "at": "long"},
)

pipeline = hr.Pipeline("auction_bids")
opened = pipeline.source("auctions", auctions, event_time="opened")
# a bid counts for an auction opened in the hour before it: opened - at lies in [-1h, 0]
with_seller = (pipeline.source("bids", bids, event_time="at")
               .join(opened, on={"auction": "id"}, within=("-1h", "0s"), name="with_seller"))
per_minute = (with_seller.key_by("seller")
              .window(hr.Tumbling("1m"), name="per_minute")
              .aggregate(bids=hr.count(), takings=hr.sum("price")))
out = TestSink()
per_minute.sink("per_minute_out", out)

if __name__ == "__main__":
    rows = run_to_completion(pipeline)["per_minute_out"]
    for row in sorted(rows, key=lambda r: (r["window_start"], r["seller"])):
        print(f"{row['seller']} [{row['window_start']:%H:%M}, {row['window_end']:%H:%M}) "
              f"bids={row['bids']} takings={row['takings']}")
