"""Files(reader="spark"): an unbounded directory read by Spark's own file source, with headrace's
timestamps (ISO-8601 or epoch ms) and dead letters (named by file)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.errors import PlanError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink


def run_until_idle(pipeline: hr.Pipeline, state_dir: str) -> Any:
    run = PipelineRun(pipeline, state_dir=state_dir, progress="quiet").start()
    run.settle()
    run.request_stop("test done")
    return run.wait(until_exhausted=False)


def test_json_lines_with_both_timestamp_forms_and_dead_letters_by_file(spark: Any, tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text(json.dumps({"user": "ada", "n": 1, "ts": "2026-01-01T10:00:00Z"}) + "\n"
                                   + json.dumps({"user": "bob", "n": 2, "ts": 1767261600000}) + "\n")
    (inbox / "b.jsonl").write_text("not json\n" + json.dumps({"user": "cy", "n": "three", "ts": 0}) + "\n"
                                   + json.dumps({"user": "dee", "n": 4, "ts": "yesterday"}) + "\n"
                                   + json.dumps({"user": "eve", "n": 5, "ts": "2026-01-01 10:00:00"}) + "\n")
    for age, name in enumerate(("a.jsonl", "b.jsonl")):  # Spark takes the oldest file first
        os.utime(inbox / name, (1_700_000_000 + age, 1_700_000_000 + age))
    p = hr.Pipeline("native_files")
    out, dead = TestSink(), TestSink()
    p.source("events", hr.sources.Files(inbox, schema="user string, n long, ts timestamp", reader="spark",
                                        max_files_per_batch=1)).sink("out", out)
    p.dead_letters().sink("dead", dead)

    result = run_until_idle(p, str(tmp_path / "state"))

    at_ten = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert sorted((r["user"], r["n"], r["ts"].replace(tzinfo=UTC)) for r in out.rows()) == [
        ("ada", 1, at_ten), ("bob", 2, at_ten), ("eve", 5, at_ten)]
    errors = sorted((r["position"], r["raw"], r["error"].split(" of the ")[0].split(" that ")[0])
                    for r in dead.rows())
    assert errors == [("b.jsonl", "not json", "the line is not a JSON object"),
                      ("b.jsonl", '{"user": "cy", "n": "three", "ts": 0}', "the line is not a JSON object"),
                      ("b.jsonl", '{"user":"dee","n":4,"ts":"yesterday"}', "a timestamp or date")]
    assert [f for f in (report["numInputRows"] for report in result.progress) if f] == [2, 4]  # a file a batch
    assert result.dead_letters == 3


def test_dead_letters_are_counted_when_no_step_reads_them(spark: Any, tmp_path: Path) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"n": 1}\nnot json\n{"n": 2}\n{"n": "two"}\n')
    p = hr.Pipeline("native_files_counted")
    out = TestSink()
    p.source("numbers", hr.sources.Files(inbox, schema="n long", reader="spark")).sink("out", out)

    result = run_until_idle(p, str(tmp_path / "state"))

    assert sorted(r["n"] for r in out.rows()) == [1, 2]
    assert (result.input_rows, result.dead_letters) == (4, 2)


def test_csv_and_parquet(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "a.csv").write_text("user,n\nada,1\nbob,x\n")
    spark.createDataFrame([("cy", 3)], "user string, n long").write.parquet(str(tmp_path / "parquet"))
    p = hr.Pipeline("native_csv_parquet")
    out, dead = TestSink(), TestSink()
    csv = p.source("csv", hr.sources.Files(tmp_path / "csv", format="csv", schema="user string, n long",
                                           reader="spark"))
    parquet = p.source("parquet", hr.sources.Files(tmp_path / "parquet", format="parquet",
                                                   schema="user string, n long", reader="spark"))
    csv.union(parquet).sink("out", out)
    p.dead_letters().sink("dead", dead)
    assert "Spark's own file source" in p.explain()

    run_until_idle(p, str(tmp_path / "state"))

    assert sorted((r["user"], r["n"]) for r in out.rows()) == [("ada", 1), ("cy", 3)]
    assert [(r["position"], r["raw"]) for r in dead.rows()] == [("a.csv", "bob,x")]


def test_the_spark_reader_is_unbounded_and_never_fails_fast(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"reader='spark' reads an unbounded directory .*bounded=True and "
                                        r"fail_fast=True need reader='python'"):
        hr.sources.Files(tmp_path, schema="a long", reader="spark", bounded=True)
    with pytest.raises(PlanError, match=r"unknown reader 'java'; use one of python, spark"):
        hr.sources.Files(tmp_path, schema="a long", reader="java")
