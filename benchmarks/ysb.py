"""The Yahoo Streaming Benchmark: headrace against the same pipeline hand-written in PySpark.

    .venv/bin/python benchmarks/ysb.py            # the full benchmark (about 8 minutes)
    .venv/bin/python benchmarks/ysb.py --quick    # a smoke run on small data (about 1 minute)

Both pipelines run in the same process, on one Spark session (headrace's), read the same
deterministic ``Generator`` Python data source and write to the same kind of sink:

    ad events -> keep views -> project (ad_id, event_time) -> join ad -> campaign
              -> count per campaign per event-time window

* **Throughput** (events/s): a bounded input of ``--events`` events in micro-batches of
  ``--rows-per-batch``, 10 s windows, Spark's ``noop`` sink. The time runs from the start
  of the first micro-batch to the end of the last one that read input, from the query's
  progress reports, the same way for both (a hand-written pipeline cannot flush its last
  windows at the end of a bounded input, so the flush batch is left out). Two variants:
  filter and projection as column expressions (``native``), and as Python functions
  (``python``: one fused Arrow stage in headrace, ``pyspark.sql.functions.udf`` by hand).
  After warm-up runs, 5 (native) and 3 (python) runs of each pipeline alternate
  (hand-written first, then headrace first, ...); the table shows each pipeline's median
  and the median of the ratios of the runs made one after the other. Events per
  CPU-second (Spark's JVM, its Python workers and this process) are shown too: other
  programs on the machine slow a run down without changing the CPU it needs.
* **Latency** at ``--rate`` events/s of wall clock: 250 ms tumbling windows, no
  out-of-orderness allowed, a ``foreachBatch`` sink that collects each batch on the
  driver and notes when each window's result arrived. A window's latency is its arrival
  time minus its end: the creation time of the last event that could belong to it (the
  generator stamps each event with its creation time, and hands no event out before
  then). Windows ending in the first ``warmup_seconds`` of a run are left out; p50 and p99
  are over every window of every run of a pipeline.

The last line is ``ysb ratio native=<x> python=<y>``: headrace's throughput divided by
the hand-written pipeline's, per variant.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from benchmarks.common import CpuClock, Print, Throughput, alternating, fresh_dir, processing_seconds  # noqa: E402
from headrace.connectors.base import CONTROL_COLUMN, Guarantee, SinkConnector, SourceContext  # noqa: E402
from headrace.connectors.generator import Generator, ysb_ads  # noqa: E402
from headrace.connectors.null_sink import Null  # noqa: E402
from headrace.demo import ysb_pipeline  # noqa: E402
from headrace.durations import to_millis  # noqa: E402
from headrace.runtime.runner import PipelineRun  # noqa: E402

VARIANTS = ("native", "python")
SOURCE_NAME = "ad_events"  # the headrace pipeline's source step name; the hand-written one uses the same


@dataclass(frozen=True)
class Config:
    events: int = 12_000_000
    rows_per_batch: int = 2_000_000
    runs: int = 5  # throughput runs of each pipeline, native variant
    python_runs: int = 3  # and python variant (slower: fewer)
    rate: int = 50_000
    latency_seconds: float = 20.0
    latency_runs: int = 4
    warmup_seconds: float = 4.0
    window: str = "10s"
    max_out_of_orderness: str = "1s"
    latency_window: str = "250ms"
    latency_out_of_orderness: str = "0s"
    throughput: bool = True
    latency: bool = True


# 10 s latency runs: in 5 s, on a machine loaded by other work, a run can end before a window
# that ends after the first second arrives (no latency samples)
QUICK = Config(events=150_000, rows_per_batch=75_000, runs=1, python_runs=1, latency_seconds=10.0,
               latency_runs=1, warmup_seconds=1.0)


# ----------------------------------------------------------------------------------------------
# The hand-written PySpark pipeline.

def handwritten_ysb(spark: SparkSession, variant: str, generator: Generator, run_dir: str, *,
                    window: str, max_out_of_orderness: str) -> DataFrame:
    """YSB in plain PySpark, reading the same Python data source as headrace.

    The source emits a control row at the end of a bounded input (``_hr_ctl`` set, every
    data column null): a plain pipeline just drops it. The python variant runs its filter
    predicate and its projection as ``pyspark.sql.functions.udf`` (Arrow-optimized by
    default in this Spark) over the columns each function reads.
    """
    data_source: Any = generator.data_source()
    spark.dataSource.register(data_source)
    raw = (spark.readStream.format(data_source.name())
           .options(**generator.options(), **SourceContext(run_dir, SOURCE_NAME).options()).load())
    events = raw.filter(F.col(CONTROL_COLUMN).isNull()).drop(CONTROL_COLUMN)
    if variant == "native":
        views = events.filter(F.col("event_type") == "view").select("ad_id", "event_time")
    elif variant == "python":
        # No type hints: with them, Spark tries to infer a pandas UDF kind from them.
        def view(event_type):
            return event_type == "view"

        def projection(ad_id, event_time):
            return ad_id, event_time

        is_view = F.udf(view, "boolean")
        # Non-deterministic so that Catalyst does not copy the join's inferred ``ad_id IS NOT NULL``
        # below the projection, which would run the projection on every row, views or not.
        project = F.udf(projection, "struct<ad_id: string, event_time: timestamp>").asNondeterministic()

        views = (events.filter(is_view("event_type"))
                 .select(project("ad_id", "event_time").alias("view")).select("view.*"))
    else:
        raise ValueError(f"unknown variant {variant!r}")
    ads = spark.createDataFrame(ysb_ads(), "ad_id string, campaign_id string")
    return (views.withWatermark("event_time", f"{to_millis(max_out_of_orderness, 'max_out_of_orderness')} milliseconds")
            .join(F.broadcast(ads), "ad_id")
            .groupBy("campaign_id", F.window("event_time", f"{to_millis(window, 'window')} milliseconds"))
            .agg(F.count(F.lit(1)).alias("views"))
            .select("campaign_id", F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"), "views"))


# ----------------------------------------------------------------------------------------------
# Measurements.

class ArrivalSink(SinkConnector):
    """Collects each batch on the driver and notes when each window's result arrived."""

    guarantee = Guarantee.AT_LEAST_ONCE

    def __init__(self) -> None:
        self.arrivals: dict[int, float] = {}  # window end (epoch µs) -> arrival (epoch s)

    def write_batch(self, df: DataFrame, batch_id: int) -> None:
        table = df.toArrow()
        arrival = time.time()
        for end in set(table.column("window_end").cast("int64").to_pylist()):
            self.arrivals.setdefault(end, arrival)

    def latencies(self, after: float) -> list[float]:
        """Seconds from each window's end to its result's arrival, for the windows ending
        after ``after`` (epoch seconds)."""
        return [arrival - end / 1e6 for end, arrival in sorted(self.arrivals.items()) if end / 1e6 > after]

    def describe(self) -> dict[str, Any]:
        return {"type": "ArrivalSink"}


