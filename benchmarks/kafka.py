"""Kafka in, Kafka out: headrace against the same pipeline hand-written in PySpark, on the same
broker, topics and connector (Spark's ``spark-sql-kafka-0-10``), in one run.

    .venv/bin/python benchmarks/kafka.py            # the full benchmark (about 10 minutes)
    .venv/bin/python benchmarks/kafka.py --quick    # a smoke run on small data (about 2 minutes)

The broker is the one at ``--servers`` (127.0.0.1:9092, started with scripts/kafka.sh when none
runs). Events are JSON objects ``{"user_id", "kind", "amount"}``; one in ten has kind "buy".

* **Throughput** (events/s): ``--events`` events produced once into a topic of 2 partitions,
  read from the start in micro-batches of ``--rows-per-batch``: keep kind == "buy", project
  (user_id, amount), write JSON values keyed by user_id to a fresh topic. headrace's sink is
  ``hr.sinks.Kafka(..., exactly_once=False)``, which is Spark's own Kafka writer, as the
  hand-written query uses; the transactional exactly-once sink (the default) is measured too
  and shown beside them. The time runs from the start of the first micro-batch to the end of
  the last one that read input (progress reports, the same for both); runs alternate after a
  warm-up, and the ratio is the median of the ratios of the runs made one after the other.
* **Latency** at ``--rate`` events/s for ``--seconds`` seconds, produced by a separate process
  (confluent-kafka, its default batching) into a fresh topic of 2 partitions; the output
  topic stamps each record with the broker's time (``message.timestamp.type=LogAppendTime``).
  A record's latency is the output record's broker time minus the input record's producer
  timestamp (which the pipeline carries through as ``kafka_timestamp``); a window's is its
  output time minus its end. Records produced in the first ``--warmup`` seconds are left out.
  Pipelines: the stateless one in micro-batch mode and in Spark's real-time mode, and a 1 s
  tumbling event-time window counting per kind (event time: the Kafka timestamp, no
  out-of-orderness) in micro-batch mode. Each runs in headrace (out of the box) and by hand;
  the stateless micro-batch one also by hand with the best setting found here (asynchronous
  progress tracking, which takes the offset and commit log writes off each batch's path).

The last two lines are ``kafka ratio=<headrace / hand-written>`` and
``kafka latency p99_ms microbatch=<a> realtime=<b> windowed=<c>`` (headrace's figures).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import Print, Throughput, alternating, fresh_dir, processing_seconds  # noqa: E402
from headrace.testing.kafka import read_topic  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = "user_id string, kind string, amount long"
KINDS = ("buy", "view", "view", "click", "view", "view", "click", "view", "view", "view")  # one buy in ten
REAL_TIME_BATCH = "5 seconds"
LATENCY_RUNS = (("microbatch", "hand-written"), ("microbatch", "hand-tuned"), ("microbatch", "headrace"),
                ("microbatch", "headrace exactly-once"), ("windowed", "hand-written"), ("windowed", "headrace"),
                ("realtime", "hand-written"), ("realtime", "headrace"))


def event(i: int) -> bytes:
    return b'{"user_id":"u%d","kind":"%s","amount":%d}' % (i % 1000, KINDS[i % 10].encode(), i % 100)


# -- the broker and topics -----------------------------------------------------------------------

def ensure_broker(servers: str) -> None:
    host, port = servers.split(",")[0].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return
    except OSError:
        pass
    subprocess.run(["bash", os.path.join(ROOT, "scripts", "kafka.sh"), "start", "--port", port], check=True,
                   stdout=subprocess.DEVNULL)


def new_topic(servers: str, prefix: str, partitions: int = 2, broker_time: bool = False) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"bench_{prefix}_{uuid.uuid4().hex[:8]}"
    config = {"message.timestamp.type": "LogAppendTime"} if broker_time else {}
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=config)]).values():
        future.result(30)
    return name


def produce(servers: str, topic: str, count: int, rate: float | None = None) -> None:
    """``count`` events into ``topic``, as fast as possible or at ``rate`` per second."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": servers})
    started, step = time.time(), max(1, int((rate or 100_000) / 200))  # paced in 5 ms slices
    for first in range(0, count, step):
        if rate:
            pause = started + first / rate - time.time()
            if pause > 0:
                time.sleep(pause)
        for i in range(first, min(count, first + step)):
            while True:
                try:
                    producer.produce(topic, event(i))
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.poll(0)
    assert producer.flush(60) == 0, "the producer could not deliver every event"


def read_output(servers: str, topic: str) -> list[tuple[int, dict[str, Any]]]:
    """Every record of ``topic``: (broker timestamp in ms, JSON value)."""
    return [(record.timestamp_ms, record.json()) for record in read_topic(servers, topic, timeout_s=600)]


