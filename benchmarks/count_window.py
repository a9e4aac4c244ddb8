"""Count windows: headrace against the same logic hand-written with ``transformWithStateInPandas``.

    .venv/bin/python benchmarks/count_window.py            # the full benchmark (about 4 minutes)
    .venv/bin/python benchmarks/count_window.py --quick    # a smoke run on small data (under a minute)

Both pipelines run in the same process, on one Spark session (headrace's: RocksDB state
store), read the same deterministic ``Generator("ysb")`` Python data source and write to
Spark's ``noop`` sink:

    ad events -> per ad_id, a tumbling count window of 100 events -> one row per window
                 (ad_id, window_start, window_end, pane_kind, pane_index, count)

* **headrace**: ``key_by("ad_id").window(hr.Count(100)).count()`` into the ``Null`` sink.
  headrace runs count windows on ``transformWithStateInPandas`` grouped by operator
  instance (8 by default), each instance keeping the state of all its keys in one cell.
* **hand-written**: ``select("ad_id").groupBy("ad_id").transformWithStateInPandas(CountWindow(100))``, a
  ``StatefulProcessor`` that keeps, per key, the count of the open window and the number
  of windows emitted in one value state, and emits a row for every 100 records of the key.

Throughput (events/s): a bounded input of ``--events`` events in micro-batches of
``--rows-per-batch``, measured from the query's progress reports, the same way for both:
from the start of the first micro-batch to the end of the last one that read input. After
one unmeasured warm-up run of each (200,000 events), ``--runs`` runs of each pipeline
alternate (hand-written first, then headrace first, ...); the table shows each pipeline's
median and the median of the ratios of the runs made one after the other, in events per
second of wall clock and per CPU-second (Spark's JVM, its Python workers and this process). Every run must write the
number of windows the input holds (computed from the generator's events here); the
benchmark fails if either pipeline writes another number.

The last line is ``count-window ratio=<x>``: headrace's throughput divided by the
hand-written pipeline's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pandas as pd  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.streaming import StatefulProcessor  # noqa: E402

import headrace as hr  # noqa: E402
from benchmarks.common import (  # noqa: E402
    CpuClock,
    Print,
    Throughput,
    alternating,
    fresh_dir,
    output_rows,
    processing_seconds,
)
from headrace.connectors.base import CONTROL_COLUMN, SourceContext  # noqa: E402
from headrace.connectors.generator import Generator, generate  # noqa: E402
from headrace.connectors.null_sink import Null  # noqa: E402
from headrace.runtime.runner import PipelineRun  # noqa: E402

SOURCE_NAME = "ad_events"  # the headrace pipeline's source step name; the hand-written one uses the same
PIPELINES = ("hand", "headrace")
LABELS = {"hand": "hand-written PySpark", "headrace": "headrace"}
TARGET = 0.9


@dataclass(frozen=True)
class Config:
    events: int = 600_000
    rows_per_batch: int = 100_000
    size: int = 100  # records per count window
    key: str = "ad_id"  # 1,000 ads; "user_id" has 100,000 users
    runs: int = 5
    warmup_events: int = 200_000  # events in the warm-up run of each pipeline (0: none)


QUICK = Config(events=15_000, rows_per_batch=15_000, size=5, runs=1, warmup_events=0)


# ----------------------------------------------------------------------------------------------
# The two pipelines.

def headrace_pipeline(config: Config, events: int, name: str) -> hr.Pipeline:
    p = hr.Pipeline(name)
    (p.source(SOURCE_NAME, hr.sources.Generator("ysb", limit=events, rows_per_batch=config.rows_per_batch))
     .key_by(config.key)
     .window(hr.Count(config.size), name="count_window")
     .count()
     .sink("windows", Null()))
    return p


class CountWindow(StatefulProcessor):
    """A tumbling count window per grouping key: one row for every ``size`` records of the key.

    The state of a key is one value: the records counted in its open window and the number of
    windows it has emitted (the next row's ``pane_index``).
    """

    def __init__(self, key: str, size: int) -> None:
        self.key, self.size = key, size

    def init(self, handle: Any) -> None:
        self.window = handle.getValueState("window", "records bigint, emitted bigint")

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        records, emitted = self.window.get() if self.window.exists() else (0, 0)
        records += sum(len(frame) for frame in rows)
        windows = records // self.size
        if windows:
            yield pd.DataFrame({self.key: [key[0]] * windows, "window_start": [None] * windows,
                                "window_end": [None] * windows, "pane_kind": ["count"] * windows,
                                "pane_index": list(range(emitted, emitted + windows)), "count": [self.size] * windows})
        self.window.update((records - windows * self.size, emitted + windows))

    def close(self) -> None:
        pass


def handwritten_count_window(spark: SparkSession, generator: Generator, run_dir: str, key: str,
                             size: int) -> DataFrame:
    """The count window in plain PySpark, reading the same Python data source as headrace.

    The source emits a control row at the end of a bounded input (``_hr_ctl`` set, every
    data column null): a plain pipeline just drops it. Only the key goes to the processor:
    ``transformWithStateInPandas`` ships every column of its input to Python, and counting
    needs none but the key (with all seven columns it ran at about 0.7 of this throughput).
    """
    # Spark's Python workers cannot import this file: send them CountWindow's code, not its name.
    cloudpickle.register_pickle_by_value(sys.modules[CountWindow.__module__])
    data_source: Any = generator.data_source()
    spark.dataSource.register(data_source)
    raw = (spark.readStream.format(data_source.name())
           .options(**generator.options(), **SourceContext(run_dir, SOURCE_NAME).options()).load())
    events = raw.filter(F.col(CONTROL_COLUMN).isNull()).select(key)
    schema = (f"{key} string, window_start timestamp, window_end timestamp, pane_kind string, pane_index bigint, "
              "count bigint")
    return events.groupBy(key).transformWithStateInPandas(
        statefulProcessor=CountWindow(key, size), outputStructType=schema, outputMode="Append", timeMode="None")


def expected_windows(config: Config, events: int) -> int:
    """The windows the input holds: for each key, its number of events divided by the size, rounded down."""
    if events == 0:
        return 0
    column = generate("ysb", 0, events).column(config.key)
    counts = pc.value_counts(column).field("counts").to_pylist()
    return sum(count // config.size for count in counts)


# ----------------------------------------------------------------------------------------------
# Measurements.

def handwritten_throughput(spark: SparkSession, config: Config, events: int, workdir: str) -> Throughput:
    root = fresh_dir(workdir, "hand")
    generator = Generator("ysb", limit=events, rows_per_batch=config.rows_per_batch)
    df = handwritten_count_window(spark, generator, os.path.join(root, "run"), config.key, config.size)
    query = (df.writeStream.queryName("hand_count_window").format("noop").outputMode("append")
             .option("checkpointLocation", os.path.join(root, "checkpoint")).start())
    try:
        query.processAllAvailable()
        progress = [dict(p) for p in query.recentProgress]
    finally:
        query.stop()
    return Throughput(events, processing_seconds(progress), len(progress), output_rows=output_rows(progress))


def headrace_throughput(spark: SparkSession, config: Config, events: int, workdir: str) -> Throughput:
    root = fresh_dir(workdir, "headrace")
    run = PipelineRun(headrace_pipeline(config, events, "headrace_count_window"), state_dir=root,
                      progress="quiet", fresh=True).start()
    result = run.wait()
    return Throughput(events, processing_seconds(result.progress), len(result.progress),
                      output_rows=output_rows(result.progress))


RUNS = {"hand": handwritten_throughput, "headrace": headrace_throughput}


def checked(who: str, t: Throughput, expected: int) -> Throughput:
    if t.output_rows != expected:
        raise RuntimeError(f"{LABELS[who]} wrote {t.output_rows:,} windows; the input holds {expected:,}: "
                           "the two pipelines do not compute the same thing")
    return t


# ----------------------------------------------------------------------------------------------
# The benchmark.

@dataclass
class Results:
    runs: dict[str, list[Throughput]] = field(default_factory=dict)  # pipeline -> its measured runs

    def median_rate(self, who: str, *, cpu: bool = False) -> float:
        return statistics.median(t.cpu_rate if cpu else t.rate for t in self.runs[who])

    def ratios(self, *, cpu: bool = False) -> list[float]:
        """headrace / hand-written for each pair of runs made one after the other."""
        return [(ours.cpu_rate / hand.cpu_rate) if cpu else (ours.rate / hand.rate)
                for ours, hand in zip(self.runs["headrace"], self.runs["hand"])]

    def ratio(self, *, cpu: bool = False) -> float:
        """The median of the ratios of the runs made one after the other."""
        return statistics.median(self.ratios(cpu=cpu))


def run_benchmark(spark: SparkSession, config: Config, out: Print = print, workdir: str | None = None) -> Results:
    """Run the benchmark, print each run, the table and the closing line; return the figures."""
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="headrace-count-window-")
    results, clock = Results(), CpuClock(spark)
    try:
        out(f"Count windows: headrace against hand-written PySpark, Spark {spark.version} "
            f"{spark.sparkContext.master}, shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, "
            f"{os.cpu_count()} cores")
        expected = expected_windows(config, config.events)
        out(f"{config.events:,} ysb events, micro-batches of {config.rows_per_batch:,}, a tumbling count window of "
            f"{config.size} per {config.key}, noop sink, {config.runs} runs of each, alternating; "
            f"the input holds {expected:,} windows")
        # Warm-up runs, not measured: Python workers, the generator's string pools, the JIT.
        warm_up = min(config.warmup_events, config.events)
        for who in PIPELINES if warm_up else ():
            checked(who, RUNS[who](spark, config, warm_up, workdir), expected_windows(config, warm_up))
        for number, order in enumerate(alternating(PIPELINES, config.runs), start=1):
            for who in order:
                cpu = clock.seconds()
                t = checked(who, RUNS[who](spark, config, config.events, workdir), expected)
                t.cpu_seconds, t.load = clock.seconds() - cpu, os.getloadavg()[0]
                results.runs.setdefault(who, []).append(t)
                out(f"  run {number}  {LABELS[who]:21} {t.rate:>9,.0f} events/s  {t.seconds:6.2f} s  "
                    f"{t.batches} batches  {t.output_rows:,} windows  {t.cpu_rate:>8,.0f} events/CPU-s  "
                    f"load {t.load:.1f}")
        report(results, out)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def report(results: Results, out: Print = print) -> None:
    """The table, the target and the closing line ``count-window ratio=<x>``."""
    hand, ours = results.runs["hand"], results.runs["headrace"]
    out("")
    out(f"{'count window (median)':26}{'hand-written':>14}{'headrace':>12}{'ratio':>7}")
    out(f"{'events/s':26}{results.median_rate('hand'):>14,.0f}{results.median_rate('headrace'):>12,.0f}"
        f"{results.ratio():>7.2f}")
    out(f"{'events/CPU-second':26}{results.median_rate('hand', cpu=True):>14,.0f}"
        f"{results.median_rate('headrace', cpu=True):>12,.0f}{results.ratio(cpu=True):>7.2f}")
    out(f"{'windows written, each run':26}{hand[0].output_rows:>14,}{ours[0].output_rows:>12,}")
    out(f"{'ratio of each pair of runs':26}  {' '.join(f'{r:.2f}' for r in results.ratios())}")
    out("")
    ratio = results.ratio()
    out(f"target >= {TARGET}: {'met' if ratio >= TARGET else 'MISSED'}")
    out(f"count-window ratio={ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run on small data")
    parser.add_argument("--events", type=int, help="events per measured run")
    parser.add_argument("--rows-per-batch", type=int, help="events per micro-batch")
    parser.add_argument("--size", type=int, help="records per count window")
    parser.add_argument("--key", choices=("ad_id", "user_id", "page_id"), help="the field to key by")
    parser.add_argument("--runs", type=int, help="measured runs of each pipeline (median reported)")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else Config()
    overrides = {name: getattr(args, name) for name in ("events", "rows_per_batch", "size", "key", "runs")
                 if getattr(args, name) is not None}
    config = replace(config, **overrides)
    if config.events < 1 or config.rows_per_batch < 1 or config.size < 1 or config.runs < 1:
        parser.error("--events, --rows-per-batch, --size and --runs must be positive")
    from headrace.environment.session import get_session

    run_benchmark(get_session(), config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