def handwritten_throughput(spark: SparkSession, variant: str, config: Config, workdir: str) -> Throughput:
    root = fresh_dir(workdir, f"hand_{variant}")
    generator = Generator("ysb", limit=config.events, rows_per_batch=config.rows_per_batch)
    df = handwritten_ysb(spark, variant, generator, os.path.join(root, "run"), window=config.window,
                         max_out_of_orderness=config.max_out_of_orderness)
    query = (df.writeStream.queryName(f"hand_{variant}").format("noop").outputMode("append")
             .option("checkpointLocation", os.path.join(root, "checkpoint")).start())
    try:
        query.processAllAvailable()
        progress = [dict(p) for p in query.recentProgress]
    finally:
        query.stop()
    return Throughput(config.events, processing_seconds(progress), len(progress))


def headrace_throughput(spark: SparkSession, variant: str, config: Config, workdir: str) -> Throughput:
    root = fresh_dir(workdir, f"headrace_{variant}")
    pipeline = ysb_pipeline(variant=variant, limit=config.events, rows_per_batch=config.rows_per_batch,
                            window=config.window, max_out_of_orderness=config.max_out_of_orderness,
                            sink=Null(), name=f"headrace_{variant}")
    run = PipelineRun(pipeline, state_dir=root, progress="quiet", fresh=True).start()
    result = run.wait()
    return Throughput(config.events, processing_seconds(result.progress), len(result.progress))


