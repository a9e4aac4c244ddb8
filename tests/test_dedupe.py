"""De-duplication (docs/dedupe.md) against a model in plain Python: in one query, a dedupe, a
window reading it, and a join reading a dedupe and read by one, with out-of-order, late and
duplicate records across micro-batches, stopped after its first micro-batch and restarted from
its checkpoint; the restart check; and every dedupe refused as the pipeline is built."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.api.pipeline_file import load_pipeline_file
from headrace.errors import PipelineFileError, PlanError
from headrace.runtime.compatibility import compare, plan_record
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

ROOT = Path(__file__).resolve().parents[1]
S = 1_000
EVENT = {"id": "string", "v": "long", "ts": "long"}
LABEL = {"key": "string", "label": "string", "lt": "long"}
DELAY, WITHIN, WINDOW = 2 * S, 10 * S, 20 * S
# Micro-batch by micro-batch (v numbers the records). The watermark trails the largest event
# time seen before the batch by 2 s: none, 10 s, 28 s.
BATCHES = [
    # a at 10 s (out of order) repeats a at 11 s in the same batch
    [{"id": "a", "v": 1, "ts": 11 * S}, {"id": "b", "v": 2, "ts": 12 * S}, {"id": "a", "v": 3, "ts": 10 * S},
     {"id": "c", "v": 4, "ts": 5 * S}],
    # a at 19 s: within 10 s of its first; c at 11 s: within 10 s of c at 5 s, though the
    # watermark has passed 5 s + the 2 s delay; b at 30 s: more than 10 s after b's first, but
    # b is remembered until the watermark reaches 22 s; f at 8 s is late
    [{"id": "a", "v": 5, "ts": 19 * S}, {"id": "c", "v": 6, "ts": 11 * S}, {"id": "b", "v": 7, "ts": 30 * S},
     {"id": "d", "v": 8, "ts": 14 * S}, {"id": "f", "v": 9, "ts": 8 * S}],
    # a, b, c and d are forgotten: a at 29 s is a first again; d at 27 s is late; e twice
    [{"id": "a", "v": 10, "ts": 29 * S}, {"id": "d", "v": 11, "ts": 27 * S}, {"id": "e", "v": 12, "ts": 31 * S},
     {"id": "e", "v": 13, "ts": 33 * S}],
]
# A label per key, far ahead of the records' event times (so the watermark, the smaller of the
# two sources', is the records'); the second label of b is a duplicate. Every micro-batch has a
# label: after a restart, Spark holds the watermark where it was until each source has sent data.
LABELS = [[{"key": "b", "label": "B", "lt": 1000 * S}, {"key": "c", "label": "C", "lt": 1000 * S},
           {"key": "b", "label": "B2", "lt": 1001 * S}],
          *([{"key": "z", "label": "Z", "lt": (1001 + n) * S}] for n in range(1, 3))]


# -- the model -------------------------------------------------------------------------------------

def arrivals() -> list[tuple[dict[str, Any], int | None]]:
    """Each record, in order, with the watermark its micro-batch runs with: the largest event
    time seen before it - DELAY (None before any). Spark judges the records of a query with
    several stateful steps by the watermark of the micro-batch before, which here is the same:
    the test kit runs the micro-batch without data that moves the watermark before it offers
    the next."""
    found: list[tuple[dict[str, Any], int | None]] = []
    largest: int | None = None
    for batch in BATCHES:
        found += [(record, None if largest is None else largest - DELAY) for record in batch]
        largest = max(r["ts"] for r in batch + ([{"ts": largest}] if largest is not None else []))
    return found


def model_dedupe(within: int) -> list[int]:
    """The ``v`` of the records a dedupe lets through, in order. A record is late when its event
    time is at or before the watermark. It passes when its key is not remembered; a key is
    remembered from its first record until the watermark reaches that record's time + ``within``."""
    kept: list[int] = []
    remembered: dict[str, int] = {}
    for record, mark in arrivals():
        if mark is not None:
            remembered = {key: until for key, until in remembered.items() if until > mark}
            if record["ts"] <= mark:
                continue
        if record["id"] not in remembered:
            remembered[record["id"]] = record["ts"] + within
            kept.append(record["v"])
    return kept


