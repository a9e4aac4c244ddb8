"""NEXMark q0-q22: headrace against hand-written PySpark, both checked against answers computed in Python.

    .venv/bin/python benchmarks/nexmark.py                      # every query on 300,000 events
    .venv/bin/python benchmarks/nexmark.py --quick              # a smoke run on 20,000 events
    .venv/bin/python benchmarks/nexmark.py --unbounded          # the stateless queries, headrace's sources unbounded
    .venv/bin/python benchmarks/nexmark.py --queries q0,q5 --events 100000 --seed 7

The events (``benchmarks/nexmark_events.py``) are NEXMark's persons, auctions and bids, generated
from a seed and written as three folders of JSON-lines files, one file of each kind per
micro-batch, out of order by less than 2 s. For each query, in the same process and on headrace's
Spark session:

* **the reference** (``nexmark_reference.py``): the answer, in plain Python over the events;
* **hand-written PySpark** (``nexmark_pyspark.py``): ``spark.readStream`` over the folders,
  ``trigger(availableNow=True)``;
* **headrace** (``nexmark_headrace.py``): the published SQL through ``p.sql`` where headrace takes
  it, else other SQL (q18: ``max_by``) or fluent steps, reading the folders with bounded ``Files``
  sources; with ``--unbounded``, the stateless queries (``STATELESS``) on unbounded ones, each run
  drained (``PipelineRun(drain=True)``: what the folders hold when it starts, then the end).

Both pipelines write each micro-batch to the driver (q10: to JSON files), and their rows are
compared with the reference as multisets: timestamps as epoch milliseconds, numbers rounded to 6
decimals. A query whose answer is updated (a GROUP BY without a window) is compared on the last
rows of each group. Each pipeline's time runs from the start of its first micro-batch to the end
of the last one that read input, from Spark's progress reports, as in ``ysb.py``; the ratio is
the hand-written pipeline's time over headrace's (above 1: headrace is faster). Each runs twice
(``--rounds``; once with ``--quick``), the two taking turns to go first (the hand-written one first
in the first round for even query numbers), and each side's fastest run counts: a query's first run
pays for compiling its own code, which a pipeline that runs for long pays once. A short query runs
more rounds, until each side's runs add up to ``SAMPLED_SECONDS`` (at most ``MAX_ROUNDS``): a run of
about a second varies by a tenth from one run to the next on two cores. Before each run, Python
collects its garbage, so that no run pays for the rows of the runs before it. Every run is
checked against the reference. An untimed run of the first query both ways goes before all (the
JVM compiles its hot paths in the first runs).

Per query it prints ``nexmark qN: exact=yes|no ratio=<x>``, or for a query headrace refuses
``nexmark qN: exact=no ratio=n/a (not expressible: <what headrace lacks>)``; a hand-written
pipeline that disagrees with the reference is printed too. The last line is
``nexmark exact=<n>/<queries> min_ratio=<x> median_ratio=<y>``.

**Simplifications**, beside the published queries (Flink's NEXMark SQL):

* Times are the events' ``dateTime``, 1 ms apart (1,000 events a second of event time), and the
  out-of-orderness allowed is 2 s; no event is late.
* Averages are Spark's doubles (Flink's AVG of a BIGINT is a BIGINT).
* q6 orders a seller's auctions by their end (Beam's "closed auctions"; a stream learns a winner
  when its auction ends), not by the winning bid's time as Flink's SQL does; q6, q9 (and the
  reference's q4) break a tie between equal prices by the earlier bid, and q19 ranks equal prices
  by the earlier bid, so every answer is one multiset.
* q7's join keeps, as the SQL says, a bid at exactly a window's end at the window's highest price.
* q10 writes JSON files partitioned by ``dt`` and ``hm`` on both sides, and compares the rows read
  back with the values of their partition folders.
* q3 and q20 join two streams without a bound in the published SQL; headrace needs one (it would
  otherwise keep every record for ever), so they bound the join by an hour of event time, longer
  than a run's events span, which finds every match of the unbounded join.
* q12's windows are in processing time, which no two runs share: what is compared is each
  bidder's total over all windows.
* q13's side input is keys 0-9,999, each with its own number as value (NEXMark's side-input generator).
* q20's second ``dateTime`` and ``extra`` (the auction's) are ``auction_dateTime`` and ``auction_extra``.
* q21 tests Spark's ``regexp_extract`` result against '' (Flink's gives NULL where it finds nothing).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark import cloudpickle  # noqa: E402
from pyspark.sql import DataFrame, SparkSession  # noqa: E402

import headrace as hr  # noqa: E402
from benchmarks import nexmark_headrace as in_headrace  # noqa: E402
from benchmarks import nexmark_pyspark as by_hand  # noqa: E402
from benchmarks import nexmark_reference as reference  # noqa: E402
from benchmarks.common import Print, fresh_dir, processing_seconds  # noqa: E402
from benchmarks.nexmark_events import (  # noqa: E402
    AUCTION_FIELDS,
    BID_FIELDS,
    Events,
    EventsConfig,
    generate,
    write,
)
from headrace.connectors.base import Guarantee, SinkConnector  # noqa: E402
from headrace.runtime.runner import PipelineRun  # noqa: E402
from headrace.spark.stages import ALLOW_MULTIPLE, EXCHANGE_REUSE  # noqa: E402

Row = tuple[Any, ...]
Rows = list[dict[str, Any]]


# ----------------------------------------------------------------------------------------------
# The queries: one entry each.

STATISTICS = tuple(f"{rank}_{what}" for what in ("bids", "bidders", "auctions")
                   for rank in ("total", "rank1", "rank2", "rank3"))


def bidder_totals(rows: list[Row]) -> list[Row]:
    """q12: each bidder's count over all its windows (processing-time windows differ from run to run)."""
    totals: Counter[Any] = Counter()
    for bidder, count, *_ in rows:
        totals[bidder] += count
    return list(totals.items())


