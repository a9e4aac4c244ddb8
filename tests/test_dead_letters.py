"""Bad input is never dropped silently: it reaches the dead-letter stream and the counts,
or, with fail_fast, stops the pipeline with a message naming the file and line."""

from __future__ import annotations

import pytest

import headrace as hr
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink

SCHEMA = {"order_id": "long", "amount": "double"}


def write_orders(folder) -> None:
    (folder / "json").mkdir(parents=True)
    (folder / "csv").mkdir()
    (folder / "json" / "a.jsonl").write_text('{"order_id": 1, "amount": 2.5}\n'
                                    'not json\n'
                                    '{"order_id": "x", "amount": 1.0}\n'
                                    '{"order_id": 2, "amount": 4.0}\n')
    (folder / "csv" / "b.csv").write_text("order_id,amount\n3,1.5\n4\n5,7.0\n")


# Spark's file source (the default reader) gives no line numbers: a dead letter's position is its file.
POSITIONS = {"spark": ("a.jsonl", "a.jsonl", "b.csv"), "python": ("a.jsonl:2", "a.jsonl:3", "b.csv:3")}


@pytest.mark.parametrize("reader", ["spark", "python"])
def test_bad_records_go_to_dead_letters_and_are_counted(spark, tmp_path, reader):
    write_orders(tmp_path / "in")
    p = hr.Pipeline("orders_dead_letters")
    json_orders = p.source("json_orders", hr.sources.Files(str(tmp_path / "in" / "json"), format="jsonl",
                                                           schema=SCHEMA, bounded=True, reader=reader))
    csv_orders = p.source("csv_orders", hr.sources.Files(str(tmp_path / "in" / "csv"), format="csv", schema=SCHEMA,
                                                         bounded=True, reader=reader))
    good, bad = TestSink(), TestSink()
    json_orders.union(csv_orders).sink("good", good)
    p.dead_letters().sink("bad", bad)

    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    result = run.wait()

    assert sorted(r["order_id"] for r in good.rows()) == [1, 2, 3, 5]
    dead = sorted(bad.rows(), key=lambda r: (r["source"] != "json_orders", r["position"], r["raw"] != "not json"))
    assert [(r["source"], r["position"].rsplit("/", 1)[-1], r["raw"]) for r in dead] == [
        ("json_orders", POSITIONS[reader][0], "not json"),
        ("json_orders", POSITIONS[reader][1], '{"order_id": "x", "amount": 1.0}'),
        ("csv_orders", POSITIONS[reader][2], "4"),
    ]
    assert "JSON" in dead[0]["error"] and "order_id" in dead[1]["error"]
    assert result.dead_letters == 3


@pytest.mark.parametrize("reader", ["spark", "python"])
def test_fail_fast_names_the_file_and_line(spark, tmp_path, reader):
    write_orders(tmp_path / "in")
    p = hr.Pipeline("orders_fail_fast")
    orders = p.source("orders", hr.sources.Files(str(tmp_path / "in" / "json"), format="jsonl", schema=SCHEMA,
                                                 bounded=True, fail_fast=True, reader=reader))
    orders.sink("out", TestSink())
    with pytest.raises(hr.SourceError) as error:
        hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet", handle_signals=False)
    where = {"spark": "a.jsonl: ", "python": "a.jsonl:2: "}[reader]
    assert str(error.value).startswith(f"source 'orders': {tmp_path / 'in' / 'json' / where}"), error.value
    assert "not json" in str(error.value)


def test_the_query_runs_to_each_branch_root_once_and_counts_the_scans_of_each_source(tmp_path):
    """Plain plan checks (no Spark): two sinks on one window share its root, so the window is
    planned once; a source feeding a window and its dead letters is scanned twice (Spark plans a
    tree), and the compiler knows it; a source split per batch into good rows and dead letters
    is scanned once."""
    from headrace.spark.compiler import query_roots, source_scans

    def orders(p, **event_time):
        return p.source("orders", hr.sources.Files(str(tmp_path), format="jsonl", schema="user string, t timestamp"),
                        **event_time)

    p = hr.Pipeline("window_beside_dead_letters")
    counts = orders(p, event_time="t", max_out_of_orderness="1s").key_by("user").window(hr.Tumbling("1m")).count()
    counts.sink("a", TestSink())
    counts.sink("b", TestSink())
    p.dead_letters().sink("dead", TestSink())
    assert query_roots(p.plan) == ["window", "orders"]  # the two sinks on the window: one root
    assert source_scans(p.plan) == {"orders": 2}

    q = hr.Pipeline("map_beside_dead_letters")
    orders(q).filter(hr.col("user") != "x").sink("a", TestSink())
    q.dead_letters().sink("dead", TestSink())
    assert query_roots(q.plan) == ["orders"]
    assert source_scans(q.plan) == {"orders": 1}
