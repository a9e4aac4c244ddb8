"""Storm's ExclamationTopology: a word spout and two exclamation bolts in a row.

    python examples/storm_exclamation.py

``WordSpout`` emits Storm's five test words, twice, at most four per micro-batch; each bolt
appends "!!!" (``exclaim1`` with three tasks, ``exclaim2`` with two), so "nathan" comes out as
"nathan!!!!!!". The spout's ``ack`` runs once the micro-batch carrying the word has committed.
"""

from collections import Counter

import headrace as hr
from headrace.testing import TestSink, run_to_completion

WORDS = ["nathan", "mike", "jackson", "golda", "bertels"]


class WordSpout(hr.Spout):
    declare_output_fields = "word string"
    bounded = True  # the input ends the first time next_tuple emits nothing

    def __init__(self, rounds: int = 2) -> None:
        self.rounds, self.sent = rounds, 0

    def next_tuple(self) -> None:
        if self.sent < self.rounds * len(WORDS):
            self.emit([WORDS[self.sent % len(WORDS)]], msg_id=self.sent)
            self.sent += 1


class ExclamationBolt(hr.Bolt):
    declare_output_fields = "word string"

    def process(self, tuple: hr.Tuple) -> None:
        self.emit([tuple.get_string("word") + "!!!"], anchors=tuple)
        self.ack(tuple)


builder = hr.TopologyBuilder("storm_exclamation")
builder.set_spout("word", WordSpout(), max_tuples_per_batch=4)
builder.set_bolt("exclaim1", ExclamationBolt(), parallelism=3).shuffle_grouping("word")
builder.set_bolt("exclaim2", ExclamationBolt(), parallelism=2).shuffle_grouping("exclaim1")
builder.stream("exclaim2").sink("out", TestSink())
pipeline = builder.create_topology()

if __name__ == "__main__":
    out = run_to_completion(pipeline)
    counts = Counter(row["word"] for row in out["out"])
    for word, count in sorted(counts.items()):
        print(f"{word} x{count}")