@dataclass(frozen=True)
class Query:
    reference: Callable[[Events], list[Row]]
    pyspark: Callable[[by_hand.Sources], by_hand.Output]
    headrace: Callable[[hr.Pipeline, in_headrace.Sources], hr.Stream] | None  # None: headrace cannot say it
    columns: tuple[str, ...]
    waits_on: str = ""  # what headrace lacks to run it (today it refuses the query as the pipeline is built)
    keys: tuple[str, ...] = ()  # an updated answer: the columns naming a group, whose latest rows count
    compared: Callable[[list[Row]], list[Row]] | None = None  # what is compared, when not the rows themselves
    files: bool = False  # written to JSON files (q10) rather than collected on the driver


PASSED_ON = ("auction", "bidder", "price", "dateTime", "extra")  # the bid fields q0, q1 and q10 pass on
QUERIES: dict[str, Query] = {
    "q0": Query(reference.q0, by_hand.q0, in_headrace.q0, PASSED_ON),
    "q1": Query(reference.q1, by_hand.q1, in_headrace.q1, PASSED_ON),
    "q2": Query(reference.q2, by_hand.q2, in_headrace.q2, ("auction", "price")),
    "q3": Query(reference.q3, by_hand.q3, in_headrace.q3, ("name", "city", "state", "id")),
    "q4": Query(reference.q4, by_hand.q4, in_headrace.q4, ("category", "avg_final"), keys=("category",)),
    "q5": Query(reference.q5, by_hand.q5, in_headrace.q5, ("auction", "num")),
    "q6": Query(reference.q6, by_hand.q6, in_headrace.q6, ("seller", "avg_price")),
    "q7": Query(reference.q7, by_hand.q7, in_headrace.q7, ("auction", "price", "bidder", "dateTime", "extra")),
    "q8": Query(reference.q8, by_hand.q8, in_headrace.q8, ("id", "name", "starttime")),
    "q9": Query(reference.q9, by_hand.q9, in_headrace.q9,
                (*AUCTION_FIELDS, "auction", "bidder", "price", "bid_dateTime", "bid_extra")),
    "q10": Query(reference.q10, by_hand.q10, in_headrace.q10, (*PASSED_ON, "dt", "hm"), files=True),
    "q11": Query(reference.q11, by_hand.q11, in_headrace.q11, ("bidder", "bid_count", "starttime", "endtime")),
    "q12": Query(reference.q12, by_hand.q12, in_headrace.q12, ("bidder", "bid_count", "starttime", "endtime"),
                 keys=("bidder", "starttime"), compared=bidder_totals),
    "q13": Query(reference.q13, by_hand.q13, in_headrace.q13, ("auction", "bidder", "price", "dateTime", "value")),
    "q14": Query(reference.q14, by_hand.q14, in_headrace.q14,
                 ("auction", "bidder", "price", "bidTimeType", "dateTime", "extra", "c_counts")),
    "q15": Query(reference.q15, by_hand.q15, in_headrace.q15, ("day", *STATISTICS), keys=("day",)),
    "q16": Query(reference.q16, by_hand.q16, in_headrace.q16, ("channel", "day", "minute", *STATISTICS),
                 keys=("channel", "day")),
    "q17": Query(reference.q17, by_hand.q17, in_headrace.q17,
                 ("auction", "day", "total_bids", "rank1_bids", "rank2_bids", "rank3_bids", "min_price", "max_price",
                  "avg_price", "sum_price"), keys=("auction", "day")),
    "q18": Query(reference.q18, by_hand.q18, in_headrace.q18, BID_FIELDS, keys=("bidder", "auction")),
    "q19": Query(reference.q19, by_hand.q19, in_headrace.q19, (*BID_FIELDS, "rank_number"), keys=("auction",)),
    "q20": Query(reference.q20, by_hand.q20, in_headrace.q20,
                 (*BID_FIELDS, *(f"auction_{n}" if n in ("dateTime", "extra") else n for n in AUCTION_FIELDS[1:]))),
    "q21": Query(reference.q21, by_hand.q21, in_headrace.q21, ("auction", "bidder", "price", "channel", "channel_id")),
    "q22": Query(reference.q22, by_hand.q22, in_headrace.q22,
                 ("auction", "bidder", "price", "channel", "dir1", "dir2", "dir3")),
}


