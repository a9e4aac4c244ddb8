"""Word count through headrace's front doors against hand-written PySpark, in one run.

    .venv/bin/python benchmarks/word_count.py               # the full benchmark (about 10 minutes)
    .venv/bin/python benchmarks/word_count.py --only fluent sql   # the native forms alone
    .venv/bin/python benchmarks/word_count.py --quick       # a smoke run on small data

The input is JSON lines ``{"line": "..."}`` of 4 to 10 words drawn from 1,000 words
(deterministic), in 10 files: ``--lines`` (2,000,000) for the native forms and
``--python-lines`` (100,000) for the forms whose every word goes through Python, each form
against hand-written PySpark run on the same input. A native run over 2,000,000 lines takes
about 2 s; with fewer lines the run-to-run spread (JIT, other processes) swamps the gap being
measured. Every form reads the files with Spark's own file source and keeps a running count
per word, emitting each batch the counts of the words it touched (update mode), into a sink
that discards them:

* **hand-written**: ``spark.readStream.schema("line string").json(folder)
  .select(explode(split(line, " ")).alias("word")).groupBy("word").count()`` into ``noop``,
  output mode update: what a PySpark user writes.
* **fluent**: ``Files(folder, reader="spark")`` -> ``select(word=hr.expr("explode(split(line, ' '))"))``
  -> ``key_by("word").count()`` -> ``hr.sinks.Null()``: native Spark all the way (eligible for
  the target).
* **operator**: the same files -> an Apex-style splitter operator -> a counter operator (running
  totals per word, its state) with a fields grouping, 2 partitions each -> ``Null``: every word
  crosses into Python and back (not native-eligible).
* **sql**: the same files -> ``p.sql("SELECT word, count(*) AS count FROM (SELECT explode(split(line,
  ' ')) AS word FROM lines) GROUP BY word")`` -> ``Null``: Spark SQL, native (eligible for the target).
* **storm**: the same files as a spout -> a split bolt (2 tasks, shuffle grouping) -> a count bolt
  (2 tasks, fields grouping on ``word``, running totals as task state, emitting each window the
  totals of the words it touched) -> ``Null``: like the operator form, every word crosses into Python.

Before timing, each form runs once on 2,000 lines into a collecting sink and its final counts
must equal the counts computed here in Python; the benchmark fails otherwise. Throughput (lines
per second) is measured from Spark's progress reports, from the start of the first micro-batch
to the end of the last one that read input, the same way for every form; ``--runs`` runs of
each alternate (the order rotates each run) after one unmeasured warm-up run each. The closing
line is ``word-count ratio operator=<a> storm=<b> fluent=<c> sql=<d>``: each form's median
throughput divided by hand-written PySpark's; the target is 0.9 for the native-eligible forms
(fluent, sql).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import functions as F  # noqa: E402

import headrace as hr  # noqa: E402
from benchmarks.common import Print, fresh_dir, processing_seconds  # noqa: E402
from headrace.environment.session import get_session  # noqa: E402
from headrace.runtime.runner import PipelineRun  # noqa: E402

VOCABULARY = [f"w{n:03d}" for n in range(1000)]
FILES = 10
TARGET = 0.9
NATIVE_ELIGIBLE = ("fluent", "sql")
SETTLE_TIMEOUT_S = 600


def write_input(folder: str, lines: int, seed: int = 7) -> Counter:
    """``lines`` lines in ``FILES`` files; the word counts they hold."""
    rng = random.Random(seed)
    counts: Counter = Counter()
    os.makedirs(folder, exist_ok=True)
    per_file = -(-lines // FILES)
    for number in range(FILES):
        rows = []
        for _ in range(min(per_file, lines - number * per_file)):
            words = [rng.choice(VOCABULARY) for _ in range(rng.randint(4, 10))]
            counts.update(words)
            rows.append(json.dumps({"line": " ".join(words)}))
        with open(os.path.join(folder, f"part-{number:02d}.jsonl"), "w") as out:
            out.write("\n".join(rows) + "\n")
    return counts


# -- the forms -----------------------------------------------------------------------------------

class Splitter(hr.Operator):
    lines = hr.InputPort()
    words = hr.OutputPort()

    def process(self, record: dict) -> None:
        for word in record["line"].split():
            self.words.emit({"word": word})


class RunningCount(hr.Operator):
    words = hr.InputPort()
    counts = hr.OutputPort("word string, count long")

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}

    def begin_window(self, window_id: int) -> None:
        self.touched: set[str] = set()

    def process(self, record: dict) -> None:
        word = record["word"]
        self.totals[word] = self.totals.get(word, 0) + 1
        self.touched.add(word)

    def end_window(self) -> None:
        for word in self.touched:
            self.counts.emit({"word": word, "count": self.totals[word]})


class StormSplit(hr.Bolt):
    declare_output_fields = ("word",)

    def process(self, tuple: Any) -> None:
        for word in tuple.get_string("line").split():
            self.emit([word])


class StormCount(hr.Bolt):
    declare_output_fields = "word string, count long"

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def begin_window(self, window_id: int) -> None:
        self.touched: set[str] = set()

    def process(self, tuple: Any) -> None:
        word = tuple.get_string("word")
        self.counts[word] = self.counts.get(word, 0) + 1
        self.touched.add(word)

    def end_window(self) -> None:
        for word in self.touched:
            self.emit([word, self.counts[word]])


def storm(folder: str, sink: Any) -> hr.Pipeline:
    builder = hr.TopologyBuilder("wc_storm")
    builder.set_spout("lines", hr.sources.Files(folder, "jsonl", "line string", reader="spark"))
    builder.set_bolt("split", StormSplit(), parallelism=2).shuffle_grouping("lines")
    builder.set_bolt("count", StormCount(), parallelism=2).fields_grouping("split", ["word"])
    builder.stream("count", name="counts").sink("out", sink)
    return builder.create_topology()


def fluent(folder: str, sink: Any) -> hr.Pipeline:
    p = hr.Pipeline("wc_fluent")
    lines = p.source("lines", hr.sources.Files(folder, "jsonl", "line string", reader="spark"))
    words = lines.select(word=hr.expr("explode(split(line, ' '))"), name="split")
    words.key_by("word").count(name="counts").sink("out", sink)
    return p


def operator(folder: str, sink: Any) -> hr.Pipeline:
    p = hr.Pipeline("wc_operator")
    lines = p.source("lines", hr.sources.Files(folder, "jsonl", "line string", reader="spark"))
    split = p.add_operator("split", Splitter(), partitions=2)
    count = p.add_operator("count", RunningCount(), partitions=2)
    p.add_stream("lines_in", lines, split.lines)
    p.add_stream("words", split.words, count.words, grouping=hr.groupings.Fields("word"))
    count.counts.stream(name="counts").sink("out", sink)
    return p


def sql(folder: str, sink: Any) -> hr.Pipeline:
    p = hr.Pipeline("wc_sql")
    p.source("lines", hr.sources.Files(folder, "jsonl", "line string", reader="spark"))
    counts = p.sql("SELECT word, count(*) AS count FROM (SELECT explode(split(line, ' ')) AS word FROM lines) "
                   "GROUP BY word", name="counts")
    counts.sink("out", sink)
    return p


FORMS: dict[str, Callable[[str, Any], hr.Pipeline]] = {"operator": operator, "storm": storm, "fluent": fluent,
                                                       "sql": sql}
ORDER = ("operator", "storm", "fluent", "sql")


def hand_written(spark: Any, folder: str, checkpoint: str, memory: str | None = None) -> list[dict[str, Any]]:
    counts = (spark.readStream.schema("line string").json(folder)
              .select(F.explode(F.split("line", " ")).alias("word")).groupBy("word").count())
    writer = counts.writeStream.outputMode("update").option("checkpointLocation", checkpoint)
    query = (writer.format("memory").queryName(memory) if memory else writer.format("noop")).start()
    try:
        query.processAllAvailable()
        return [dict(p) for p in query.recentProgress]
    finally:
        query.stop()


def run_form(build: Callable[[str, Any], hr.Pipeline], folder: str, workdir: str, sink: Any, lines: int) -> list:
    """Run a headrace form until it has read ``lines`` lines; its progress reports."""
    run = PipelineRun(build(folder, sink), state_dir=fresh_dir(workdir, "headrace"), progress="quiet").start()
    deadline = time.time() + SETTLE_TIMEOUT_S
    try:
        while sum(p.get("numInputRows") or 0 for p in run.progress_log) < lines:
            if time.time() > deadline:
                raise RuntimeError(f"the pipeline did not read {lines:,} lines within {SETTLE_TIMEOUT_S} s")
            run.settle()
            time.sleep(0.05)
        run.settle()
    finally:
        run.request_stop("benchmark done")
    return run.wait(until_exhausted=False).progress


def check_forms(spark: Any, workdir: str, forms: tuple[str, ...], say: Print) -> None:
    """Each form's final counts on 2,000 lines equal the counts computed in Python."""
    from headrace.testing import TestSink

    folder = os.path.join(workdir, "check")
    expected = write_input(folder, 2000, seed=11)
    table = "wc_check_hand_written"
    hand_written(spark, folder, fresh_dir(workdir, "check_spark"), memory=table)
    got = {r["word"]: r["count"] for r in spark.table(table).collect()}
    if got != dict(expected):
        raise RuntimeError("hand-written PySpark's counts differ from Python's")
    for name in forms:
        sink = TestSink()
        run_form(FORMS[name], folder, workdir, sink, 2000)
        final: dict[str, int] = {}
        for row in sink.rows():
            final[row["word"]] = row["count"]  # running counts: the last update of a word wins
        if final != dict(expected):
            raise RuntimeError(f"{name}: its counts differ from Python's")
    say(f"every form's counts equal Python's on 2,000 lines ({', '.join(['hand-written', *forms])})")


