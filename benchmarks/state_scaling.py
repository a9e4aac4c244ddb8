"""State scaling: does a micro-batch of a keyed stateful step cost what it touches, not all state held?

    .venv/bin/python benchmarks/state_scaling.py            # the full benchmark (1,000 / 100,000 / 1,000,000 keys)
    .venv/bin/python benchmarks/state_scaling.py --quick    # a smoke run on small sizes (about a minute)
    .venv/bin/python benchmarks/state_scaling.py --sizes 1000,100000,300000 --events 200000 --keys 10000

Keyed windows and process steps keep each key's state under its key in Spark's state store
(``headrace/spark/stateful.py``), so a micro-batch should load and write only the keys it
touches. This benchmark runs the same per-batch input (``--events`` events over ``--keys``
keys) through two keyed stateful steps, after their state already holds ``--sizes`` keys,
and compares the throughput:

* **count window**: ``key_by("k").window(hr.Count(100)).count()`` (``WindowProcessor`` on
  ``transformWithStateInPandas``);
* **process**: ``key_by("k").process(EveryHundredth(), ...)``, a ``hr.KeyedProcessFunction``
  with one ``hr.ValueState`` counter per key that emits every 100th record of its key.

For each step kind and size, one pipeline runs on a fresh checkpoint: a bounded
``Generator("clicks")`` source (deterministic; event ``i`` has event time
``start + 10 i`` µs, so ``i`` is computed back from it) in micro-batches of ``--events``
events, and ``select(k=...)`` turns event ``i`` into the key:

* **preload** (the first ``ceil(size / events)`` micro-batches): event ``i < size`` gets key
  ``i``, one event per key, so the state then holds ``size`` keys (each with an open count
  window of one record, or a counter at 1); the rest of the preload batches is filtered out;
* **warm-up** (the next micro-batch, not measured): ``--events`` events over ``--keys`` keys
  ``size ... size + keys - 1``, none of them preloaded: this batch creates their state;
* **measured** (``--batches`` micro-batches): the same keys again, ``events / keys`` events
  per key each, so each measured batch reads and writes the state of ``--keys`` existing keys
  while the store holds ``size + keys``.

Before the measured sizes, one unmeasured run of each kind at the smallest size warms the
session up (JIT, Python workers), so that the smallest size, measured first, does not pay for it.

Throughput of a size = the measured batches' input rows / the sum of their
``durationMs.triggerExecution`` (Spark's progress reports; the preload and warm-up batches
are left out). The state rows Spark reports (``stateOperators[].numRowsTotal``) are shown
so the size held can be checked. A thread samples ``/proc`` every 0.25 s while a run lasts:

* memory: the resident set (VmRSS) of the largest Python process under Spark's JVM (the
  ``pyspark.daemon`` and the workers forked from it: the processors' workers and the
  source's) and of the JVM; the table shows the largest while the measured batches ran,
  and the largest worker over the whole run, preload included;
* CPU: the CPU seconds of the JVM's threads and of its Python workers while the measured
  batches ran, hence events per CPU-second, which other programs on a shared machine hardly
  change; and the seconds those threads and workers spent runnable but waiting for a CPU
  (``/proc/<pid>/schedstat``): when that grows between sizes, the machine's load, not the
  state held, made the batches longer.

The last line is ``state-scaling ratio=<x>``: throughput (events/s of wall clock) with the
largest size held divided by throughput with the smallest, the lower of the two step kinds;
above it, each kind's ratio, and the same per CPU-second. ``--verbose`` also prints the
measured batches' ``durationMs`` parts and the state operators' metrics (RocksDB get and put
latencies, commit times, ...), summed over the measured batches.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

import headrace as hr  # noqa: E402
from benchmarks.common import Print, process_stats  # noqa: E402
from headrace.connectors.generator import DEFAULT_START_MS  # noqa: E402
from headrace.runtime.runner import PipelineRun  # noqa: E402

TARGET = 0.8
KINDS = ("count window", "process")
EVERY = 100  # the count window's size, and the process function emits every EVERY-th record of a key


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...] = (1_000, 100_000, 1_000_000)  # keys held in state before the measured batches
    events: int = 200_000  # events per micro-batch
    keys: int = 10_000  # keys each measured micro-batch touches
    batches: int = 3  # measured micro-batches per size (after one unmeasured warm-up batch)
    kinds: tuple[str, ...] = KINDS
    warmup: bool = True  # one unmeasured run of each kind first


QUICK = Config(sizes=(100, 2_000), events=5_000, keys=500, batches=1, warmup=False)


# ----------------------------------------------------------------------------------------------
# The pipelines.

class EveryHundredth(hr.KeyedProcessFunction):
    """Counts each key's records in a value state; emits the key and its count every EVERY-th record."""

    seen = hr.ValueState(default=0)

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        seen = self.seen.get() + 1
        self.seen.set(seen)
        if seen % EVERY == 0:
            ctx.emit({"k": ctx.key, "seen": seen})


