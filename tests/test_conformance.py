"""Every case of the conformance suite kept with the tests (``tests/conformance/cases.json``),
through real pipelines on Spark: the per_event, micro_batch and none models."""

import json
from pathlib import Path

import pytest

from headrace.testing.conformance import check

CASES_FILE = Path(__file__).resolve().parent / "conformance" / "cases.json"
CASES = json.loads(CASES_FILE.read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['id']}[{c['watermark_model']}]" for c in CASES])
def test_case(case, spark, tmp_path):
    assert check(case, str(tmp_path)) == []


@pytest.mark.fast
def test_every_model_is_covered():
    assert {c["watermark_model"] for c in CASES} == {"per_event", "micro_batch", "none"}