def epoch_ms(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000


# -- the pipelines -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    servers: str
    source: str
    target: str
    workdir: str
    rows_per_batch: int | None = None


def headrace_pipeline(job: Job, mode: str, exactly_once: bool = False) -> Any:
    import headrace as hr

    trigger = "real-time" if mode == "realtime" else "micro-batch"
    p = hr.Pipeline(f"kafka_{mode}", trigger=trigger)
    metadata = [] if mode == "throughput" else ["timestamp"]
    events = p.source("events", hr.sources.Kafka(job.source, schema=SCHEMA, servers=job.servers, metadata=metadata,
                                                 max_records_per_batch=job.rows_per_batch),
                      event_time="kafka_timestamp" if mode == "windowed" else None)
    sink = hr.sinks.Kafka(job.target, servers=job.servers, key="user_id", exactly_once=exactly_once)
    if mode == "windowed":
        counts = events.key_by("kind").window(hr.Tumbling("1s")).count()
        counts.select("kind", "window_start", "window_end", "count").sink(
            "out", hr.sinks.Kafka(job.target, servers=job.servers, key="kind", exactly_once=exactly_once))
    else:
        columns = ["user_id", "amount"] + ([] if mode == "throughput" else ["kafka_timestamp"])
        events.filter(hr.col("kind") == "buy").select(*columns).sink("out", sink)
    return p


def run_headrace(job: Job, mode: str, until: Callable[[], None], exactly_once: bool = False) -> list[dict[str, Any]]:
    """Start headrace's pipeline, call ``until`` (which returns when the input is in), stop it
    after the batch it runs; Spark's progress reports."""
    from headrace.runtime.runner import PipelineRun

    run = PipelineRun(headrace_pipeline(job, mode, exactly_once), state_dir=fresh_dir(job.workdir, "headrace"),
                      progress="quiet").start()
    until()
    if mode == "throughput":
        run.settle()
    run.request_stop("benchmark done")
    return run.wait(until_exhausted=False).progress


def run_handwritten(spark: Any, job: Job, mode: str, until: Callable[[], None],
                    tuned: bool = False) -> list[dict[str, Any]]:
    """The same pipeline in plain PySpark, with Spark's Kafka source and writer."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", job.servers)
              .option("subscribe", job.source).option("startingOffsets", "earliest"))
    if job.rows_per_batch:
        reader = reader.option("maxOffsetsPerTrigger", str(job.rows_per_batch))
    raw = reader.load()
    events = raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("e"), "timestamp").select("e.*",
                                                                                                         "timestamp")
    if mode == "windowed":
        counts = (events.withWatermark("timestamp", "0 seconds").groupBy(F.window("timestamp", "1 second"), "kind")
                  .count())
        out = counts.select(F.col("kind").alias("key"), F.to_json(F.struct(
            "kind", F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
            "count")).alias("value"))
    else:
        columns = [F.col("user_id"), F.col("amount")] + ([] if mode == "throughput" else
                                                         [F.col("timestamp").alias("kafka_timestamp")])
        out = events.filter(F.col("kind") == "buy").select(F.col("user_id").alias("key"),
                                                          F.to_json(F.struct(*columns)).alias("value"))
    writer = (out.writeStream.format("kafka").option("kafka.bootstrap.servers", job.servers)
              .option("topic", job.target).option("checkpointLocation", fresh_dir(job.workdir, "handwritten"))
              .outputMode("update" if mode == "realtime" else "append"))
    if mode == "realtime":
        writer = writer.trigger(realTime=REAL_TIME_BATCH)
    if tuned:
        writer = writer.option("asyncProgressTrackingEnabled", "true")
    query = writer.start()
    try:
        until()
        if mode == "throughput":
            query.processAllAvailable()
        else:
            wait_for_batch_end(query)
    finally:
        query.stop()
    return list(query.recentProgress)


def wait_for_batch_end(query: Any, timeout_s: float = 30.0) -> None:
    """Until the batch running now has reported (what headrace's stop waits for too)."""
    reported = (query.lastProgress or {}).get("batchId")
    deadline = time.time() + timeout_s
    while query.isActive and query.status.get("isTriggerActive") and time.time() < deadline:
        if (query.lastProgress or {}).get("batchId") != reported:
            return
        time.sleep(0.05)


# -- throughput ----------------------------------------------------------------------------------

def throughput(spark: Any, args: argparse.Namespace, say: Print) -> float:
    source = new_topic(args.servers, "in")
    produce(args.servers, source, args.events)
    say(f"throughput: {args.events:,} events in topic {source} (2 partitions), {args.rows_per_batch:,} per batch")

    def once(name: str) -> Throughput:
        job = Job(args.servers, source, new_topic(args.servers, "out"), args.workdir, args.rows_per_batch)
        if name == "hand-written":
            progress = run_handwritten(spark, job, "throughput", lambda: None)
        else:
            progress = run_headrace(job, "throughput", lambda: None, exactly_once=name == "headrace exactly-once")
        read = sum(p.get("numInputRows") or 0 for p in progress)
        assert read == args.events, f"{name} read {read} events, not {args.events}"
        return Throughput(read, processing_seconds(progress), len(progress))

    names = ("hand-written", "headrace")
    for name in names:
        once(name)  # warm-up
    results: dict[str, list[Throughput]] = {name: [] for name in names}
    ratios = []
    for order in alternating(names, args.runs):
        for name in order:
            results[name].append(once(name))
        ratios.append(results["headrace"][-1].rate / results["hand-written"][-1].rate)
    exactly_once = [once("headrace exactly-once") for _ in range(max(1, args.runs // 2))]
    for name, runs in [*results.items(), ("headrace exactly-once", exactly_once)]:
        rates = [r.rate for r in runs]
        say(f"  {name:22} median {statistics.median(rates):>10,.0f} events/s   runs: "
            + ", ".join(f"{r:,.0f}" for r in rates))
    say("  pair ratios: " + ", ".join(f"{r:.2f}" for r in ratios))
    return statistics.median(ratios)


# -- latency -------------------------------------------------------------------------------------

@dataclass
class Latency:
    p50: float
    p99: float
    records: int


def latency(spark: Any, args: argparse.Namespace, mode: str, who: str) -> Latency:
    job = Job(args.servers, new_topic(args.servers, "in"), new_topic(args.servers, "out", broker_time=True),
              args.workdir)
    count = int(args.rate * args.seconds)
    started: list[float] = []

    def until() -> None:
        time.sleep(args.settle)  # the query is running: its first batches are behind it
        started.append(time.time() * 1000)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--produce", job.source, "--count", str(count),
                        "--rate", str(args.rate), "--servers", args.servers], check=True)
        time.sleep(3)  # the last records and windows on their way

    if who.startswith("headrace"):
        run_headrace(job, mode, until, exactly_once=who == "headrace exactly-once")
    else:
        run_handwritten(spark, job, mode, until, tuned=who == "hand-tuned")
    after = started[0] + args.warmup * 1000
    if mode == "windowed":
        rows = [(ts, value) for ts, value in read_output(args.servers, job.target)]
        samples = [ts - epoch_ms(v["window_end"]) for ts, v in rows if epoch_ms(v["window_start"]) >= after]
        total = sum(v["count"] for _, v in rows)
        assert 0 < total <= count, f"{who} counted {total} events in its windows, {count} were produced"
    else:
        rows = read_output(args.servers, job.target)
        assert len(rows) >= count // 10, f"{who} wrote {len(rows)} records, fewer than the {count // 10} expected"
        samples = [ts - epoch_ms(v["kafka_timestamp"]) for ts, v in rows if epoch_ms(v["kafka_timestamp"]) >= after]
    if not samples:
        raise RuntimeError(f"{who} {mode}: no output after the warm-up")
    samples.sort()
    return Latency(samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))], len(samples))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", default="127.0.0.1:9092")
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--rows-per-batch", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rate", type=float, default=100_000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--warmup", type=float, default=5, help="seconds of latency samples left out")
    parser.add_argument("--settle", type=float, default=8, help="seconds a query runs before the events start")
    parser.add_argument("--quick", action="store_true", help="small data: a smoke run")
    parser.add_argument("--only", choices=("throughput", "latency"))
    parser.add_argument("--workdir")
    parser.add_argument("--produce", help=argparse.SUPPRESS)  # internal: the latency producer process
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        produce(args.servers, args.produce, args.count, args.rate)
        return 0
    if args.quick:
        args.events, args.rows_per_batch, args.runs = 200_000, 50_000, 1
        args.rate, args.seconds, args.warmup, args.settle = 5_000, 6, 2, 6
    ensure_broker(args.servers)
    own_workdir = args.workdir is None
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="headrace-kafka-bench-")
    say: Print = lambda text: print(text, flush=True)  # noqa: E731

    from headrace.environment import jars
    from headrace.environment.session import get_session

    spark = get_session(packages=[jars.KAFKA])
    try:
        ratio = throughput(spark, args, say) if args.only != "latency" else None
        p99: dict[str, float] = {}
        if args.only != "throughput":
            say(f"latency: {args.rate:,.0f} events/s for {args.seconds:g} s, the first {args.warmup:g} s left out")
            say(f"  {'pipeline':34} {'p50 ms':>8} {'p99 ms':>8} {'samples':>9}")
            for mode, who in LATENCY_RUNS:
                figures = latency(spark, args, mode, who)
                say(f"  {mode + ' ' + who:34} {figures.p50:8.0f} {figures.p99:8.0f} {figures.records:9,}")
                if who == "headrace":
                    p99[mode] = figures.p99
        if ratio is not None:
            say(f"kafka ratio={ratio:.2f}")
        if p99:
            say(f"kafka latency p99_ms microbatch={p99['microbatch']:.0f} realtime={p99['realtime']:.0f} "
                f"windowed={p99['windowed']:.0f}")
    finally:
        if own_workdir:
            shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
