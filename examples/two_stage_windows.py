"""Windows of windows: clicks per page and minute, then each page's busiest minute and total
per five minutes, in one pipeline (one Spark query).

    python examples/two_stage_windows.py
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

M = 60_000  # a minute in ms
clicks = TestSource(
    [
        [{"page": "home", "ts": 5_000}, {"page": "home", "ts": 30_000}, {"page": "cart", "ts": 70_000}],
        [{"page": "home", "ts": M + 10_000}, {"page": "home", "ts": 3 * M + 1_000},
         {"page": "home", "ts": 3 * M + 2_000}, {"page": "home", "ts": 3 * M + 3_000}],
        [{"page": "cart", "ts": 4 * M + 59_000}, {"page": "home", "ts": 6 * M}],
    ],
    schema={"page": "string", "ts": "long"},
)

pipeline = hr.Pipeline("two_stage_windows")
per_minute = (pipeline.source("clicks", clicks, event_time="ts")
              .key_by("page")
              .window(hr.Tumbling("1m"), name="per_minute")
              .count())
# each minute's count is at its window's end - 1 µs: the five minutes that contain that minute
per_five = (per_minute.key_by("page")
            .window(hr.Tumbling("5m"), name="per_five")
            .aggregate(busiest=hr.max("count"), total=hr.sum("count")))
out = TestSink()
per_five.sink("five_minutes", out)

if __name__ == "__main__":
    rows = run_to_completion(pipeline)["five_minutes"]
    for row in sorted(rows, key=lambda r: (r["window_start"], r["page"])):
        print(f"{row['page']:4} [{row['window_start']:%H:%M}, {row['window_end']:%H:%M}) "
              f"busiest minute {row['busiest']}, total {row['total']}")
