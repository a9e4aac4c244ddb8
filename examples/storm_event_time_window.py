"""An event-time sliding window with a late-tuple stream (Storm's withTimestampField / withLag /
withLateTupleStream).

    python examples/storm_event_time_window.py

Windows of 10 s every 5 s on the tuples' ``ts`` (epoch ms); the watermark is the largest ``ts``
seen minus a lag of 2 s, moved after each micro-batch. A window [start, end) is handed to
``execute`` once the watermark reaches its end; a tuple older than the watermark when it
arrives is late: it goes to the stream ``late``. At the end of the input every window still
holding tuples is handed over.
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

READINGS = TestSource(
    [
        [{"ts": 11_000, "value": 1}, {"ts": 14_000, "value": 2}, {"ts": 18_000, "value": 3}],
        [{"ts": 22_000, "value": 4}, {"ts": 13_000, "value": 5}, {"ts": 19_000, "value": 6}],
        [{"ts": 31_000, "value": 7}],
    ],
    schema="ts long, value long",
)


class WindowSum(hr.BaseWindowedBolt):
    declare_output_fields = {"default": "start long, end long, values string, total long",
                             "late": "ts long, value long"}

    def execute(self, window: hr.TupleWindow) -> None:
        values = [t.get_integer("value") for t in window.get()]
        self.emit([window.get_start_timestamp(), window.get_end_timestamp(), " ".join(map(str, values)),
                   sum(values)])


bolt = WindowSum().with_window("10s", "5s").with_timestamp_field("ts").with_lag("2s").with_late_tuple_stream("late")
builder = hr.TopologyBuilder("storm_event_time_window")
builder.set_spout("readings", READINGS)
builder.set_bolt("sum", bolt).global_grouping("readings")
builder.stream("sum").sink("windows", TestSink())
builder.stream("sum", "late").sink("late", TestSink())
pipeline = builder.create_topology()

if __name__ == "__main__":
    out = run_to_completion(pipeline)
    for row in out["windows"]:
        print(f"[{row['start'] // 1000}s, {row['end'] // 1000}s): {row['values']} -> {row['total']}")
    for row in out["late"]:
        print(f"late: value {row['value']} at {row['ts'] // 1000}s")
