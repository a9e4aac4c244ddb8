"""Exact counts of the stateless steps Spark fuses with their neighbours (filters, flat maps, joins
with a table, unions, fused Python stages), read from Spark's SQL metrics under each step's marker
(``headrace/spark/marked_counts.py``), against plain Python counting the same records. Both ways a
batch's values are read: in ``foreachBatch`` (two sinks of one stream) and from Spark's store of
SQL executions (Spark's own file writer)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from input_files import write_in_order

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink

NAMES = [{"k": k, "name": f"name {k}"} for k in (0, 1, 2, 4)]  # no 3: its records find no name
SCHEMA = {"k": "long", "v": "long"}
NAMED = {"k": "long", "v": "long", "name": "string"}


def parts() -> list[list[dict[str, int]]]:
    return [[{"k": v % 5, "v": v} for v in range(part * 12, part * 12 + 12)] for part in range(3)]


def write_parts(folder: Path) -> None:
    folder.mkdir()
    for number, records in enumerate(parts()):
        lines = [json.dumps(r) for r in records] + ["not a record"]
        write_in_order(folder / f"{number}.jsonl", "\n".join(lines) + "\n", number)


def expected(records: list[dict[str, int]]) -> dict[str, int]:
    """Each step's records in one batch, as plain Python counts them."""
    kept = [r for r in records if r["v"] % 3 != 0]
    copies = [r for r in kept for _ in range(r["v"] % 2 + 1)]
    names = {n["k"] for n in NAMES}
    named = [r for r in copies if r["k"] in names]
    odd = [r for r in named if r["v"] % 5 != 0]  # after a map that hands on every record
    big = [r for r in kept if r["v"] > 20]
    return {"src": len(records) + 1, "kept": len(kept), "copies": len(copies), "named": len(named),
            "tagged": len(named), "odd": len(odd), "big": len(big), "both": len(odd) + len(big)}


def pipeline(folder: Path, *sinks: Any, dead_letters: Any = None) -> hr.Pipeline:
    p = hr.Pipeline("marked")
    src = p.source("src", hr.sources.Files(str(folder), schema=SCHEMA, bounded=True, max_files_per_batch=1))
    kept = src.filter(hr.col("v") % 3 != 0, name="kept")
    copies = kept.flat_map(lambda r: [r] * (r["v"] % 2 + 1), schema=SCHEMA, name="copies")
    named = copies.join(p.table("names", NAMES), on="k", name="named")
    tagged = named.map(lambda r: {**r, "name": r["name"].upper()}, schema=NAMED, name="tagged")
    odd = tagged.filter(lambda r: r["v"] % 5 != 0, name="odd")  # fused with the map: one Python stage
    big = kept.filter(hr.col("v") > 20, name="big").map(lambda r: {**r, "name": "big"}, schema=NAMED, name="as_named")
    both = odd.union(big, name="both")
    for index, sink in enumerate(sinks):
        both.sink(f"out{index}", sink)
    if dead_letters is not None:
        p.dead_letters().sink("bad", dead_letters)
    return p


def observed_metrics(run: PipelineRun) -> set[str]:
    return {name for report in run.batches.reports for name in report.get("observedMetrics") or {}}


def counted_per_batch(run: PipelineRun) -> list[dict[str, int]]:
    return [{step: n for step, n in figures["step_records"].items() if step != "as_named"}
            for figures in run.batches.figures if figures["input_rows"]]


def test_each_fused_step_is_counted_exactly_beside_two_sinks(spark, tmp_path):
    """Two sinks of one stream: the batch runs in foreachBatch, persisted, and each marked step's
    count is read from the batch's plan once both have written it."""
    write_parts(tmp_path / "in")
    out = TestSink()
    run = PipelineRun(pipeline(tmp_path / "in", out, hr.sinks.Null()), state_dir=str(tmp_path / "state"),
                      progress="quiet").start()
    result = run.wait()
    assert counted_per_batch(run) == [expected(records) for records in parts()]
    assert len(out.rows()) == sum(expected(records)["both"] for records in parts())
    assert result.dead_letters == 3 and [f["dead_letters"] for f in run.batches.figures if f["input_rows"]] == [1, 1, 1]


