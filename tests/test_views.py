"""Queryable views without Spark: the serving store's transactions and reads, and the refusals a
pipeline gets when it is built. Their runs are in tests/test_sink_matrix.py (a view beside the other
sinks and the dead letters, killed between the commits) and tests/test_server.py (served)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

import headrace as hr
from headrace.connectors.view_store import ViewReader, ViewWriter
from headrace.errors import PlanError

pytestmark = pytest.mark.fast  # needs no JVM and no service


def test_a_batch_is_applied_once_and_a_key_keeps_its_last_row(tmp_path: Path):
    path = str(tmp_path / "views.sqlite")
    writer = ViewWriter(path)
    assert writer.apply("totals", ("word",), 0, 1000, [("a", '{"n": 1}'), ("b", '{"n": 1}'), ("a", '{"n": 2}')])
    assert not writer.apply("totals", ("word",), 0, 1000, [("a", '{"n": 99}')])  # a replay changes nothing
    assert writer.apply("totals", ("word",), 1, 2000, [("b", '{"n": 5}')])
    with sqlite3.connect(path) as db:  # SQLite's own client
        assert db.execute("SELECT key, value, batch_id FROM rows ORDER BY key").fetchall() == [
            ("a", '{"n": 2}', 0), ("b", '{"n": 5}', 1)]
        assert db.execute("SELECT batch_id, watermark_ms FROM views").fetchall() == [(1, 2000)]
    reader = ViewReader(path)
    as_of, value = reader.lookup("totals", "a")
    assert (as_of.batch_id, as_of.watermark_ms, as_of.key_columns, value) == (1, 2000, ("word",), {"n": 2})
    assert reader.lookup("totals", "zz")[1] is None
    assert reader.changed_since("totals", 0)[1] == [("b", {"n": 5})]


def test_a_prefix_scan_pages_by_key(tmp_path: Path):
    path = str(tmp_path / "views.sqlite")
    keys = [f"{word}|{n}" for word in ("ab", "abc", "b") for n in range(3)]
    ViewWriter(path).apply("v", ("word", "n"), 0, None, [(k, json.dumps({"k": k})) for k in reversed(keys)])
    reader = ViewReader(path)
    pages, cursor = [], None
    while True:
        _, rows = reader.scan("v", "ab", cursor, 2)
        if not rows:
            break
        pages.append([key for key, _ in rows])
        cursor = rows[-1][0]
    assert pages == [["abc|0", "abc|1"], ["abc|2", "ab|0"], ["ab|1", "ab|2"]]  # by the keys' text: "c" < "|"
    assert [key for key, _ in reader.scan("v", "ab|", None, 10)[1]] == ["ab|0", "ab|1", "ab|2"]
    with pytest.raises(KeyError):
        reader.lookup("nope", "a")


def test_a_view_without_keys_is_refused_when_the_pipeline_is_built():
    p = hr.Pipeline("views")
    source = hr.sources.TestSource([[{"user": "a", "n": 1}]], schema={"user": "string", "n": "long"})
    clicks = p.source("clicks", source)
    with pytest.raises(PlanError, match=r"sink 'raw' \(test_views.py:\d+\): a view needs the column\(s\) naming each "
                                        r"row: give hr.sinks.View\(key=\[...\]\)"):
        clicks.queryable("raw")
    with pytest.raises(PlanError, match=r"sink 'by_day' \(test_views.py:\d+\): key column\(s\) \['day'\] are not in "
                                        r"the stream's columns \['user', 'n'\]"):
        clicks.sink("by_day", hr.sinks.View(key="day"))
    clicks.key_by("user").sum("n").queryable("totals")  # a keyed aggregate gives its keys
    assert p.plan.nodes["totals"].connector.key == ("user",)