# ----------------------------------------------------------------------------------------------
# Rows: collected, read back, normalised and compared.

def normalized(value: Any) -> Any:
    """Timestamps as epoch milliseconds, numbers that are not integers rounded to 6 decimals."""
    if isinstance(value, datetime.datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, float | Decimal):
        return round(float(value), 6)
    return value


def batch_rows(df: DataFrame) -> Rows:
    """A micro-batch's rows on the driver, as both pipelines' sinks take them."""
    return [{k: normalized(v) for k, v in row.items()} for row in df.toArrow().to_pylist()]


class Collect(SinkConnector):
    """headrace's sink for the benchmark: each micro-batch's rows, by batch id."""

    guarantee = Guarantee.AT_LEAST_ONCE

    def __init__(self) -> None:
        self.batches: dict[int, Rows] = {}

    def write_batch(self, df: DataFrame, batch_id: int) -> None:
        self.batches[batch_id] = batch_rows(df)


def file_rows(path: str) -> Rows:
    """The rows of JSON-lines files under ``path``, with the ``name=value`` folders they are in as columns."""
    rows: Rows = []
    for folder, folders, names in os.walk(path):
        folders[:] = [f for f in folders if not f.startswith(("_", "."))]
        partitions = dict(unquote(part).split("=", 1) for part in os.path.relpath(folder, path).split(os.sep)
                          if "=" in part)
        for name in sorted(n for n in names if not n.startswith(("_", ".")) and ".json" in n):
            with open(os.path.join(folder, name)) as handle:
                rows.extend({**json.loads(line), **partitions} for line in handle if line.strip())
    return rows


def timestamps_read(rows: Rows) -> Rows:
    """JSON rows with their ``dateTime`` text as epoch milliseconds."""
    return [{**r, "dateTime": normalized(datetime.datetime.fromisoformat(r["dateTime"]))} for r in rows]


def answer(query: Query, batches: dict[int, Rows]) -> list[Row]:
    """The rows to compare: every row, or for an updated answer each group's rows of its latest batch."""
    if query.keys:
        latest: dict[Row, tuple[int, Rows]] = {}
        for batch_id in sorted(batches):
            for row in batches[batch_id]:
                key = tuple(row[k] for k in query.keys)
                if latest.get(key, (-1, []))[0] != batch_id:
                    latest[key] = (batch_id, [])
                latest[key][1].append(row)
        chosen = [row for _, rows in latest.values() for row in rows]
    else:
        chosen = [row for batch_id in sorted(batches) for row in batches[batch_id]]
    rows = [tuple(normalized(row[c]) for c in query.columns) for row in chosen]
    return query.compared(rows) if query.compared else rows