def measure_input(spark: Any, workdir: str, lines: int, forms: tuple[str, ...], runs: int, warm_up: bool,
                  say: Print) -> dict[str, float]:
    """Each of ``forms`` and hand-written PySpark on one input of ``lines`` lines: each form's
    median throughput divided by hand-written PySpark's on the same input."""
    folder = os.path.join(workdir, f"input-{lines}")
    words = sum(write_input(folder, lines).values())
    say(f"input: {lines:,} lines, {words:,} words, {FILES} files ({', '.join(forms)})")
    names = ["hand-written", *forms]

    def once(name: str) -> float:
        if name == "hand-written":
            progress = hand_written(spark, folder, fresh_dir(workdir, "spark"))
        else:
            progress = run_form(FORMS[name], folder, workdir, hr.sinks.Null(), lines)
        read = sum(p.get("numInputRows") or 0 for p in progress)
        if read != lines:
            raise RuntimeError(f"{name} read {read:,} lines, not {lines:,}")
        return lines / processing_seconds(progress)

    for name in names if warm_up else ():
        once(name)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for number in range(runs):
        order = names[number % len(names):] + names[:number % len(names)]
        for name in order:
            rates[name].append(once(name))
            say(f"  run {number + 1}  {name:13} {rates[name][-1]:>11,.0f} lines/s  load {os.getloadavg()[0]:.1f}")
    medians = {name: statistics.median(values) for name, values in rates.items()}
    for name in names:
        say(f"  {name:13} median {medians[name]:>11,.0f} lines/s")
    return {name: medians[name] / medians["hand-written"] for name in forms}