def preload_events(config: Config, size: int) -> int:
    """The events of the preload micro-batches (whole micro-batches)."""
    return math.ceil(size / config.events) * config.events


def key_expression(config: Config, size: int) -> str:
    """Event ``i`` -> its key: ``i`` while preloading (one event per key, the rest of the
    preload batches null, filtered out), then ``size + (i - preload) % keys``."""
    index = f"((unix_micros(event_time) - {DEFAULT_START_MS * 1000}) div 10)"
    preload = preload_events(config, size)
    return (f"CASE WHEN {index} < {size} THEN {index} WHEN {index} < {preload} THEN NULL "
            f"ELSE {size} + ({index} - {preload}) % {config.keys} END")


def pipeline(config: Config, kind: str, size: int) -> hr.Pipeline:
    total = preload_events(config, size) + (1 + config.batches) * config.events
    name = f"state_scaling_{'window' if kind == 'count window' else 'process'}_{size}"
    p = hr.Pipeline(name)
    keyed = (p.source("events", hr.sources.Generator("clicks", limit=total, rows_per_batch=config.events,
                                                     start_ms=DEFAULT_START_MS))
             .select(k=hr.expr(key_expression(config, size)))
             .filter(hr.col("k").is_not_null())
             .key_by("k"))
    if kind == "count window":
        out = keyed.window(hr.Count(EVERY), name="count_window").count()
    else:
        out = keyed.process(EveryHundredth(), schema={"k": "long", "seen": "long"}, name="every_hundredth")
    out.sink("out", hr.sinks.Null())
    return p


# ----------------------------------------------------------------------------------------------
# Memory and CPU: sampled from /proc while a run lasts (Linux; elsewhere the figures are 0).

TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _is_python_worker(pid: int) -> bool:
    """A Python process (``pyspark.daemon``, a worker forked from it), not a short-lived fork of the
    JVM, whose command line names pyspark's jars too."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return b"python" in os.path.basename(argv[0]) and any(b"pyspark" in arg or b"daemon" in arg for arg in argv)


def _waited(path: str) -> int:
    """Nanoseconds a task has spent runnable but waiting for a CPU (``/proc/.../schedstat``)."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def scan(jvm_pid: int) -> tuple[float, float, float, float, float]:
    """(largest Python worker RSS in MB, the JVM's RSS in MB, CPU seconds of the JVM's own threads,
    CPU seconds of all its descendants, reaped ones included: the Python workers, and the seconds
    the JVM's threads and the live Python workers have waited for a CPU while runnable)."""
    every = process_stats()
    stats = {pid: (parent, ticks) for pid, (parent, ticks, _) in every.items()}
    jvm_own = every.get(jvm_pid, (0, 0, 0))[2]
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    workers: list[float] = []
    try:
        waited = sum(_waited(f"/proc/{jvm_pid}/task/{tid}/schedstat") for tid in os.listdir(f"/proc/{jvm_pid}/task"))
    except OSError:
        waited = 0
    ticks, todo = stats.get(jvm_pid, (0, 0))[1] - jvm_own, list(children.get(jvm_pid, ()))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        ticks += stats[pid][1]
        if _is_python_worker(pid):
            workers.append(_rss_mb(pid))
            waited += _waited(f"/proc/{pid}/schedstat")
    return max(workers, default=0.0), _rss_mb(jvm_pid), jvm_own / TICK, ticks / TICK, waited / 1e9