def difference(expected: list[Row], got: list[Row]) -> str:
    """'' when the two multisets are equal, else what differs, in a few words."""
    want, have = Counter(expected), Counter(got)
    if want == have:
        return ""
    missing, extra = want - have, have - want
    return (f"{sum(missing.values())} of {len(expected)} expected rows missing (e.g. {next(iter(missing), None)}), "
            f"{sum(extra.values())} of {len(got)} rows unexpected (e.g. {next(iter(extra), None)})")


# ----------------------------------------------------------------------------------------------
# Running the pipelines.

LABELS = {"hand": "hand-written PySpark", "headrace": "headrace"}


@dataclass
class Run:
    batches: dict[int, Rows]
    progress: list[dict[str, Any]]
    agrees: bool = False  # with the reference
    disagreement: str = ""  # how it differs from it

    @property
    def seconds(self) -> float:
        return processing_seconds(self.progress)


def run_pyspark(spark: SparkSession, name: str, query: Query, root: str, config: EventsConfig, workdir: str) -> Run:
    # headrace sets these for its own queries; a hand-written query runs with Spark's defaults.
    spark.conf.set(ALLOW_MULTIPLE, "true")
    spark.conf.set(EXCHANGE_REUSE, "true")
    out = query.pyspark(by_hand.Sources(spark, root, config))
    folder = fresh_dir(workdir, f"hand_{name}")
    batches: dict[int, Rows] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        rows = batch_rows(df)
        batches[batch_id] = out.then(rows) if out.then else rows

    writer = (out.df.writeStream.queryName(f"hand_{name}").outputMode(out.mode).trigger(availableNow=True)
              .option("checkpointLocation", os.path.join(folder, "checkpoint")))
    if query.files:
        writer = writer.format("json").partitionBy(*out.partition_by).option("path", os.path.join(folder, "out"))
    else:
        writer = writer.foreachBatch(collect)
    running = writer.start()
    try:
        running.awaitTermination()
        progress = [dict(p) for p in running.recentProgress]
    finally:
        running.stop()
    if query.files:
        batches = {0: timestamps_read(file_rows(os.path.join(folder, "out")))}
    return Run(batches, progress)


def run_headrace(pipeline: hr.Pipeline, sink: Collect | None, name: str, query: Query, workdir: str,
                 unbounded: bool = False) -> Run:
    """Run the pipeline to its end: bounded sources to their last file, unbounded ones drained
    (what the folders hold when it starts, as the hand-written query's availableNow reads them)."""
    folder = fresh_dir(workdir, f"headrace_{name}")
    run = PipelineRun(pipeline, state_dir=os.path.join(folder, "state"), progress="quiet", fresh=True, drain=unbounded)
    started = run.start()
    result = started.wait_drained() if unbounded else started.wait()
    if sink is None:
        batches = {0: timestamps_read(file_rows(os.path.join(folder, "out")))}
    else:
        batches = sink.batches
    return Run(batches, result.progress)


def headrace_pipeline(name: str, query: Query, root: str, config: EventsConfig, workdir: str,
                      unbounded: bool = False) -> tuple[hr.Pipeline, Collect | None]:
    """The query's headrace pipeline with its sink (raises hr.PlanError when headrace refuses it)."""
    assert query.headrace is not None
    pipeline = hr.Pipeline(f"nexmark_{name}")
    stream = query.headrace(pipeline, in_headrace.Sources(root, config, bounded=not unbounded))
    if query.files:
        stream.sink("out", hr.sinks.Files(os.path.join(workdir, f"headrace_{name}", "out"), format="jsonl",
                                          partition_by=["dt", "hm"]))
        return pipeline, None
    sink = Collect()
    stream.sink("out", sink)
    return pipeline, sink


# ----------------------------------------------------------------------------------------------
# The benchmark.