@dataclass
class Latency:
    samples: list[float]  # seconds, one per window result
    batches: int
    batch_ms: float  # the median micro-batch duration

    @classmethod
    def of(cls, sink: ArrivalSink, after: float, progress: list[dict[str, Any]]) -> Latency:
        durations = [p["durationMs"]["triggerExecution"] for p in progress]
        return cls(sink.latencies(after), len(progress), statistics.median(durations) if durations else 0.0)


# Each latency run gets a folder of its own: a stopped query's state store can still write its
# last files into its checkpoint for a moment, and a folder emptied for the next run would then
# hold state that Spark 4.3 refuses on batch 0 (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY).
_latency_runs = itertools.count(1)


def handwritten_latency(spark: SparkSession, config: Config, workdir: str) -> Latency:
    root = fresh_dir(workdir, f"hand_latency_{next(_latency_runs)}")
    run_dir = os.path.join(root, "run")
    generator = Generator("ysb", rate=config.rate)
    sink = ArrivalSink()
    df = handwritten_ysb(spark, "native", generator, run_dir, window=config.latency_window,
                         max_out_of_orderness=config.latency_out_of_orderness)
    started = time.time()
    query = (df.writeStream.queryName("hand_latency").outputMode("append").foreachBatch(sink.write_batch)
             .option("checkpointLocation", os.path.join(root, "checkpoint")).start())
    try:
        query.awaitTermination(config.latency_seconds)
        # Stop at a batch boundary, as headrace does: the source hands out no new data from now on.
        os.makedirs(run_dir, exist_ok=True)
        open(os.path.join(run_dir, "stop"), "w").close()
        query.processAllAvailable()
        progress = [dict(p) for p in query.recentProgress]
    finally:
        query.stop()
    return Latency.of(sink, started + config.warmup_seconds, progress)


def headrace_latency(spark: SparkSession, config: Config, workdir: str) -> Latency:
    root = fresh_dir(workdir, f"headrace_latency_{next(_latency_runs)}")
    sink = ArrivalSink()
    pipeline = ysb_pipeline(variant="native", limit=None, rate=config.rate, window=config.latency_window,
                            max_out_of_orderness=config.latency_out_of_orderness, sink=sink,
                            name="headrace_latency")
    run = PipelineRun(pipeline, state_dir=root, progress="quiet", fresh=True)
    started = time.time()
    result = run.start().wait(until_exhausted=False, max_seconds=config.latency_seconds)
    return Latency.of(sink, started + config.warmup_seconds, result.progress[-100:])


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        raise RuntimeError("no latency samples")
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5)))
    return ordered[rank - 1]


# ----------------------------------------------------------------------------------------------
# The benchmark.

PIPELINES = ("hand", "headrace")
LABELS = {"hand": "hand-written PySpark", "headrace": "headrace"}
TARGETS = {"native": 0.95, "python": 0.6, "p99": 1.2}


