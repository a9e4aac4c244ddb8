"""Storm's RollingTopWords: rolling word counts over 9 s, ranked every 3 s by tick tuples.

    python examples/storm_rolling_top_words.py

``counter`` (fields grouping on ``word``) keeps each word's counts in three 3-second slots and,
on each tick tuple, emits every word's count over the last 9 s and starts a new slot (a word
that left the window is emitted once more with 0). ``intermediate`` (fields grouping on
``obj``, two tasks) keeps the top 3 of the words it gets and emits them on each tick;
``total`` (global grouping) merges those into the top 3 and emits it on each tick. The bolts
set ``tick_every = "3s"``; the test kit's clock (``ProcessingTime`` markers) is their
processing time here, so the ticks, and the output, are the same in every run.
"""

import headrace as hr
from headrace.testing import ProcessingTime, TestSink, TestSource, run_to_completion

TOP_N = 3


def words(text: str) -> list[dict]:
    return [{"word": w} for w in text.split()]


WORDS = TestSource(
    [
        words("storm spark storm flink"),  # clock 0
        ProcessingTime(3_000),
        words("spark spark apex"),
        ProcessingTime(6_000),
        words("storm heron"),
        ProcessingTime(9_000),
        ProcessingTime(12_000),
        ProcessingTime(15_000),
    ],
    schema="word string",
)


def ranked(counts: dict[str, int]) -> list[tuple[str, int]]:
    """The top ``TOP_N`` words by count (ties by word)."""
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:TOP_N]


class RollingCountBolt(hr.Bolt):
    declare_output_fields = ("obj", "count")
    tick_every = "3s"

    def __init__(self, slots: int = 3) -> None:
        self.slots, self.head = slots, 0
        self.counts: dict[str, list[int]] = {}  # word -> its count in each slot

    def process(self, tuple: hr.Tuple) -> None:
        if tuple.is_tick():  # emit the window's counts, then start a new slot (Storm's SlidingWindowCounter)
            for word, slots in sorted(self.counts.items()):
                self.emit([word, sum(slots)])
            self.counts = {w: s for w, s in self.counts.items() if sum(s)}
            self.head = (self.head + 1) % self.slots
            for slots in self.counts.values():
                slots[self.head] = 0
        else:
            slots = self.counts.setdefault(tuple.get_string("word"), [0] * self.slots)
            slots[self.head] += 1


class IntermediateRankingsBolt(hr.Bolt):
    declare_output_fields = ("rankings",)
    tick_every = "3s"

    def __init__(self) -> None:
        self.rankings: dict[str, int] = {}

    def process(self, tuple: hr.Tuple) -> None:
        if tuple.is_tick():
            self.emit([ranked(self.rankings)])
        else:
            self.rankings[tuple.get_string("obj")] = tuple.get_integer("count")
            self.rankings = dict(ranked(self.rankings))


class TotalRankingsBolt(hr.Bolt):
    declare_output_fields = "time long, rank int, word string, count long"
    tick_every = "3s"

    def __init__(self) -> None:
        self.rankings: dict[str, int] = {}

    def process(self, tuple: hr.Tuple) -> None:
        if tuple.is_tick():
            for rank, (word, count) in enumerate(ranked(self.rankings), start=1):
                self.emit([tuple.get_integer("time_ms"), rank, word, count])
        else:
            self.rankings.update(tuple.get_value("rankings"))
            self.rankings = {w: c for w, c in ranked(self.rankings) if c > 0}


builder = hr.TopologyBuilder("storm_rolling_top_words")
builder.set_spout("word", WORDS)
builder.set_bolt("counter", RollingCountBolt(), parallelism=2).fields_grouping("word", ["word"])
builder.set_bolt("intermediate", IntermediateRankingsBolt(), parallelism=2).fields_grouping("counter", ["obj"])
builder.set_bolt("total", TotalRankingsBolt()).global_grouping("intermediate")
builder.stream("total").sink("top", TestSink())
pipeline = builder.create_topology()

if __name__ == "__main__":
    out = run_to_completion(pipeline)
    rankings: dict[int, list[str]] = {}
    for row in out["top"]:
        rankings.setdefault(row["time"], []).append(f"{row['word']} {row['count']}")
    for time, top in sorted(rankings.items()):
        print(f"{time // 1000:>2}s: {', '.join(top)}")
