"""Bids joined with the auction they are for, and the records the join dropped as too late
(its late side output), in one pipeline. docs/joins.md shows it.

    python examples/late_bids.py
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

S = 1_000  # a second in ms
# After the first micro-batch the watermark is 60 s: the smaller of the sides' largest event
# times (70 s for bids, 60 s for auctions). In the second, the bid at 30 s and the auction that
# opened at 50 s come too late.
auctions = TestSource(
    [
        [{"id": 1, "seller": "ann", "opened": 10 * S}, {"id": 2, "seller": "bob", "opened": 60 * S}],
        [{"id": 3, "seller": "cat", "opened": 50 * S}],
    ],
    schema={"id": "long", "seller": "string", "opened": "long"},
)
bids = TestSource(
    [
        [{"auction": 1, "price": 5, "at": 20 * S}, {"auction": 2, "price": 7, "at": 70 * S}],
        [{"auction": 1, "price": 9, "at": 30 * S}, {"auction": 2, "price": 3, "at": 80 * S}],
    ],
    schema={"auction": "long", "price": "long", "at": "long"},
)

pipeline = hr.Pipeline("late_bids")
opened = pipeline.source("auctions", auctions, event_time="opened")
# a bid counts for an auction opened in the hour before it
with_seller = (pipeline.source("bids", bids, event_time="at")
               .join(opened, on={"auction": "id"}, within=("-1h", "0s"), name="with_seller"))
with_seller.sink("pairs", TestSink())
with_seller.late_records().sink("late", TestSink())

if __name__ == "__main__":
    written = run_to_completion(pipeline)
    for row in sorted(written["pairs"], key=lambda r: r["at"]):
        print(f"bid {row['price']} at {row['at']:%M:%S} on auction {row['auction']} of {row['seller']}")
    for row in sorted(written["late"], key=lambda r: r["event_time"]):
        print(f"late {row['side']} record, key {row['key']}, at {row['event_time']:%M:%S}: {row['record']}")