@dataclass(frozen=True)
class Config:
    events: EventsConfig = EventsConfig()
    queries: tuple[str, ...] = tuple(QUERIES)
    rounds: int = 2  # runs of each side per query, the fastest counted: a query's first run compiles its code
    unbounded: bool = False  # headrace's sources unbounded, each run drained (the stateless queries only)


# the queries that keep no state (no window, join of two streams, aggregate, de-duplication or top N)
STATELESS = ("q0", "q1", "q2", "q10", "q13", "q14", "q21", "q22")
QUICK = Config(events=EventsConfig(events=20_000, files=2), rounds=1)
SAMPLED_SECONDS = 15.0  # a short query's rounds go on until each side's runs add up to this
MAX_ROUNDS = 16  # a run of about a second takes 15 to reach SAMPLED_SECONDS


@dataclass
class Outcome:
    exact: bool
    ratio: float | None


@dataclass
class Results:
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def closing_line(self) -> str:
        ratios = [o.ratio for o in self.outcomes.values() if o.ratio is not None]
        exact = sum(o.exact for o in self.outcomes.values())
        figures = (f"min_ratio={min(ratios):.2f} median_ratio={statistics.median(ratios):.2f}" if ratios
                   else "min_ratio=n/a median_ratio=n/a")
        return f"nexmark exact={exact}/{len(self.outcomes)} {figures}"


def run_query(spark: SparkSession, name: str, events: Events, root: str, workdir: str, out: Print,
              rounds: int = 1, unbounded: bool = False) -> Outcome:
    """Run the query's two pipelines ``rounds`` times each (taking turns to go first), more while
    a side's runs add up to less than ``SAMPLED_SECONDS`` (with ``rounds`` above 1), check every
    run against the reference, and print its line with each side's fastest run."""
    query = QUERIES[name]
    expected = reference_answer(query, events)
    built: tuple[hr.Pipeline, Collect | None] | None = None
    try:
        built = headrace_pipeline(name, query, root, events.config, workdir, unbounded) if query.headrace else None
    except hr.PlanError as refusal:
        out(f"  {name} headrace refuses it: {first_line(refusal)}")
    runs: dict[str, Run] = {}  # each side's fastest run; it agrees with the reference when every run did
    failed: set[str] = set()
    sampled = {"hand": 0.0, "headrace": 0.0}  # each side's seconds over all its runs
    round_number = 0
    while round_number < rounds or _sample_more(rounds, round_number, {w: sampled[w] for w in runs}):
        order = ("hand", "headrace") if (int(name[1:]) + round_number) % 2 == 0 else ("headrace", "hand")
        for who in (w for w in order if w not in failed):
            gc.collect()  # neither side pays for the garbage of the runs before it
            try:
                if who == "hand":
                    run = run_pyspark(spark, name, query, root, events.config, workdir)
                elif built is not None:
                    pipeline = headrace_pipeline(name, query, root, events.config, workdir, unbounded) \
                        if round_number else built
                    run = run_headrace(*pipeline, name, query, workdir, unbounded)
                else:
                    continue
            except Exception as failure:  # noqa: BLE001 - one query's failure is reported, the others still run
                out(f"  {name} {LABELS[who]} failed: {first_line(failure)}")
                traceback.print_exc(file=sys.stderr)
                failed.add(who)
                runs.pop(who, None)
                continue
            sampled[who] += run.seconds
            disagreement = difference(expected, answer(query, run.batches))
            run.agrees, run.disagreement = not disagreement, disagreement
            best = runs.get(who)
            if best is None or run.seconds < best.seconds:
                run.agrees = run.agrees and (best is None or best.agrees)
                runs[who] = run
            else:
                best.agrees = best.agrees and run.agrees
                best.disagreement = best.disagreement or disagreement
        round_number += 1
    of = f" (best of {round_number})" if round_number > 1 else ""
    for who, run in runs.items():
        rows = (f"the reference's {len(expected):,} rows" if run.agrees
                else f"NOT the reference's: {run.disagreement}")
        out(f"  {name} {LABELS[who]:21} {run.seconds:6.2f} s{of}  {len(run.progress):2} micro-batches  {rows}")
    ours, hand = runs.get("headrace"), runs.get("hand")
    if ours is None:
        why = f"not expressible: {query.waits_on or 'see above'}" if built is None else "failed: see above"
        out(f"nexmark {name}: exact=no ratio=n/a ({why})")
        return Outcome(False, None)
    ratio = hand.seconds / ours.seconds if hand else None
    out(f"nexmark {name}: exact={'yes' if ours.agrees else 'no'} ratio={'n/a' if ratio is None else f'{ratio:.2f}'}"
        f"{'' if hand else ' (the hand-written pipeline failed)'}")
    return Outcome(ours.agrees, ratio)


