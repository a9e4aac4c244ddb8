"""Every micro_batch case of the shared conformance suite, through real pipelines on Spark
(scripts/test.sh runs all the cases with ``python -m headrace.testing.conformance``)."""

import json
from pathlib import Path

import pytest

from headrace.testing.conformance import check

CASES_FILE = Path(__file__).resolve().parent / "conformance" / "cases.json"
MICRO_BATCH = [c for c in json.loads(CASES_FILE.read_text()) if c["watermark_model"] == "micro_batch"]


@pytest.mark.parametrize("case", MICRO_BATCH, ids=[c["id"] for c in MICRO_BATCH])
def test_micro_batch_case(case, spark, tmp_path):
    assert check(case, str(tmp_path)) == []


def test_cases_are_found():
    assert len(MICRO_BATCH) >= 8
