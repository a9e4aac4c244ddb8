"""Bad input is never dropped silently: it reaches the dead-letter stream and the counts,
or, with fail_fast, stops the pipeline with a message naming the file and line."""

from __future__ import annotations

import json

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


@pytest.mark.fast
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


BAD_TIMES_JSONL = ('\ufeff{ "id": 1, "ts": "yesterday" }\r\n'  # a byte order mark before the first line
                   '{"id":2,"ts":"2026-01-01T10:00:00Z"}\r\n'
                   '\r\n'
                   '   \t\n'
                   '  {"ts": "3 pm",   "id": 3}  \r\n'
                   '{"id": 4, "ts": "caf\\u00e9"}\n'
                   '{"id": "five", "ts": 0}\n'
                   '{"id": 6, "ts": 1767261600000}\n'
                   'not json\t\n')
BAD_TIMES_CSV = "id,ts\n1,yesterday\n2,2026-01-01T10:00:00Z\n3,3 pm\nfour,0\n5\n6,1767261600000\n"


def _good_or_dead(line: str, format: str) -> str:
    """Plain Python: "good" for a record whose id is a whole number and whose ts is ISO-8601 text
    or epoch milliseconds, "dead" for any other line, "" for a blank line."""
    from datetime import datetime

    if not line.strip():
        return ""
    if format == "csv":
        fields = line.split(",")
        if len(fields) != 2 or not fields[0].isdigit():
            return "dead"
        record = {"id": int(fields[0]), "ts": int(fields[1]) if fields[1].isdigit() else fields[1]}
    else:
        try:
            record = json.loads(line)
        except ValueError:
            return "dead"
    if not isinstance(record.get("id"), int) or isinstance(record["id"], bool):
        return "dead"
    if isinstance(record["ts"], int):
        return "good"
    try:
        datetime.fromisoformat(record["ts"])
    except ValueError:
        return "dead"
    return "good"


@pytest.mark.parametrize("format", ["jsonl", "csv"])
@pytest.mark.parametrize("reader", ["spark", "python"])
def test_a_dead_letter_carries_its_line_as_written(spark, tmp_path, reader, format):
    """A record whose timestamp does not convert, like one that does not parse, goes to the dead
    letters with its line as the file holds it (spaces, key order, escapes), whichever reader."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    data = (BAD_TIMES_JSONL if format == "jsonl" else BAD_TIMES_CSV).encode()
    (inbox / f"a.{format}").write_bytes(data)
    p = hr.Pipeline("dead_lines_as_written")
    good, bad = TestSink(), TestSink()
    p.source("events", hr.sources.Files(str(inbox), format=format, schema="id long, ts timestamp", bounded=True,
                                        reader=reader)).sink("good", good)
    p.dead_letters().sink("bad", bad)

    result = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start().wait()

    lines = data.decode("utf-8-sig").splitlines()[format == "csv":]  # the file's own lines (a CSV: less its header)
    verdicts = [_good_or_dead(line, format) for line in lines]
    assert sorted(r["raw"] for r in bad.rows()) == sorted(line for line, v in zip(lines, verdicts) if v == "dead")
    assert sorted(r["id"] for r in good.rows()) == [2, 6]
    assert (result.input_rows, result.dead_letters) == (len(lines) - verdicts.count(""), verdicts.count("dead"))


@pytest.mark.parametrize("reader", ["spark", "python"])
def test_fail_fast_quotes_the_bad_line_as_written_and_blank_lines_are_no_records(spark, tmp_path, reader):
    inbox = tmp_path / "in"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('\n{"id": 1, "ts": "2026-01-01T10:00:00Z"}\n  \n{"id":2,"ts":1767261600000}\n\n')

    def fail_fast_run(name: str) -> object:
        p = hr.Pipeline(name)
        p.source("events", hr.sources.Files(str(inbox), schema="id long, ts timestamp", bounded=True, fail_fast=True,
                                            reader=reader)).sink("out", out := TestSink())
        result = hr.run(p, state_dir=str(tmp_path / name), progress="quiet", handle_signals=False)
        assert sorted(r["id"] for r in out.rows()) == [1, 2]
        return result

    result = fail_fast_run("blank_lines")
    assert (result.input_rows, result.dead_letters) == (2, 0)
    bad_line = '{ "id": 3,  "ts": "noon" }'
    (inbox / "b.jsonl").write_text(bad_line + "\n")
    with pytest.raises(hr.SourceError) as error:
        fail_fast_run("bad_line")
    assert "b.jsonl" in str(error.value) and bad_line in str(error.value)