def _sample_more(rounds: int, done: int, sampled: dict[str, float]) -> bool:
    """Whether a short query runs another round: some side that runs has less than
    ``SAMPLED_SECONDS`` in all, and ``rounds`` (above 1: not a smoke run) asked for sampling."""
    return rounds > 1 and done < MAX_ROUNDS and bool(sampled) and min(sampled.values()) < SAMPLED_SECONDS


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def reference_answer(query: Query, events: Events) -> list[Row]:
    rows = [tuple(normalized(v) for v in row) for row in query.reference(events)]
    return query.compared(rows) if query.compared else rows


def run_benchmark(spark: SparkSession, config: Config, out: Print = print, workdir: str | None = None) -> Results:
    """Generate the events, run each query, print its line and the closing line; return the outcomes."""
    own_workdir = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="headrace-nexmark-")
    # Spark's Python workers cannot import the benchmark's modules: send the functions' code, not their names.
    for module in (in_headrace, by_hand):
        cloudpickle.register_pickle_by_value(module)
    results = Results()
    try:
        settings = config.events
        out(f"NEXMark: headrace against hand-written PySpark, Spark {spark.version} {spark.sparkContext.master}, "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        events = generate(settings)
        root = fresh_dir(workdir, "input")
        write(events, root)
        out(f"{settings.events:,} events (seed {settings.seed}): {len(events.person):,} persons, "
            f"{len(events.auction):,} auctions, {len(events.bid):,} bids, {settings.files} files of each, "
            f"{settings.interval_ms} ms apart, out of order by less than {settings.max_delay_ms} ms")
        # untimed: the first query would otherwise pay alone for the JVM's first compilations
        run_query(spark, config.queries[0], events, root, workdir, lambda _line: None, unbounded=config.unbounded)
        for name in config.queries:
            results.outcomes[name] = run_query(spark, name, events, root, workdir, out, config.rounds, config.unbounded)
        out(results.closing_line())
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run on small data")
    parser.add_argument("--events", type=int, help="events to generate")
    parser.add_argument("--queries", help="the queries to run, e.g. q0,q5,q11 (default: all 23)")
    parser.add_argument("--seed", type=int, help="the generator's seed")
    parser.add_argument("--rounds", type=int, help="runs of each side per query, the fastest counted (default: 2, "
                                                   "--quick 1)")
    parser.add_argument("--unbounded", action="store_true",
                        help=f"headrace's sources unbounded, each run drained; the stateless queries only "
                             f"({', '.join(STATELESS)})")
    args = parser.parse_args(argv)
    config = replace(QUICK if args.quick else Config(), unbounded=args.unbounded)
    if args.rounds is not None:
        if args.rounds < 1:
            parser.error("--rounds must be at least 1")
        config = replace(config, rounds=args.rounds)
    settings = replace(config.events, **{k: v for k, v in (("events", args.events), ("seed", args.seed))
                                         if v is not None})
    everything = STATELESS if args.unbounded else config.queries
    queries = tuple(q.strip() for q in args.queries.split(",")) if args.queries else everything
    unknown = [q for q in queries if q not in QUERIES]
    if unknown:
        parser.error(f"unknown queries {', '.join(unknown)}; they are q0 to q22")
    stateful = [q for q in queries if q not in STATELESS]
    if args.unbounded and stateful:
        parser.error(f"--unbounded runs the stateless queries ({', '.join(STATELESS)}), not {', '.join(stateful)}: "
                     f"the hand-written stateful queries end their windows with a flush row, which only a bounded "
                     f"headrace source gives")
    if settings.events < 2 * 50 * settings.files:
        parser.error(f"--events must be at least {2 * 50 * settings.files}")
    from headrace.environment.session import get_session

    run_benchmark(get_session(), replace(config, events=settings, queries=queries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
