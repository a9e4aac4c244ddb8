"""Rolling features for fraud detection: for each card charge, the card's spend, number of
charges and largest charge over the 10 minutes up to it (in event time), then the charges whose
card spent more than 300 in those 10 minutes. docs/ml.md shows it.

    python examples/rolling_spend.py
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

M = 60_000  # a minute in ms
charges = TestSource(
    [
        [{"card": "4711", "amount": 40, "ts": 0 * M}, {"card": "1234", "amount": 25, "ts": 1 * M},
         {"card": "4711", "amount": 120, "ts": 4 * M}],
        [{"card": "4711", "amount": 200, "ts": 7 * M}, {"card": "1234", "amount": 500, "ts": 15 * M},
         {"card": "4711", "amount": 90, "ts": 12 * M}],
        [{"card": "4711", "amount": 15, "ts": 30 * M}],
    ],
    schema={"card": "string", "amount": "long", "ts": "long"},
)

pipeline = hr.Pipeline("rolling_spend")
features = (pipeline.source("charges", charges, event_time="ts", max_out_of_orderness="5m")
            .key_by("card")
            .rolling("10m", spend=hr.sum("amount"), charges=hr.count(), largest=hr.max("amount")))
features.sink("features", TestSink())
features.filter(hr.col("spend") > 300).sink("suspicious", TestSink())

if __name__ == "__main__":
    written = run_to_completion(pipeline)
    for row in sorted(written["features"], key=lambda r: (r["card"], r["ts"])):
        print(f"card {row['card']} at {row['ts']:%H:%M}: {row['amount']:>3}, in the 10 minutes up to it "
              f"{row['charges']} charges, spend {row['spend']}, largest {row['largest']}")
    for row in sorted(written["suspicious"], key=lambda r: r["ts"]):
        print(f"suspicious: card {row['card']} at {row['ts']:%H:%M} (spend {row['spend']})")