def test_each_step_is_counted_exactly_beside_the_dead_letters(spark, tmp_path):
    """The dead letters beside: the query runs to the source and each micro-batch is split in
    foreachBatch, where its steps are lowered as plain DataFrames and run by each sink's own write;
    their markers' counts come from Spark's store of SQL executions, the dead letters' among them."""
    write_parts(tmp_path / "in")
    out, bad = TestSink(), TestSink()
    run = PipelineRun(pipeline(tmp_path / "in", out, dead_letters=bad), state_dir=str(tmp_path / "state"),
                      progress="quiet").start()
    result = run.wait()
    assert counted_per_batch(run) == [{**expected(records), "dead_letters": 1} for records in parts()]
    assert len(out.rows()) == sum(expected(records)["both"] for records in parts()) and len(bad.rows()) == 3
    assert result.dead_letters == 3  # split off per batch: counted by the source's observed metric, as before


def test_each_fused_step_is_counted_exactly_under_sparks_own_writer(spark, tmp_path):
    """One Files sink, which Spark's own writer writes: the counts come from Spark's store of SQL
    executions, and the rows written are the ones counted."""
    write_parts(tmp_path / "in")
    run = PipelineRun(pipeline(tmp_path / "in", hr.sinks.Files(str(tmp_path / "out"), format="jsonl")),
                      state_dir=str(tmp_path / "state"), progress="quiet").start()
    result = run.wait()
    assert counted_per_batch(run) == [expected(records) for records in parts()]
    assert result.dead_letters == 3
    written = [line for path in (tmp_path / "out").glob("part-*") for line in path.read_text().splitlines()]
    assert Counter(json.loads(line)["name"] == "big" for line in written)[True] == \
        sum(expected(records)["big"] for records in parts())


def write_events(folder: Path, offset: int) -> list[dict[str, int]]:
    """Two files of events a second apart; returns them."""
    folder.mkdir()
    events = [{"k": v % 4, "v": v + offset, "t": 1_000 * v} for v in range(20)]
    for number in range(2):
        lines = [json.dumps(e) for e in events[number * 10:(number + 1) * 10]]
        write_in_order(folder / f"{number}.jsonl", "\n".join(lines) + "\n", number)
    return events