@dataclass
class Results:
    throughput: dict[tuple[str, str], list[Throughput]] = field(default_factory=dict)  # (pipeline, variant)
    latency: dict[str, list[float]] = field(default_factory=dict)  # pipeline -> seconds, all runs
    run_p99: dict[str, list[float]] = field(default_factory=dict)  # pipeline -> each run's p99, seconds

    def median_rate(self, who: str, variant: str, *, cpu: bool = False) -> float:
        return statistics.median(t.cpu_rate if cpu else t.rate for t in self.throughput[(who, variant)])

    def ratio(self, variant: str, *, cpu: bool = False) -> float:
        """headrace / hand-written: the median of the ratios of the runs made one after the other."""
        pairs = zip(self.throughput[("headrace", variant)], self.throughput[("hand", variant)])
        return statistics.median((ours.cpu_rate / hand.cpu_rate) if cpu else (ours.rate / hand.rate)
                                 for ours, hand in pairs)

    def latency_ms(self, who: str, q: float) -> float:
        return percentile(self.latency[who], q) * 1000


def run_benchmark(spark: SparkSession, config: Config, out: Print = print, workdir: str | None = None) -> Results:
    """Run the benchmark, print each run, the table and the closing line; return the figures."""
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="headrace-ysb-")
    results, clock = Results(), CpuClock(spark)
    throughput_runs = {"hand": handwritten_throughput, "headrace": headrace_throughput}
    latency_runs = {"hand": handwritten_latency, "headrace": headrace_latency}
    try:
        out(f"YSB: headrace against hand-written PySpark, Spark {spark.version} {spark.sparkContext.master}, "
            f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, {os.cpu_count()} cores")
        # Warm-up runs, not measured: Python workers, the generator's string pools, and (a full-size
        # native run of each) the JIT; without it the first measured run is the slowest.
        small = replace(config, events=min(200_000, config.events // 10 + 2),
                        rows_per_batch=min(100_000, config.events // 20 + 1))
        warm_ups = {"native": config, "python": small}
        if config.throughput:
            out(f"throughput: {config.events:,} events, micro-batches of {config.rows_per_batch:,}, noop sink, "
                f"{config.runs} (native) and {config.python_runs} (python) runs of each, alternating")
        for variant in VARIANTS if config.throughput else ():
            for who in PIPELINES:
                throughput_runs[who](spark, variant, warm_ups[variant], workdir)
            runs = config.runs if variant == "native" else config.python_runs
            for number, order in enumerate(alternating(PIPELINES, runs), start=1):
                for who in order:
                    cpu = clock.seconds()
                    t = throughput_runs[who](spark, variant, config, workdir)
                    t.cpu_seconds, t.load = clock.seconds() - cpu, os.getloadavg()[0]
                    results.throughput.setdefault((who, variant), []).append(t)
                    out(f"  {variant:6} run {number}  {LABELS[who]:21} {t.rate:>11,.0f} events/s  "
                        f"{t.seconds:6.2f} s  {t.batches} batches  {t.cpu_rate:>9,.0f} events/CPU-s  "
                        f"load {t.load:.1f}")
        if config.latency:
            out(f"latency: {config.rate:,} events/s, {config.latency_window} tumbling windows, watermark delay "
                f"{config.latency_out_of_orderness}, foreachBatch sink, {config.latency_seconds:.0f} s per run, "
                f"windows ending in the first {config.warmup_seconds:.0f} s left out")
            if not config.throughput:
                for who in PIPELINES:
                    throughput_runs[who](spark, "native", small, workdir)
            # A short run of each first, not measured: the first latency run is otherwise the slowest.
            for who in PIPELINES:
                latency_runs[who](spark, replace(config, latency_seconds=min(8.0, config.latency_seconds / 2)), workdir)
        for number, order in enumerate(alternating(PIPELINES, config.latency_runs if config.latency else 0), start=1):
            for who in order:
                lat = latency_runs[who](spark, config, workdir)
                results.latency.setdefault(who, []).extend(lat.samples)
                results.run_p99.setdefault(who, []).append(percentile(lat.samples, 0.99))
                out(f"  run {number}  {LABELS[who]:21} p50 {percentile(lat.samples, 0.5) * 1000:5.0f} ms  "
                    f"p99 {percentile(lat.samples, 0.99) * 1000:5.0f} ms  {len(lat.samples)} windows  "
                    f"{lat.batches} batches of {lat.batch_ms:.0f} ms (median)  load {os.getloadavg()[0]:.1f}")
        report(results, out)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def report(results: Results, out: Print = print) -> None:
    """The table, the targets and the closing line ``ysb ratio native=<x> python=<y>``."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    out("")
    if results.throughput:
        out(f"{'throughput (median)':22}{'hand-written':>14}{'headrace':>12}{'ratio':>7}   "
            f"{'per CPU-second:':>16}{'hand-written':>14}{'headrace':>12}{'ratio':>7}")
        for variant in VARIANTS:
            hand, ours = results.median_rate("hand", variant), results.median_rate("headrace", variant)
            hand_cpu, ours_cpu = (results.median_rate(who, variant, cpu=True) for who in PIPELINES)
            out(f"{variant + ' (events/s)':22}{hand:>14,.0f}{ours:>12,.0f}{results.ratio(variant):>7.2f}   "
                f"{'':16}{hand_cpu:>14,.0f}{ours_cpu:>12,.0f}{results.ratio(variant, cpu=True):>7.2f}")
    if len(results.latency) == 2:
        out(f"{'latency (native)':22}{'hand-written':>14}{'headrace':>12}{'ratio':>7}")
        for name, q in (("p50 (ms)", 0.5), ("p99 (ms)", 0.99)):
            hand_ms, ours_ms = results.latency_ms("hand", q), results.latency_ms("headrace", q)
            out(f"{name:22}{hand_ms:>14,.0f}{ours_ms:>12,.0f}{ours_ms / hand_ms:>7.2f}")
        runs = zip(results.run_p99["headrace"], results.run_p99["hand"])
        pairs = statistics.median(ours / hand for ours, hand in runs)
        out(f"{'p99, per run':22}{'':>26}{pairs:>7.2f}  (median of the ratios of runs made one after the other)")
    out("")
    if results.throughput:
        native, python = results.ratio("native"), results.ratio("python")
        out(f"target native >= {TARGETS['native']}: {verdict(native >= TARGETS['native'])}; "
            f"target python >= {TARGETS['python']}: {verdict(python >= TARGETS['python'])}")
    if len(results.latency) == 2:
        p99 = results.latency_ms("headrace", 0.99) / results.latency_ms("hand", 0.99)
        out(f"target p99 <= {TARGETS['p99']} x hand-written: {verdict(p99 <= TARGETS['p99'])}")
    if results.throughput:
        out(f"ysb ratio native={results.ratio('native'):.2f} python={results.ratio('python'):.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run on small data")
    parser.add_argument("--events", type=int, help="events per throughput run")
    parser.add_argument("--rows-per-batch", type=int, help="events per micro-batch in throughput runs")
    parser.add_argument("--runs", type=int, help="throughput runs of each pipeline, each variant (median reported)")
    parser.add_argument("--latency-seconds", type=float, help="seconds per latency run")
    parser.add_argument("--latency-runs", type=int, help="latency runs per pipeline")
    parser.add_argument("--rate", type=int, help="events/s in the latency runs")
    parser.add_argument("--only", choices=("throughput", "latency"), help="run one half of the benchmark")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else Config()
    overrides = {name: getattr(args, name) for name in ("events", "rows_per_batch", "runs", "latency_seconds",
                                                         "latency_runs", "rate") if getattr(args, name) is not None}
    if args.runs is not None:
        overrides["python_runs"] = args.runs
    config = replace(config, **overrides)
    if args.only:
        config = replace(config, throughput=args.only == "throughput", latency=args.only == "latency")
    from headrace.environment.session import get_session

    run_benchmark(get_session(), config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
