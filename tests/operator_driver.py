"""A driver process for tests/test_operator_api.py: files -> Apex operators -> files, until SIGTERM.

    python tests/operator_driver.py '{"name": ..., "input": ..., "state_dir": ..., "out": ...}'

Each micro-batch (streaming window) reads one file. ``split`` (2 partitions) splits lines into
words; ``count`` (2 partitions, fields grouping) keeps running totals per word, its state, and
emits the totals of the words a window saw; its output port's unifier numbers the windows it
has merged, its own state. The test kills this process with SIGKILL and restarts it.
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr


class Split(hr.Operator):
    lines = hr.InputPort()
    words = hr.OutputPort()

    def process(self, record):
        for word in record["line"].split():
            self.words.emit({"word": word})


class Numbered(hr.Unifier):
    output = hr.OutputPort("window long, word string, total long, merged long")

    def __init__(self):
        self.merged = 0

    def begin_window(self, window_id):
        self.merged += 1

    def process(self, record):
        self.output.emit({**record, "merged": self.merged})


class RunningTotals(hr.Operator):
    words = hr.InputPort()
    totals = hr.OutputPort("window long, word string, total long", unifier=Numbered())

    def __init__(self):
        self.counts = {}

    def begin_window(self, window_id):
        self.window, self.seen = window_id, set()

    def process(self, record):
        self.counts[record["word"]] = self.counts.get(record["word"], 0) + 1
        self.seen.add(record["word"])

    def end_window(self):
        for word in sorted(self.seen):
            self.totals.emit({"window": self.window, "word": word, "total": self.counts[word]})


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    lines = p.source("lines", hr.sources.Files(args["input"], "jsonl", "line string", max_files_per_batch=1))
    split = p.add_operator("split", Split(), partitions=2)
    count = p.add_operator("count", RunningTotals(), partitions=2)
    p.add_stream("lines_in", lines, split.lines)
    p.add_stream("words", split.words, count.words, grouping=hr.groupings.Fields("word"))
    count.totals.stream(name="totals").sink("out", hr.sinks.Files(args["out"], format="jsonl"))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
