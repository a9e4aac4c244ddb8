"""Early, on-time and late panes, and the late side output, on a small explicit input.

    python examples/late_data.py
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, Watermark, run_to_completion

readings = TestSource(
    [
        [{"sensor": "a", "value": 1, "ts": 1_000}, {"sensor": "a", "value": 2, "ts": 2_000}],
        [{"sensor": "a", "value": 3, "ts": 3_000}],
        Watermark(10_000),                               # the window [0, 10s) is complete
        [{"sensor": "a", "value": 4, "ts": 4_000}],      # late, within the allowed lateness: a late pane
        Watermark(20_000),                               # now past end + allowed lateness
        [{"sensor": "a", "value": 5, "ts": 5_000}],      # too late: the late side output
    ],
    schema={"sensor": "string", "value": "long", "ts": "timestamp"},
)

pipeline = hr.Pipeline("late_data")
windows = (pipeline.source("readings", readings, event_time="ts")
           .key_by("sensor")
           .window(hr.Tumbling("10s"), trigger=hr.AfterWatermark(early=hr.EveryN(2)), allowed_lateness="5s"))
sums = windows.aggregate(total=hr.sum("value"), n=hr.count())
panes, late = TestSink(), TestSink()
sums.sink("panes", panes)
sums.late_records().sink("late", late)

if __name__ == "__main__":
    out = run_to_completion(pipeline)
    for row in out["panes"]:
        print(f"{row['sensor']} [{row['window_start']:%H:%M:%S}, {row['window_end']:%H:%M:%S}) "
              f"{row['pane_kind']:8} pane {row['pane_index']}: total={row['total']} n={row['n']}")
    for row in out["late"]:
        print(f"dropped by {row['step']}: {row['record']} (missed [{row['window_start']:%H:%M:%S}, "
              f"{row['window_end']:%H:%M:%S}))")
