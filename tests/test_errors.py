"""A user function that fails while records flow: the pipeline stops with a StepFunctionError
that names the step, the function with its file and line, and the offending record."""

from __future__ import annotations

import ast
import re
import sys
from typing import Any

import pandas as pd
import pytest
from pyspark import cloudpickle

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

# The functions below must reach Spark's Python workers by value (tests/ is not on their path).
cloudpickle.register_pickle_by_value(sys.modules[__name__])

FILE = "test_errors.py"
ORDERS = {"order_id": "long", "amount": "string"}
GOOD = {"order_id": 1, "amount": "12"}
BAD = {"order_id": 2, "amount": "twelve"}


def line_of(fn: Any) -> int:
    return fn.__code__.co_firstlineno


def run_failing(pipeline: hr.Pipeline, tmp_path: Any) -> str:
    with pytest.raises(hr.StepFunctionError) as error:
        run_to_completion(pipeline, state_dir=str(tmp_path))
    message = str(error.value)
    assert "\n" not in message, "the error is one line"
    return message


def split_record(message: str) -> tuple[str, dict[str, Any]]:
    """The message before `` (record: {...})`` and the record it shows, as a dict."""
    text, _, shown = message.partition(" (record: ")
    assert shown.endswith(")"), message
    return text, ast.literal_eval(shown[:-1])


def orders_pipeline(name: str, batches: list[list[dict[str, Any]]] | None = None) -> tuple[hr.Pipeline, hr.Stream]:
    p = hr.Pipeline(name)
    return p, p.source("orders", TestSource(batches or [[GOOD, BAD]], schema=ORDERS))