def measure(spark: Any, lines: dict[str, int], runs: int, warm_up: bool, say: Print) -> dict[str, float]:
    """The ratio of each form in ``lines`` (form -> lines of its input); forms with the same
    number of lines share an input and their hand-written runs."""
    workdir = tempfile.mkdtemp(prefix="headrace-word-count-")
    try:
        check_forms(spark, workdir, tuple(lines), say)
        ratios: dict[str, float] = {}
        for size in sorted(set(lines.values()), reverse=True):
            forms = tuple(name for name in lines if lines[name] == size)
            ratios.update(measure_input(spark, workdir, size, forms, runs, warm_up, say))
        return ratios
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, help="lines of input of the native forms, fluent and sql "
                        "(default 2,000,000; --quick 5,000)")
    parser.add_argument("--python-lines", type=int, help="lines of input of the forms whose words go through "
                        "Python, operator and storm (default 100,000; --quick 5,000)")
    parser.add_argument("--runs", type=int, default=7, help="measured runs of each form (default 7)")
    parser.add_argument("--quick", action="store_true", help="small data, one run, no warm-up: a smoke run")
    parser.add_argument("--only", nargs="+", choices=ORDER, metavar="FORM",
                        help=f"measure only these forms against hand-written PySpark (of {', '.join(ORDER)})")
    args = parser.parse_args(argv)
    native_lines = args.lines or (5_000 if args.quick else 2_000_000)
    python_lines = args.python_lines or (5_000 if args.quick else 100_000)
    forms = tuple(name for name in ORDER if not args.only or name in args.only)
    lines = {name: native_lines if name in NATIVE_ELIGIBLE else python_lines for name in forms}
    spark = get_session()
    say: Print = lambda text: print(text, flush=True)  # noqa: E731
    say(f"word count, {spark.version}, {os.cpu_count()} cores")
    ratios = measure(spark, lines, 1 if args.quick else args.runs, not args.quick, say)
    for name in NATIVE_ELIGIBLE:
        if name in ratios:
            say(f"  {name}: target >= {TARGET}: {'met' if ratios[name] >= TARGET else 'MISSED'}")
    print("word-count ratio " + " ".join(f"{name}={ratios[name]:.2f}" for name in forms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
