"""Storm's WordCountTopology: sentences split into words, counted by word with a fields grouping.

    python examples/storm_word_count.py

``split`` (two tasks, shuffle grouping) splits each sentence; ``count`` (two tasks) gets each
word from the ``split`` tasks through a fields grouping on ``word``: a stable hash, so a word
always goes to the same task, in every run, and its running count lives in that task's state.
``count`` emits the word's count each time it sees it, with its task index.
"""

import headrace as hr
from headrace.testing import TestSink, run_to_completion

SENTENCES = [
    "the cow jumped over the moon",
    "an apple a day keeps the doctor away",
    "four score and seven years ago",
    "snow white and the seven dwarfs",
    "i am at two with nature",
]


class SentenceSpout(hr.Spout):
    declare_output_fields = "sentence string"
    bounded = True

    def __init__(self) -> None:
        self.next = 0

    def next_tuple(self) -> None:
        if self.next < len(SENTENCES):
            self.emit([SENTENCES[self.next]], msg_id=self.next)
            self.next += 1


class SplitSentence(hr.Bolt):
    declare_output_fields = ("word",)  # untyped: it only feeds another bolt

    def process(self, tuple: hr.Tuple) -> None:
        for word in tuple.get_string("sentence").split():
            self.emit([word], anchors=tuple)


class WordCount(hr.Bolt):
    declare_output_fields = "word string, count long, task int"

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # this task's state

    def prepare(self, context: hr.TopologyContext) -> None:
        self.task = context.task_index

    def process(self, tuple: hr.Tuple) -> None:
        word = tuple.get_string("word")
        self.counts[word] = self.counts.get(word, 0) + 1
        self.emit([word, self.counts[word], self.task], anchors=tuple)


builder = hr.TopologyBuilder("storm_word_count")
builder.set_spout("sentences", SentenceSpout(), max_tuples_per_batch=2)
builder.set_bolt("split", SplitSentence(), parallelism=2).shuffle_grouping("sentences")
builder.set_bolt("count", WordCount(), parallelism=2).fields_grouping("split", ["word"])
builder.stream("count").sink("counts", TestSink())
pipeline = builder.create_topology()

if __name__ == "__main__":
    out = run_to_completion(pipeline)
    final: dict[str, tuple[int, int]] = {}
    for row in out["counts"]:
        final[row["word"]] = (row["count"], row["task"])
    for word, (count, task) in sorted(final.items()):
        if count > 1:
            print(f"{word}: {count} (task {task})")