def test_a_union_of_two_sources_and_an_sql_step_before_a_window_are_counted_exactly(spark, tmp_path):
    """Two sources with event time, united, then an SQL step and a flat map before a window: both
    sources' control rows (their watermarks' flush at the end) pass the union and are taken off,
    and the counts equal plain Python's over the run."""
    bids = write_events(tmp_path / "bids", 0)
    asks = write_events(tmp_path / "asks", 100)
    schema = {"k": "long", "v": "long", "t": "timestamp"}
    p = hr.Pipeline("marked_union")
    streams = [p.source(name, hr.sources.Files(str(tmp_path / name), schema=schema, bounded=True,
                                               max_files_per_batch=1), event_time="t") for name in ("bids", "asks")]
    streams[0].union(streams[1], name="both")  # read by name in the SQL step below
    fours = p.sql("SELECT k, v, t FROM both WHERE v % 4 <> 1", name="fours")
    doubled = fours.flat_map(lambda r: [r, r] if r["v"] % 3 == 0 else [r], schema=schema, name="doubled")
    windows = doubled.key_by("k").window(hr.Tumbling("5s"), name="per_5s").aggregate(n=hr.count())
    windows.sink("out", hr.sinks.Null())
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    run.wait()

    counted: Counter[str] = Counter()
    for figures in run.batches.figures:
        counted.update(figures["step_records"])
    events = bids + asks
    kept = [e for e in events if e["v"] % 4 != 1]
    doubled_rows = [e for e in kept for _ in range(2 if e["v"] % 3 == 0 else 1)]
    windows_out = {(e["k"], e["t"] // 5_000) for e in doubled_rows}
    assert {step: counted[step] for step in ("bids", "asks", "both", "fours", "doubled", "per_5s")} == {
        "bids": 20, "asks": 20, "both": 40, "fours": len(kept), "doubled": len(doubled_rows),
        "per_5s": len(windows_out)}


def test_a_source_read_once_counts_its_dead_letters_by_its_good_rows_marker(spark, tmp_path):
    """A pipeline's one source, read once, its good rows read by the query: its dead letters are
    its input rows less its good rows' marker, with no observed metric on its rows (which Spark
    evaluates row by row above the scan); every step's count and the dead letters exact."""
    write_parts(tmp_path / "in")
    p = hr.Pipeline("once")
    src = p.source("src", hr.sources.Files(str(tmp_path / "in"), schema=SCHEMA, bounded=True, max_files_per_batch=1))
    kept = src.filter(hr.col("v") % 3 != 0, name="kept")
    tens = kept.select("k", (hr.col("v") * 10).alias("v"), name="tens")
    tens.flat_map(lambda r: [r] * (r["v"] % 4 // 2 + 1), schema=SCHEMA, name="copies").sink("out", hr.sinks.Null())
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    result = run.wait()

    def model(records: list[dict[str, int]]) -> dict[str, int]:
        kept_rows = [r for r in records if r["v"] % 3 != 0]
        return {"src": len(records) + 1, "kept": len(kept_rows), "tens": len(kept_rows),
                "copies": sum(r["v"] * 10 % 4 // 2 + 1 for r in kept_rows)}
    assert [f["step_records"] for f in run.batches.figures if f["input_rows"]] == [model(r) for r in parts()]
    assert [f["dead_letters"] for f in run.batches.figures if f["input_rows"]] == [1, 1, 1]
    assert result.dead_letters == 3 and not any(name.startswith("hr_dead_letters") for name in observed_metrics(run))


def test_an_sql_step_that_only_projects_is_counted_as_its_input_with_no_marker(spark, tmp_path):
    """An SQL step that only projects its one stream gives a row per record: it is counted as its
    input, with no marker cutting its generated code; an SQL step with a WHERE after it is marked.
    Two sinks, a bad line in each file; every count against plain Python's."""
    from headrace.spark.compiler import compile_plan
    from headrace.spark.marked_counts import marker

    write_parts(tmp_path / "in")
    p = hr.Pipeline("projected")
    p.source("src", hr.sources.Files(str(tmp_path / "in"), schema=SCHEMA, bounded=True, max_files_per_batch=1))
    p.sql("SELECT k, v * 2 AS doubled, upper(concat('k', k)) AS label FROM src", name="projected")
    some = p.sql("SELECT k, doubled FROM projected WHERE doubled % 3 <> 0", name="some")
    out = TestSink()
    some.sink("out", out)
    some.sink("null", hr.sinks.Null())
    positions = list(p.plan.nodes)
    compiled = compile_plan(p.plan, spark, str(tmp_path / "compiled"), str(tmp_path / "probe"))
    explained = compiled.sink_frames["out"]._jdf.queryExecution().analyzed().toString()
    assert f"-{marker(positions.index('some'))}" in explained
    assert f"-{marker(positions.index('projected'))}" not in explained
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    result = run.wait()

    def model(records: list[dict[str, int]]) -> dict[str, int]:
        return {"src": len(records) + 1, "projected": len(records),
                "some": sum(1 for r in records if r["v"] * 2 % 3 != 0)}
    assert [f["step_records"] for f in run.batches.figures if f["input_rows"]] == [model(r) for r in parts()]
    assert sorted((r["k"], r["doubled"]) for r in out.rows()) == sorted(
        (r["k"], r["v"] * 2) for records in parts() for r in records if r["v"] * 2 % 3 != 0)
    assert result.dead_letters == 3
