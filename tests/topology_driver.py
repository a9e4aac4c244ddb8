"""A driver process for tests/test_topology.py: a Storm word count, spout -> bolts -> files, until
its input ends or SIGTERM.

    python tests/topology_driver.py '{"name": ..., "state_dir": ..., "out": ..., "acks": ...}'

``SentenceSpout`` emits ``SENTENCES`` (numbered: a sentence is ``s<n> w..``), four per micro-batch,
each with its number as the message id, and appends the id of each tuple it is told to ``ack``
to the file ``acks``. ``split`` (two tasks, shuffle) splits sentences into words; ``count``
(two tasks, fields grouping on ``word``) keeps each word's running count, its state, and emits
the word, its count so far and its task. The test kills this process with SIGKILL and restarts it.
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr

SENTENCES = [" ".join(f"w{(i * 7 + j * 3) % 11}" for j in range(i % 4 + 3)) for i in range(40)]


class SentenceSpout(hr.Spout):
    declare_output_fields = "number long, sentence string"
    bounded = True

    def __init__(self, acks: str) -> None:
        self.acks, self.next = acks, 0

    def next_tuple(self) -> None:
        if self.next < len(SENTENCES):
            self.emit([self.next, SENTENCES[self.next]], msg_id=self.next)
            self.next += 1

    def ack(self, msg_id: int) -> None:
        with open(self.acks, "a") as out:
            out.write(f"{msg_id}\n")


class Split(hr.Bolt):
    declare_output_fields = ("word",)

    def process(self, tuple: hr.Tuple) -> None:
        for word in tuple.get_string("sentence").split():
            self.emit([word], anchors=tuple)


class Count(hr.Bolt):
    declare_output_fields = "word string, count long, task int"

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def process(self, tuple: hr.Tuple) -> None:
        word = tuple.get_string("word")
        self.counts[word] = self.counts.get(word, 0) + 1
        self.emit([word, self.counts[word], self.task], anchors=tuple)

    def prepare(self, context: hr.TopologyContext) -> None:
        self.task = context.task_index


def pipeline(args: dict) -> hr.Pipeline:
    builder = hr.TopologyBuilder(args["name"])
    builder.set_spout("sentences", SentenceSpout(args["acks"]), max_tuples_per_batch=4)
    builder.set_bolt("split", Split(), parallelism=2).shuffle_grouping("sentences")
    builder.set_bolt("count", Count(), parallelism=2).fields_grouping("split", ["word"])
    builder.stream("count").sink("out", hr.sinks.Files(args["out"], format="jsonl"))
    return builder.create_topology()


if __name__ == "__main__":
    driver_main(pipeline)
