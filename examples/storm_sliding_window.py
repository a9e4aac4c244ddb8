"""A sliding count window (Storm's SlidingWindowTopology): the sum of the last 30 numbers, every 10.

    python examples/storm_sliding_window.py

The spout emits 1 to 60, at most 25 per micro-batch, so windows span micro-batches: the bolt's
buffered tuples are its state, saved with every micro-batch.
"""

import headrace as hr
from headrace.testing import TestSink, run_to_completion


class NumberSpout(hr.Spout):
    declare_output_fields = "value long"
    bounded = True

    def __init__(self, last: int = 60) -> None:
        self.value, self.last = 0, last

    def next_tuple(self) -> None:
        if self.value < self.last:
            self.value += 1
            self.emit([self.value])


class SlidingSum(hr.BaseWindowedBolt):
    declare_output_fields = "total long, size int, new int, expired int"

    def execute(self, window: hr.TupleWindow) -> None:
        total = sum(t.get_integer("value") for t in window.get())
        self.emit([total, len(window.get()), len(window.get_new()), len(window.get_expired())])


builder = hr.TopologyBuilder("storm_sliding_window")
builder.set_spout("numbers", NumberSpout(), max_tuples_per_batch=25)
builder.set_bolt("sum", SlidingSum().with_window(30, 10)).global_grouping("numbers")
builder.stream("sum").sink("sums", TestSink())
pipeline = builder.create_topology()

if __name__ == "__main__":
    out = run_to_completion(pipeline)
    for row in out["sums"]:
        print(f"sum {row['total']} of {row['size']} tuples ({row['new']} new, {row['expired']} expired)")