def model_windows() -> dict[int, tuple[int, int, int]]:
    """Per 20 s window (by its start, in seconds) of what the dedupe lets through: how many
    records, the sum and the smallest of their ``v``."""
    time_of = {record["v"]: record["ts"] for record, _ in arrivals()}
    windows: dict[int, list[int]] = {}
    for v in model_dedupe(WITHIN):
        windows.setdefault(time_of[v] // WINDOW * WINDOW // S, []).append(v)
    return {start: (len(vs), sum(vs), min(vs)) for start, vs in windows.items()}


def model_labelled() -> list[tuple[str, int, str]]:
    """The first on-time record of each labelled key, with its key's first label. Spark's
    watermark after the join trails by the join's bound (2000 s), so the dedupe after it finds
    no record late and forgets no key."""
    label: dict[str, str] = {}
    for row in LABELS[0]:
        label.setdefault(row["key"], row["label"])
    first: dict[str, tuple[str, int, str]] = {}
    for record, mark in arrivals():
        if record["id"] in label and (mark is None or record["ts"] > mark):
            first.setdefault(record["id"], (record["id"], record["v"], label[record["id"]]))
    return sorted(first.values())


@pytest.mark.fast
def test_the_data_tells_within_from_the_watermark_delay():
    assert model_dedupe(WITHIN) == [1, 2, 4, 8, 10, 12]
    assert model_windows() == {0: (4, 15, 1), 20: (2, 22, 10)}
    assert 6 in model_dedupe(DELAY)  # remembered for the delay only, c at 11 s would pass
    assert model_labelled() == [("b", 2, "B"), ("c", 4, "C")]


# -- headrace ----------------------------------------------------------------------------------------

def deduped_pipeline(name: str) -> tuple[hr.Pipeline, dict[str, TestSink]]:
    """In one query: a window reading a dedupe, and a dedupe of the join of the records with
    their labels (deduplicated as well)."""
    p = hr.Pipeline(name)
    events = p.source("events", TestSource(BATCHES, schema=EVENT), event_time="ts", max_out_of_orderness=DELAY)
    sinks = {"windows": TestSink(), "labelled": TestSink()}
    (events.dedupe("id", within="10s", name="once")
     .window(hr.Tumbling("20s"), name="per_20s").aggregate(n=hr.count(), total=hr.sum("v"), smallest=hr.min("v"))
     .sink("windows", sinks["windows"]))
    labels = p.source("labels", TestSource(LABELS, schema=LABEL), event_time="lt").dedupe("key", name="one_label")
    (events.join(labels, on={"id": "key"}, within=("-2000s", "2000s"), name="with_label")
     .dedupe("id", within="10s", name="first_labelled").sink("labelled", sinks["labelled"]))
    return p, sinks


def test_dedupes_chained_with_a_window_and_a_join_restart_from_their_checkpoint_with_the_model_s_output(
        spark, tmp_path):
    state = str(tmp_path / "state")
    first, sinks = deduped_pipeline("dedupe_restart")
    text = first.explain()
    assert "native Spark dropDuplicatesWithinWatermark on id (each key kept in the state store until the " \
           "watermark passes its first record's event time + within (10s)), append mode" in text
    assert "native Spark window aggregate, append mode" in text  # it reads the dedupe's records
    run = PipelineRun(first, state_dir=state, progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=lambda r: r.request_stop("test"))  # after the first batch
    assert not run.exhausted()
    second, after = deduped_pipeline("dedupe_restart")
    for name, sink in sinks.items():
        after[name].batches.update(sink.batches)
    PipelineRun(second, state_dir=state, progress="quiet").start().wait(until_exhausted=True)
    windows = {int(r["window_start"].timestamp()): (r["n"], r["total"], r["smallest"]) for r in after["windows"].rows()}
    assert windows == model_windows()
    assert sorted((r["id"], r["v"], r["label"]) for r in after["labelled"].rows()) == model_labelled()


def test_the_example_of_docs_dedupe_md_prints_what_it_shows(spark, capsys):
    """Run as written; what it prints is each minute's orders counted once, as a model gives it."""
    doc = (ROOT / "docs" / "dedupe.md").read_text()
    code = next(block for block in doc.split("```python\n")[1:] if 'hr.Pipeline("first_orders")' in block)
    namespace: dict[str, Any] = {}
    exec(compile(code.split("```", 1)[0], "docs/dedupe.md", "exec"), namespace)
    shown = doc.split("<!-- first_orders output -->\n```\n", 1)[1].split("```", 1)[0]
    printed = capsys.readouterr().out
    assert printed == shown
    first: dict[int, dict[str, Any]] = {}
    for record in (r for batch in namespace["orders"].steps for r in batch):
        first.setdefault(record["order"], record)
    minutes: dict[int, list[int]] = {}
    for record in first.values():
        minutes.setdefault(int(record["ts"].timestamp()) // 60, []).append(record["amount"])
    assert printed == "".join(f"[00:{m:02}, 00:{m + 1:02}) orders={len(a)} takings={sum(a)}\n"
                              for m, a in sorted(minutes.items()))


# -- the restart check -------------------------------------------------------------------------------

def dedupe_of(keys: list[str], within: str) -> hr.Pipeline:
    p = hr.Pipeline("dedupe_change")
    (p.source("events", TestSource([], schema=EVENT), event_time="ts")
     .dedupe(keys, within=within, name="once").sink("out", TestSink()))
    return p


@pytest.mark.fast
def test_a_restart_refuses_other_keys_and_takes_another_within():
    base = plan_record(dedupe_of(["id"], "10s").plan)
    other_keys = compare(base, plan_record(dedupe_of(["id", "v"], "10s").plan))
    assert not other_keys.allowed
    assert "stateful step 'once' (dedupe" in other_keys.message()
    assert 'changed dedupe keys ["id"] → ["id", "v"]' in other_keys.message()
    longer = compare(base, plan_record(dedupe_of(["id"], "1m").plan))
    assert longer.allowed
    assert [str(c) for v in longer.steps if v.name == "once" for c in v.changes] == ["within_ms 10000 → 60000"]


# -- pipeline files ------------------------------------------------------------------------------------

FILE = """
pipeline: file_dedupe
sources:
  events: {type: TestSource, batches: [], schema: "id string, v long, ts long", event_time: ts}
steps:
  - name: once
    from: events
    dedupe: [id, v]
    within: 10s
sinks:
  out: {type: TestSink, from: once}
"""


@pytest.mark.fast
def test_a_dedupe_step_of_a_pipeline_file_is_the_fluent_one_and_its_errors_give_the_line(tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(textwrap.dedent(FILE))
    node = load_pipeline_file(path, environ={}).plan.nodes["once"]
    assert (node.kind, node.inputs, node.params()) == ("dedupe", ("events_event_time",),
                                                       {"on": ["id", "v"], "within_ms": 10_000})
    path.write_text(textwrap.dedent(FILE).replace("within: 10s", "keep: last"))
    assert load_pipeline_file(path, environ={}).plan.nodes["once"].kind == "keyed_process"
    path.write_text(textwrap.dedent(FILE).replace("within: 10s", "keep: newest"))
    with pytest.raises(PipelineFileError, match=r"pipeline.yaml:\d+: step 'once': keep must be 'first' or 'last'"):
        load_pipeline_file(path, environ={})


def model_keep_last(within: int) -> list[tuple[int, int]]:
    """(v, period end) of each record ``keep="last"`` emits. A record is late when its event time is
    at or before the watermark (dropped). A key's first on-time record opens a period ending at its
    time + ``within``; the key's records arriving before the watermark reaches that end replace the
    held one when their time is not earlier; it is emitted when the watermark reaches the end (at
    the start of a micro-batch; at the end of the input, for every period still open)."""
    held: dict[str, tuple[int, int, int]] = {}  # id -> (end, ts, v)
    out: list[tuple[int, int]] = []

    def close(mark: float) -> None:
        for key, (end, _, v) in sorted(held.items(), key=lambda item: item[1][0]):
            if end <= mark:
                out.append((v, end))
                del held[key]

    for record, mark in arrivals():
        if mark is not None:
            close(mark)
            if record["ts"] <= mark:
                continue
        end, ts, _ = held.get(record["id"], (record["ts"] + within, record["ts"], 0))
        if record["ts"] >= ts:
            held[record["id"]] = (end, record["ts"], record["v"])
    close(float("inf"))
    return out


def test_keep_last_emits_each_keys_latest_record_when_its_period_ends(spark, tmp_path):
    """dedupe(keep="last"), then a window over its results (each at its period's end), in one query,
    against the model; a stop after the first micro-batch and a restart from the checkpoint."""
    def pipeline() -> tuple[hr.Pipeline, TestSink, TestSink]:
        p = hr.Pipeline("keep_last")
        events = p.source("events", TestSource(BATCHES, schema=EVENT), event_time="ts", max_out_of_orderness=DELAY)
        latest, counts = TestSink(), TestSink()
        kept = events.dedupe("id", within="10s", keep="last", name="latest")
        kept.sink("latest_out", latest)
        kept.window(hr.Tumbling("20s"), name="per_20s").aggregate(n=hr.count(), total=hr.sum("v")).sink(
            "counts", counts)
        return p, latest, counts

    first, latest, counts = pipeline()
    run = PipelineRun(first, state_dir=str(tmp_path), progress="quiet").start()
    run.wait(until_exhausted=True, on_settled=lambda r: r.request_stop("test"))
    second, latest_after, counts_after = pipeline()
    for before, after in ((latest, latest_after), (counts, counts_after)):
        after.batches.update(before.batches)
    PipelineRun(second, state_dir=str(tmp_path), progress="quiet").start().wait(until_exhausted=True)

    expected = model_keep_last(WITHIN)
    assert sorted(r["v"] for r in latest_after.rows()) == sorted(v for v, _ in expected)
    windows: dict[int, list[int]] = {}
    for v, end in expected:
        windows.setdefault(end // WINDOW * WINDOW // S, []).append(v)
    assert sorted((int(r["window_start"].timestamp()), r["n"], r["total"]) for r in counts_after.rows()) == sorted(
        (start, len(vs), sum(vs)) for start, vs in windows.items())


# -- refused as the pipeline is built ----------------------------------------------------------------

def refusal(build: Callable[[hr.Pipeline, hr.Stream], Any]) -> str:
    p = hr.Pipeline("refused_dedupe")
    events = p.source("events", TestSource([], schema=EVENT), event_time="ts")
    with pytest.raises(PlanError) as caught:
        build(p, events)
        p.validate()
    return str(caught.value)


def plain(p: hr.Pipeline) -> hr.Stream:
    return p.source("plain", TestSource([], schema=EVENT))


@pytest.mark.parametrize("build, message", [
    (lambda p, e: plain(p).dedupe("id"),
     r"step 'dedupe' \(test_dedupe.py:\d+\): the stream from 'plain' has no event time; declare it with "
     r"\.with_event_time\('field', max_out_of_orderness\) \(or event_time= on the source\) before the dedupe\. "
     r"Without event time Spark would remember every key for ever \(its dropDuplicates\); with it, give within="),
    (lambda p, e: plain(p).dedupe("id", within="1h"),
     r"the stream from 'plain' has no event time; declare it .* A dedupe forgets a key when the watermark passes "
     r"its first record's event time \+ within"),
    (lambda p, e: e.select("id", "v").dedupe("id", within="1h"),
     r"the stream from 'select' has no event time; declare it"),
    (lambda p, e: e.key_by("id").window(hr.Count(2)).count().dedupe("id"),
     r"the stream from 'window' has no event time: the results of window 'window' .* carry no event time: its "
     r"panes fire by count"),
    (lambda p, e: e.key_by("id").window(hr.Tumbling("1m")).count().dedupe("id", keep="last"),
     r"keep='last' on the results of a stateful step needs within=, how long a key's period lasts"),
    (lambda p, e: p.sql("SELECT id, v, ts FROM events").dedupe("id", keep="last"),
     r"keep='last' needs the stream's fields and their types, which it emits"),
    (lambda p, e: e.dedupe("id", keep="any"), r"keep must be 'first' or 'last', got 'any'"),
    (lambda p, e: e.dedupe("user"), r"unknown key field 'user'; the stream from 'events_event_time' has id, v, ts"),
    (lambda p, e: e.dedupe([]), r"keys must be a field name or a list of field names .*, got \[\]"),
    (lambda p, e: e.dedupe(["id", "id"]), r"a key field is named twice in \['id', 'id'\]"),
    (lambda p, e: e.dedupe("id", within="-1s"), r"within must not be negative, got '-1s'"),
    (lambda p, e: e.dedupe("id", within="soon"), r"step 'dedupe' within: cannot read 'soon' as a duration"),
    (lambda p, e: e.dedupe("id", within="1h").key_by("id").count(),
     r"step 'count' \(test_dedupe.py:\d+\): it reads the results of dedupe 'dedupe' \(test_dedupe.py:\d+\), and "
     r"this step is a rolling aggregate, which emits updates"),
    (lambda p, e: e.key_by("id").count().dedupe("id"),
     r"step 'dedupe' .*: the stream from 'count' has no event time: the results of rolling aggregate 'count' .* "
     r"carry no event time"),
    (lambda p, e: e.key_by("id").window(hr.Tumbling("1m")).count().dedupe("id").join(
        p.source("o", TestSource([], schema=LABEL), event_time="lt"), on={"id": "key"}, within="1s"),
     r"the left stream \('dedupe'\) is the results of a stateful step"),
    (lambda p, e: p.sql("SELECT id, count(*) AS n FROM dedupe GROUP BY id") if e.dedupe("id") else None,
     r"step 'sql' .*: it reads the results of dedupe 'dedupe' .*, and this step is an SQL query"),
])
@pytest.mark.fast
def test_a_dedupe_spark_could_not_run_or_would_keep_forever_is_refused(build, message):
    assert re.search(message, refusal(build)), refusal(build)


@pytest.mark.fast
def test_a_dedupe_keeps_a_pipeline_out_of_spark_s_real_time_mode():
    p = hr.Pipeline("first_only", trigger="real-time")
    orders = p.source("orders", hr.sources.Kafka("orders", schema=EVENT), event_time="ts")
    orders.dedupe("id").sink("out", hr.sinks.Kafka("firsts", exactly_once=False))
    with pytest.raises(PlanError, match=r"step 'dedupe' \(test_dedupe.py:\d+\) is a dedupe: Spark's real-time mode "
                                        r"does not run dropDuplicatesWithinWatermark"):
        p.validate()
