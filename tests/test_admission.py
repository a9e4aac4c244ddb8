"""Admission control: fixed caps per micro-batch (files), adaptive batch sizing toward a target
duration, and the backlog a source left for later shown in the progress figures."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.environment import admission
from headrace.errors import PlanError
from headrace.runtime.progress import summarise
from headrace.testing import TestSink


def batches_of(result: Any) -> list[dict[str, Any]]:
    return [summarise(report) for report in result.progress if report["numInputRows"]]


def write_files(folder: Path, count: int, per_file: int) -> list[int]:
    folder.mkdir(parents=True, exist_ok=True)
    ids = []
    for number in range(count):
        rows = [{"id": number * per_file + i} for i in range(per_file)]
        write_in_order(folder / f"part-{number:02d}.jsonl", "".join(json.dumps(r) + "\n" for r in rows), number)
        ids += [r["id"] for r in rows]
    return ids


@pytest.mark.parametrize("reader", ["spark", "python"])
def test_bounded_files_in_batches_of_at_most_two_files(spark: Any, tmp_path: Path, reader: str) -> None:
    ids = write_files(tmp_path / "in", 5, 10)
    p = hr.Pipeline("files_capped")
    out = TestSink()
    p.source("rows", hr.sources.Files(tmp_path / "in", schema="id long", bounded=True,
                                      max_files_per_batch=2, reader=reader)).sink("out", out)
    result = hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")

    figures = batches_of(result)
    assert [f["input_rows"] for f in figures if f["input_rows"]] == [20, 20, 10]
    # the files left for later batches: headrace's reader reports them, Spark's file source does not
    lags = {"python": [3, 1, 0], "spark": [None, None, None]}[reader]
    assert [f["lag_files"] for f in figures if f["input_rows"]] == lags
    assert sorted(r["id"] for r in out.rows()) == ids


def test_adaptive_batches_grow_while_they_are_fast(spark: Any, tmp_path: Path) -> None:
    """A target far above what a batch takes: each batch may take twice the records of the one
    before, starting at FIRST_RECORDS; every record arrives once."""
    limit = 150_000
    p = hr.Pipeline("adaptive_grows", batch_duration="60s")
    out = TestSink()
    p.source("events", hr.sources.Generator("words", limit=limit, rows_per_batch=1_000_000)).sink("out", out)
    result = hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")

    rows = [f["input_rows"] for f in batches_of(result)]
    assert rows[0] == admission.FIRST_RECORDS
    assert sum(rows) == limit and len(out.rows()) == limit
    assert max(rows) > admission.FIRST_RECORDS  # grew (the runtime may set a cap a batch late)
    assert all(later <= 2 * earlier for earlier, later in zip(rows, rows[1:]))


def test_adaptive_batches_shrink_when_they_are_slow(spark: Any, tmp_path: Path) -> None:
    """A Python step that takes 0.1 ms a record against a 100 ms target: batches of 10,000
    records take over a second, so the caps come down toward about 1,000 records."""
    def slow(row: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.0001)
        return {"line": row["line"]}

    limit = 30_000
    p = hr.Pipeline("adaptive_shrinks", batch_duration="100ms")
    out = TestSink()
    (p.source("events", hr.sources.Generator("words", limit=limit, rows_per_batch=1_000_000))
     .map(slow, schema={"line": "string"}).sink("out", out))
    result = hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")

    rows = [f["input_rows"] for f in batches_of(result)]
    assert rows[0] == admission.FIRST_RECORDS
    assert sum(rows) == limit and len(out.rows()) == limit
    assert min(rows[:-1]) <= admission.FIRST_RECORDS // 2  # came down (the last batch takes what is left)


@pytest.mark.fast
def test_batch_duration_is_checked() -> None:
    with pytest.raises(PlanError, match=r"pipeline 'p': batch_duration: cannot read 'soon' as a duration"):
        hr.Pipeline("p", batch_duration="soon")
    with pytest.raises(PlanError, match=r"pipeline 'p': batch_duration must be at least 50ms, got '10ms'"):
        hr.Pipeline("p", batch_duration="10ms")
    with pytest.raises(PlanError, match=r"pipeline 'p': batch_duration sizes micro-batches; a real-time "
                                        r"pipeline has none"):
        hr.Pipeline("p", batch_duration="1s", trigger="real-time")
    with pytest.raises(PlanError, match=r"max_files_per_batch must be a whole number of at least 1, got 0"):
        hr.sources.Files("/tmp", schema="id long", max_files_per_batch=0)