def parse(order: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": order["order_id"], "cents": int(order["amount"]) * 100}


def test_a_map_that_raises(spark, tmp_path):
    p, orders = orders_pipeline("raises")
    orders.map(parse, schema={"order_id": "long", "cents": "long"}, name="parse").sink("out", TestSink())
    text, record = split_record(run_failing(p, tmp_path))
    assert text == (f"step 'parse' (parse at {FILE}:{line_of(parse)}) raised ValueError: invalid literal for int() "
                    "with base 10: 'twelve'")
    assert record == BAD


def describe(order: dict[str, Any]) -> str:
    return f"order {order['order_id']}"


def test_a_map_that_returns_a_str(spark, tmp_path):
    p, orders = orders_pipeline("returns_str")
    orders.map(describe, schema={"text": "string"}, name="describe").sink("out", TestSink())
    text, record = split_record(run_failing(p, tmp_path))
    assert text == (f"step 'describe' (describe at {FILE}:{line_of(describe)}) returned a str ('order 1'); a map "
                    "step must return a dict or a dataclass instance")
    assert record == GOOD


def as_number(order: dict[str, Any]) -> dict[str, Any]:
    amount = order["amount"]
    return {"order_id": order["order_id"], "amount": int(amount) if amount.isdigit() else amount}


def test_a_field_of_the_wrong_type_for_the_declared_schema(spark, tmp_path):
    p, orders = orders_pipeline("wrong_type")
    orders.map(as_number, schema={"order_id": "long", "amount": "long"}, name="as_number").sink("out", TestSink())
    text, record = split_record(run_failing(p, tmp_path))
    assert text == (f"step 'as_number' (as_number at {FILE}:{line_of(as_number)}) returned field 'amount' = "
                    "'twelve' (str), which does not fit its declared type int64")
    assert record == BAD  # what the function returned for it


def is_large(order: dict[str, Any]) -> bool:
    return float(order["amount"]) > 10


def test_the_failing_step_of_a_fused_chain_is_the_one_named(spark, tmp_path):
    """Three Python steps run as one stage; the error still names the step that failed."""
    p, orders = orders_pipeline("chain")
    (orders.map(lambda o: {**o, "amount": o["amount"].strip()}, schema=ORDERS, name="clean")
     .filter(is_large, name="large")
     .map(lambda o: {"order_id": o["order_id"]}, schema={"order_id": "long"}, name="ids")
     .sink("out", TestSink()))
    assert "fused Python stage #1 (mapInArrow: clean -> large -> ids)" in p.explain()
    text, record = split_record(run_failing(p, tmp_path))
    assert text == (f"step 'large' (is_large at {FILE}:{line_of(is_large)}) raised ValueError: could not convert "
                    "string to float: 'twelve'")
    assert record == BAD


def explode(order: dict[str, Any]) -> Any:
    return len(order["amount"])


def test_a_flat_map_that_returns_no_iterable(spark, tmp_path):
    p, orders = orders_pipeline("flat", [[GOOD]])
    orders.flat_map(explode, schema={"n": "long"}, name="explode").sink("out", TestSink())
    text, record = split_record(run_failing(p, tmp_path))
    assert text == (f"step 'explode' (explode at {FILE}:{line_of(explode)}) returned an int (2); a flat_map step "
                    "must return an iterable of dicts")
    assert record == GOOD


def region_of(order: dict[str, Any]) -> str:
    return {"12": "north"}[order["amount"]]


def test_a_key_function_that_raises(spark, tmp_path):
    p, orders = orders_pipeline("key_fn")
    orders.key_by(region_of, name="region").count().sink("out", TestSink())
    text, record = split_record(run_failing(p, tmp_path))
    assert text == f"step 'region_fn' (region_of at {FILE}:{line_of(region_of)}) raised KeyError: 'twelve'"
    assert record == BAD


def add_amounts(total: dict[str, Any], order: dict[str, Any]) -> dict[str, Any]:
    return {**order, "amount": str(int(total["amount"]) + int(order["amount"]))}


def test_a_reduce_function_that_raises(spark, tmp_path):
    p, orders = orders_pipeline("reduce_fails", [[GOOD, {"order_id": 1, "amount": "x"}]])
    orders.key_by("order_id").reduce(add_amounts, name="totals").sink("out", TestSink())
    message = run_failing(p, tmp_path)
    assert message.startswith(f"step 'totals' (add_amounts at {FILE}:{line_of(add_amounts)}) raised ValueError: "
                              "invalid literal for int() with base 10: 'x'")
    assert "(accumulated: {'order_id': 1, 'amount': '12'}, record: {'order_id': 1, 'amount': 'x'})" in message


def to_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return frame.to_dict("records")


def test_a_batch_step_that_returns_the_wrong_kind_of_batch(spark, tmp_path):
    p, orders = orders_pipeline("batches", [[GOOD]])
    orders.map_batches(to_rows, format="pandas", name="rows").sink("out", TestSink())
    message = run_failing(p, tmp_path)
    assert re.fullmatch(rf"step 'rows' \(to_rows at {FILE}:{line_of(to_rows)}\) returned a list \(.*\); a "
                        r"map_batches step with format='pandas' must return a pandas DataFrame", message), message


def test_good_records_before_a_failure_are_not_lost_silently(spark, tmp_path):
    """A failure in a later micro-batch stops the pipeline after the earlier batches were written."""
    p, orders = orders_pipeline("later_failure", [[GOOD], [BAD]])
    sink = TestSink()
    orders.map(parse, schema={"order_id": "long", "cents": "long"}, name="parse").sink("out", sink)
    message = run_failing(p, tmp_path)
    assert message.startswith(f"step 'parse' (parse at {FILE}:{line_of(parse)}) raised ValueError")
    assert sink.rows() == [{"order_id": 1, "cents": 1200}]


def test_a_postgres_table_whose_columns_do_not_fit_the_stream_is_refused_before_the_first_batch(spark, pg,
                                                                                                 tmp_path):
    from conftest import PG_DSN

    table = f"hr_err_schema_{abs(hash(str(tmp_path))) % 10**8}"
    pg.execute(f'DROP TABLE IF EXISTS "{table}"')
    pg.execute(f'CREATE TABLE "{table}" (order_id bigint, day date)')
    p, orders = orders_pipeline("sink_schema", [[], [], [GOOD]])
    line = line_of(test_a_postgres_table_whose_columns_do_not_fit_the_stream_is_refused_before_the_first_batch) + 9
    orders.select("order_id", day=hr.col("order_id")).sink("db", hr.sinks.Postgres(table, dsn=PG_DSN))
    with pytest.raises(hr.SinkError) as error:
        run_to_completion(p, state_dir=str(tmp_path / "a"))
    assert str(error.value) == (
        f"sink 'db' ({FILE}:{line}): the stream's column 'day' is a long (PostgreSQL bigint), and column 'day' of "
        f"table '{table}' is a date, which PostgreSQL cannot cast it to (cannot cast type bigint to date); cast the "
        "column in the pipeline, or change the table's column")
    assert not list(tmp_path.glob("a/**/commits/0"))  # refused at start: no micro-batch ran
    p, orders = orders_pipeline("sink_columns", [[GOOD]])
    orders.select("order_id", when=hr.col("amount")).sink("db", hr.sinks.Postgres(table, dsn=PG_DSN))
    with pytest.raises(hr.SinkError, match=rf"sink 'db' .*: table '{table}' has no column 'when' \(it has "
                                           r"order_id, day\); add it to the table or drop it from the stream"):
        run_to_completion(p, state_dir=str(tmp_path / "b"))
    assert pg.execute(f'SELECT count(*) FROM "{table}"').fetchone() == (0,)
    pg.execute(f'DROP TABLE "{table}"')
