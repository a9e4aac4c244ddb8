"""``headrace init DIR``: a new pipeline project with a pipeline file, a Python step it
imports, sample input, a test that runs the pipeline with the test kit, and a README.

>>> import tempfile, os
>>> folder = os.path.join(tempfile.mkdtemp(), "Shop-Orders")
>>> [os.path.relpath(p, folder) for p in create_project(folder)]  # doctest: +NORMALIZE_WHITESPACE
['pipeline.yaml', 'shop_orders_steps.py', 'input/orders.jsonl', 'test_pipeline.py', 'README.md']
"""

from __future__ import annotations

import os
import re

PIPELINE_YAML = """\
# The @NAME@ pipeline, described for headrace (the format: docs/pipeline-files.md).
# Check it without Spark: headrace validate pipeline.yaml     Run it: headrace run pipeline.yaml
pipeline: @NAME@

sources:
  orders:                 # JSON-lines files, read once: the run ends when they are done
    type: Files
    path: ${ORDERS_DIR:-input}
    format: jsonl
    schema: "order_id string, customer string, amount double"
    bounded: true

steps:
  - name: priced          # a Python function, by import path module:function
    from: orders
    map: @MODULE@:add_tax
    schema: "order_id string, customer string, amount double, total double"
  - name: big_orders      # a Spark SQL condition, run natively by Spark
    from: priced
    filter: "total >= 100"

sinks:
  shown:                  # printed, batch by batch
    type: Console
    from: big_orders
  saved:                  # JSON-lines files, exactly once
    type: Files
    from: big_orders
    path: ${OUTPUT_DIR:-output}
    format: jsonl
"""

STEPS_PY = '''\
"""The Python steps of the @NAME@ pipeline; pipeline.yaml names them as @MODULE@:FUNCTION."""

TAX_RATE = 0.2


def add_tax(order: dict) -> dict:
    """The order with its total, tax included."""
    return {**order, "total": round(order["amount"] * (1 + TAX_RATE), 2)}
'''

ORDERS_JSONL = """\
{"order_id": "o-1", "customer": "ada", "amount": 120.0}
{"order_id": "o-2", "customer": "grace", "amount": 45.5}
{"order_id": "o-3", "customer": "alan", "amount": 90.0}
"""

TEST_PY = '''\
"""Tests of the @NAME@ pipeline: its step function alone, then the whole pipeline file on a
local Spark with headrace's test kit (run them with pytest)."""

from pathlib import Path

import headrace as hr
from headrace.connectors.files_sink import read_rows
from headrace.testing import run_to_completion

from @MODULE@ import add_tax

PIPELINE_FILE = Path(__file__).with_name("pipeline.yaml")


def test_add_tax():
    assert add_tax({"order_id": "o-9", "customer": "ada", "amount": 10.0}) == {
        "order_id": "o-9", "customer": "ada", "amount": 10.0, "total": 12.0}


def test_the_pipeline_saves_the_big_orders(tmp_path, monkeypatch):
    orders = tmp_path / "orders"
    orders.mkdir()
    (orders / "orders.jsonl").write_text(
        '{"order_id": "a", "customer": "ada", "amount": 90.0}\\n'
        '{"order_id": "b", "customer": "bob", "amount": 50.0}\\n')
    monkeypatch.setenv("ORDERS_DIR", str(orders))
    monkeypatch.setenv("OUTPUT_DIR", str(tmp_path / "saved"))
    pipeline = hr.load_pipeline_file(PIPELINE_FILE)
    run_to_completion(pipeline, state_dir=str(tmp_path / "state"))
    assert read_rows(str(tmp_path / "saved"), "jsonl") == [
        {"order_id": "a", "customer": "ada", "amount": 90.0, "total": 108.0}]
'''

README_MD = """\
# @NAME@

A headrace pipeline: `headrace validate pipeline.yaml` checks it (no Spark),
`headrace run pipeline.yaml` runs it on `input/` (Ctrl-C stops it; the next run goes on from its
checkpoint in `.headrace/`), and `pytest` tests it.
"""


def project_name(directory: str) -> str:
    """The pipeline's name from the directory's: an identifier.

    >>> project_name("/tmp/Shop-Orders"), project_name("2024 stats")
    ('shop_orders', 'p_2024_stats')
    """
    name = re.sub(r"[\W_]+", "_", os.path.basename(os.path.abspath(directory))).strip("_").lower()
    if not name or name[0].isdigit():
        name = f"p_{name}" if name else "pipeline"
    return name


def create_project(directory: str) -> list[str]:
    """Write the project's files under ``directory`` (new, or empty); the paths written."""
    name = project_name(directory)
    module = f"{name}_steps"
    files = {
        "pipeline.yaml": PIPELINE_YAML,
        f"{module}.py": STEPS_PY,
        os.path.join("input", "orders.jsonl"): ORDERS_JSONL,
        "test_pipeline.py": TEST_PY,
        "README.md": README_MD,
    }
    if os.path.exists(directory) and (not os.path.isdir(directory) or os.listdir(directory)):
        raise FileExistsError(f"{directory} already exists and is not an empty directory; give a new directory")
    written = []
    for relative, template in files.items():
        path = os.path.join(directory, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(template.replace("@NAME@", name).replace("@MODULE@", module))
        written.append(path)
    return written
