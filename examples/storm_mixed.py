"""A fluent stream, Apex operators and a Storm bolt in one pipeline.

    python examples/storm_mixed.py

Lines are split into words by a fluent ``flat_map``; an Apex operator (two partitions)
normalises them; a Storm bolt (two tasks, fields grouping on ``word``) keeps running counts;
a second Apex operator reads the bolt's stream through ``builder.port`` and, at the end of each
streaming window, reports the words whose count reached a multiple of 3; a fluent ``map``
formats the report for the sink.
"""

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

LINES = TestSource(
    [
        [{"line": "To be, or not to be"}, {"line": "that is the question"}],
        [{"line": "Whether 'tis nobler in the mind to suffer"}],
        [{"line": "The slings and arrows"}, {"line": "to be or not"}],
    ],
    schema="line string",
)


class Normalise(hr.Operator):
    words = hr.InputPort()
    out = hr.OutputPort("word string")

    def process(self, record: dict) -> None:
        word = record["word"].strip(",.'").lower()
        if word:
            self.out.emit({"word": word})


class RunningCount(hr.Bolt):
    declare_output_fields = "word string, count long"

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def process(self, tuple: hr.Tuple) -> None:
        word = tuple.get_string("word")
        self.counts[word] = self.counts.get(word, 0) + 1
        self.emit([word, self.counts[word]], anchors=tuple)


class Milestones(hr.Operator):
    counts = hr.InputPort()
    reached = hr.OutputPort("window long, word string, count long")

    def begin_window(self, window_id: int) -> None:
        self.window, self.seen = window_id, {}

    def process(self, record: hr.Tuple) -> None:  # a bolt's tuples: record["word"] works as on a dict
        if record["count"] % 3 == 0:
            self.seen[record["word"]] = record["count"]

    def end_window(self) -> None:
        for word, count in sorted(self.seen.items()):
            self.reached.emit({"window": self.window, "word": word, "count": count})


pipeline = hr.Pipeline("storm_mixed")
words = pipeline.source("lines", LINES).flat_map(lambda r: [{"word": w} for w in r["line"].split()],
                                                 schema="word string", name="split")
normalise = pipeline.add_operator("normalise", Normalise(), partitions=2)
pipeline.add_stream("words", words, normalise.words)
builder = hr.TopologyBuilder(pipeline)
builder.set_bolt("count", RunningCount(), parallelism=2).fields_grouping("normalise", ["word"], stream="out")
milestones = pipeline.add_operator("milestones", Milestones())
pipeline.add_stream("counts", builder.port("count"), milestones.counts)
(milestones.reached.stream()
 .map(lambda r: {"report": f"{r['word']} x{r['count']}"}, schema="report string", name="format")
 .sink("reports", TestSink()))

if __name__ == "__main__":
    out = run_to_completion(pipeline)
    for row in out["reports"]:
        print(row["report"])
