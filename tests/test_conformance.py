"""Every micro_batch case of the shared conformance suite, through real pipelines on Spark."""

import pytest
from conformance import as_multiset, load_cases, run_micro_batch_case

MICRO_BATCH = load_cases(model="micro_batch")


@pytest.mark.parametrize("case", MICRO_BATCH, ids=[c["id"] for c in MICRO_BATCH])
def test_micro_batch_case(case, spark, tmp_path):
    output, dropped, spark_dropped = run_micro_batch_case(case, str(tmp_path))
    assert as_multiset(output) == as_multiset(case["expected_output"])
    expected_dropped = [{k: e[k] for k in ("key", "value", "event_time")} for e in case["expected_dropped"]]
    assert as_multiset([{k: e[k] for k in ("key", "value", "event_time")} for e in dropped]) == \
        as_multiset(expected_dropped)
    assert spark_dropped == len(expected_dropped), "Spark dropped a different number of late rows"


def test_cases_are_found():
    assert len(MICRO_BATCH) >= 8