class Sampler:
    """A thread noting, every ``interval`` s: the time, the largest Python worker's RSS, the JVM's
    RSS, the CPU seconds used so far by the JVM and by its Python workers, and the seconds they have
    waited for a CPU."""

    def __init__(self, jvm_pid: int, interval: float = 0.25) -> None:
        self.jvm_pid, self.interval = jvm_pid, interval
        self.samples: list[tuple[float, float, float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while self.jvm_pid and os.path.isdir("/proc") and not self._stop.is_set():
            self.samples.append((time.time(), *scan(self.jvm_pid)))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        if self.jvm_pid and os.path.isdir("/proc"):
            self.samples.append((time.time(), *scan(self.jvm_pid)))  # one after the run, for cpu_seconds

    def largest(self, since: float = 0.0, until: float = math.inf) -> tuple[float, float]:
        """The largest worker RSS and JVM RSS (MB) sampled between ``since`` and ``until``."""
        inside = [(w, j) for t, w, j, *_ in self.samples if since <= t <= until]
        inside = inside or [(w, j) for _, w, j, *_ in self.samples]
        return max((w for w, _ in inside), default=0.0), max((j for _, j in inside), default=0.0)

    def cpu_seconds(self, since: float, until: float) -> tuple[float, float, float]:
        """CPU seconds of the JVM and of the Python workers, and seconds they waited for a CPU, between
        ``since`` and ``until`` (from the samples just outside them)."""
        before = [sample[3:] for sample in self.samples if sample[0] <= since]
        after = [sample[3:] for sample in self.samples if sample[0] >= until]
        if not before or not after:
            return 0.0, 0.0, 0.0
        return (after[0][0] - before[-1][0], after[0][1] - before[-1][1], max(0.0, after[0][2] - before[-1][2]))


def jvm_pid(spark: SparkSession) -> int:
    try:
        return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    except Exception:  # noqa: BLE001 - no JVM handle (e.g. Spark Connect): no JVM figures
        return 0


# ----------------------------------------------------------------------------------------------
# One size of one step kind.

def _epoch(timestamp: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _start_offset(progress: dict[str, Any]) -> int:
    source = progress["sources"][0]
    start = source.get("startOffset")
    if isinstance(start, str):
        start = json.loads(start)
    return int(start["offset"]) if start else 0  # the first batch of a query starts at null


def _state_rows(progress: dict[str, Any]) -> int:
    return sum(int(op.get("numRowsTotal") or 0) for op in progress.get("stateOperators") or ())


@dataclass
class Measurement:
    kind: str
    size: int
    events: int  # input rows of the measured batches
    seconds: float  # their triggerExecution, summed
    warmup_rate: float  # events/s of the warm-up batch (it creates the touched keys' state)
    preload_seconds: float  # from the start of the first preload batch to the end of the last
    state_rows: int  # state rows Spark reports after the last measured batch
    worker_mb: float  # largest Python worker RSS while the measured batches ran
    worker_mb_run: float  # ... over the whole run, preload included
    jvm_mb: float  # JVM RSS while the measured batches ran
    cpu_jvm: float  # CPU seconds of the JVM while the measured batches ran
    cpu_python: float  # ... and of its Python workers
    waited: float  # seconds the JVM's threads and the Python workers waited for a CPU (other programs' load)
    batch_ms: list[int] = field(default_factory=list)  # each measured batch's triggerExecution
    durations: dict[str, int] = field(default_factory=dict)  # summed durationMs parts of the measured batches
    custom: dict[str, float] = field(default_factory=dict)  # summed state operator custom metrics (measured)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    @property
    def cpu_seconds(self) -> float:
        return self.cpu_jvm + self.cpu_python

    @property
    def cpu_rate(self) -> float:
        return self.events / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


def measure(spark: SparkSession, config: Config, kind: str, size: int, workdir: str,
            out: Print = print, verbose: bool = False) -> Measurement:
    p = pipeline(config, kind, size)
    # Spark's Python workers cannot import this file when it was loaded by path: send the
    # process function's code by value (run as a script, __main__ travels by value anyway).
    module = sys.modules.get(EveryHundredth.__module__)
    if module is not None and module.__name__ != "__main__":
        cloudpickle.register_pickle_by_value(module)
    preload = preload_events(config, size)
    with Sampler(jvm_pid(spark)) as sampler:
        result = PipelineRun(p, state_dir=workdir, progress="quiet", fresh=True).start().wait()
    progress = [dict(r) for r in result.progress if (r.get("numInputRows") or 0) > 0]
    preloaded = [r for r in progress if _start_offset(r) < preload]
    warmup = [r for r in progress if _start_offset(r) == preload]
    measured = [r for r in progress if _start_offset(r) > preload]
    if len(measured) != config.batches or len(warmup) != 1:
        raise RuntimeError(f"{kind}, {size:,} keys: expected 1 warm-up and {config.batches} measured batches, "
                           f"got {len(warmup)} and {len(measured)}")
    shutil.rmtree(os.path.join(workdir, p.plan.name), ignore_errors=True)

    def span(reports: list[dict[str, Any]]) -> tuple[float, float]:
        first = min(_epoch(r["timestamp"]) for r in reports)
        last = max(_epoch(r["timestamp"]) + r["durationMs"]["triggerExecution"] / 1000 for r in reports)
        return first, last

    start, end = span(measured)
    worker_mb, jvm_mb = sampler.largest(start, end)
    worker_run, _ = sampler.largest()
    durations: dict[str, int] = {}
    custom: dict[str, float] = {}
    for r in measured:
        for part, ms in r["durationMs"].items():
            durations[part] = durations.get(part, 0) + int(ms)
        for op in r.get("stateOperators") or ():
            metrics = {**(op.get("customMetrics") or {}),
                       **{name: value for name, value in op.items() if name.endswith("TimeMs")}}
            for name, value in metrics.items():
                custom[name] = custom.get(name, 0) + float(value)
    w = warmup[0]
    preload_s = (lambda s: s[1] - s[0])(span(preloaded)) if preloaded else 0.0
    m = Measurement(
        kind, size, sum(int(r["numInputRows"]) for r in measured),
        sum(r["durationMs"]["triggerExecution"] for r in measured) / 1000,
        int(w["numInputRows"]) / (w["durationMs"]["triggerExecution"] / 1000), preload_s,
        _state_rows(measured[-1]), worker_mb, worker_run, jvm_mb, *sampler.cpu_seconds(start, end),
        [int(r["durationMs"]["triggerExecution"]) for r in measured], durations, custom)
    out(f"  {kind:13} {size:>10,} keys held: {m.rate:>9,.0f} events/s measured "
        f"({', '.join(f'{ms / 1000:.1f}' for ms in m.batch_ms)} s a batch), {m.cpu_rate:,.0f} events/CPU-s "
        f"(CPU s: JVM {m.cpu_jvm:.1f}, Python {m.cpu_python:.1f}; waited for a CPU {m.waited:.1f} s), "
        f"warm-up {m.warmup_rate:,.0f} events/s, preload {m.preload_seconds:.0f} s, {m.state_rows:,} state rows, "
        f"worker {m.worker_mb:.0f} MB, JVM {m.jvm_mb:.0f} MB, load {os.getloadavg()[0]:.1f}")
    if verbose:
        out(f"      durationMs (measured, summed): {json.dumps(m.durations, sort_keys=True)}")
        out(f"      state operator metrics (measured, summed): {json.dumps(m.custom, sort_keys=True)}")
    return m


# ----------------------------------------------------------------------------------------------
# The benchmark.

def ratio(results: list[Measurement], kind: str, *, cpu: bool = False) -> float:
    """Throughput with the largest size held / with the smallest, for one step kind."""
    mine = sorted((m for m in results if m.kind == kind), key=lambda m: m.size)
    if not mine:
        return 0.0
    first, last = (mine[0].cpu_rate, mine[-1].cpu_rate) if cpu else (mine[0].rate, mine[-1].rate)
    return last / first if first else 0.0


def report(config: Config, results: list[Measurement], out: Print = print) -> float:
    """The table of each step kind, each kind's ratio, the target and the closing line."""
    smallest, largest = min(config.sizes), max(config.sizes)
    for kind in config.kinds:
        out("")
        out(f"{kind}: {config.events:,} events over {config.keys:,} keys a batch")
        out(f"{'keys held':>11}{'state rows':>12}{'events/s':>10}{'vs first':>9}{'events/CPU-s':>13}"
            f"{'vs first':>9}{'CPU s JVM':>10}{'Python':>8}{'CPU wait s':>11}{'warm-up ev/s':>13}{'preload s':>10}"
            f"{'worker MB':>10}{'(whole run)':>12}{'JVM MB':>8}")
        mine = sorted((m for m in results if m.kind == kind), key=lambda m: m.size)
        for m in mine:
            cpu_vs = m.cpu_rate / mine[0].cpu_rate if mine[0].cpu_rate else 0.0
            out(f"{m.size:>11,}{m.state_rows:>12,}{m.rate:>10,.0f}{m.rate / mine[0].rate:>9.2f}{m.cpu_rate:>13,.0f}"
                f"{cpu_vs:>9.2f}{m.cpu_jvm:>10.1f}{m.cpu_python:>8.1f}{m.waited:>11.1f}{m.warmup_rate:>13,.0f}"
                f"{m.preload_seconds:>10.0f}{m.worker_mb:>10.0f}{m.worker_mb_run:>12.0f}{m.jvm_mb:>8.0f}")
    out("")
    ratios = {kind: ratio(results, kind) for kind in config.kinds}
    for kind, value in ratios.items():
        out(f"{kind} ratio ({largest:,} / {smallest:,} keys held) = {value:.2f}   "
            f"(per CPU-second: {ratio(results, kind, cpu=True):.2f})")
    overall = min(ratios.values())
    out(f"target >= {TARGET}: {'met' if overall >= TARGET else 'MISSED'}")
    out(f"state-scaling ratio={overall:.2f}")
    return overall


def run_benchmark(spark: SparkSession, config: Config, out: Print = print, workdir: str | None = None,
                  verbose: bool = False) -> list[Measurement]:
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="headrace-state-scaling-")
    results: list[Measurement] = []
    try:
        out(f"State scaling: keyed stateful steps, Spark {spark.version} {spark.sparkContext.master}, "
            f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, {os.cpu_count()} cores")
        out(f"{config.events:,} events over {config.keys:,} keys a micro-batch; keys held "
            f"{', '.join(f'{s:,}' for s in config.sizes)}; 1 warm-up and {config.batches} measured batches each")
        # One unmeasured run of each kind first (JIT, Python workers, query planning code paths), so
        # that the smallest size, measured first, is not the one that pays for the session warming up.
        for kind in config.kinds if config.warmup else ():
            m = measure(spark, replace(config, batches=1), kind, min(config.sizes), workdir, lambda _: None)
            out(f"  warm-up run, {kind}, {m.size:,} keys held: {m.rate:,.0f} events/s (not counted)")
        for kind in config.kinds:
            for size in sorted(config.sizes):
                results.append(measure(spark, config, kind, size, workdir, out, verbose))
        report(config, results, out)
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def _sizes(text: str) -> tuple[int, ...]:
    return tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a fast smoke run on small sizes")
    parser.add_argument("--sizes", type=_sizes, help="keys held before measuring, e.g. 1000,100000,1000000")
    parser.add_argument("--events", type=int, help="events per micro-batch")
    parser.add_argument("--keys", type=int, help="keys each measured micro-batch touches")
    parser.add_argument("--batches", type=int, help="measured micro-batches per size")
    parser.add_argument("--only", choices=("window", "process"), help="run one step kind")
    parser.add_argument("--verbose", action="store_true",
                        help="also print the measured batches' durationMs parts and state operator metrics")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else Config()
    overrides = {name: getattr(args, name) for name in ("sizes", "events", "keys", "batches")
                 if getattr(args, name) is not None}
    if args.only:
        overrides["kinds"] = ("count window",) if args.only == "window" else ("process",)
    config = replace(config, **overrides)
    if (len(config.sizes) < 2 or min(config.sizes) < 1 or config.events < 1 or config.keys < 1
            or config.batches < 1 or config.keys > config.events):
        parser.error("--sizes needs two or more positive sizes; --events, --keys and --batches must be positive, "
                     "--keys at most --events")
    from headrace.environment.session import get_session

    run_benchmark(get_session(), config, verbose=args.verbose)
    return 0


if __name__ == "__main__":
    sys.exit(main())
