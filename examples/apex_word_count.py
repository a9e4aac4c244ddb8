"""Apex's word count as headrace operators: a splitter and a counter with two partitions each,
the counter's partitions merged per window by a unifier, counting per application window.

    python examples/apex_word_count.py

Each micro-batch of the test source is one streaming window. With ``application_window=2`` the
counter begins a window every two streaming windows and emits the words it counted at its end
(the last one ends with the input). The output is the same with one partition as with two.
"""

from __future__ import annotations

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

LINES = [
    [{"line": "the quick brown fox"}, {"line": "jumps over the lazy dog"}],
    [{"line": "the dog sleeps"}],
    [{"line": "a quick fox"}, {"line": "and a lazy fox"}],
    [{"line": "the end"}],
    [{"line": "of the story"}],
]


class Splitter(hr.Operator):
    lines = hr.InputPort()
    words = hr.OutputPort("word string")

    def process(self, record):
        for word in record["line"].split():
            self.words.emit({"word": word})


class MergeCounts(hr.Unifier):
    """Adds up each word's counts from the counter's partitions, once per window."""

    output = hr.OutputPort("window long, word string, count long")

    def begin_window(self, window_id):
        self.merged = {}

    def process(self, record):
        key = (record["window"], record["word"])
        self.merged[key] = self.merged.get(key, 0) + record["count"]

    def end_window(self):
        for (window, word), count in sorted(self.merged.items()):
            self.output.emit({"window": window, "word": word, "count": count})


class Counter(hr.Operator):
    words = hr.InputPort()
    counts = hr.OutputPort("window long, word string, count long", unifier=MergeCounts())

    def begin_window(self, window_id):
        self.first_window, self.counted = window_id, {}

    def process(self, record):
        self.counted[record["word"]] = self.counted.get(record["word"], 0) + 1

    def end_window(self):
        for word, count in sorted(self.counted.items()):
            self.counts.emit({"window": self.first_window, "word": word, "count": count})


def word_count(partitions: int = 2, application_window: int = 2) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline("apex_word_count")
    lines = p.source("lines", TestSource(LINES, schema="line string"))
    split = p.add_operator("split", Splitter(), partitions=partitions)
    count = p.add_operator("count", Counter(), partitions=partitions, application_window=application_window)
    p.add_stream("lines_in", lines, split.lines)
    p.add_stream("words", split.words, count.words, grouping=hr.groupings.Fields("word"))
    sink = TestSink()
    count.counts.stream(name="counts").sink("out", sink)
    return p, sink


pipeline, _ = word_count()


def report(rows: list[dict]) -> list[str]:
    windows: dict[int, list[str]] = {}
    for row in rows:
        windows.setdefault(row["window"], []).append(f"{row['word']}={row['count']}")
    return [f"from window {window}: {' '.join(sorted(counts))}" for window, counts in sorted(windows.items())]


if __name__ == "__main__":
    for partitions in (1, 2):
        p, sink = word_count(partitions)
        run_to_completion(p)
        print(f"{partitions} partition(s):")
        for line in report(sink.rows()):
            print(f"  {line}")
