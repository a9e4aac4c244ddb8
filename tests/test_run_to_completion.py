"""The test kit's ``run_to_completion`` on a state dir of the caller's: a run that read its input
to the end is refused, saying so, rather than read again into no rows."""

from __future__ import annotations

import pytest

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

BATCHES = [[{"n": 1}, {"n": 2}], [{"n": 3}]]


def numbers() -> hr.Pipeline:
    p = hr.Pipeline("finished_numbers")
    p.source("numbers", TestSource(BATCHES, schema={"n": "long"})).sink("out", TestSink())
    return p


def test_a_state_dir_holding_a_finished_run_is_refused_and_fresh_starts_over(spark, tmp_path):
    state = str(tmp_path / "state")
    every_number = sorted(record["n"] for batch in BATCHES for record in batch)
    assert sorted(r["n"] for r in run_to_completion(numbers(), state_dir=state)["out"]) == every_number

    with pytest.raises(hr.HeadraceError) as refused:
        run_to_completion(numbers(), state_dir=state)
    assert str(refused.value) == (
        f"pipeline 'finished_numbers': the state dir {state} holds a run that read the input to its end (every "
        "source exhausted, every batch committed): run on it again, the pipeline would read nothing and return no "
        "rows; pass a new state_dir (or none: a temporary one), or fresh=True to forget that run")

    assert sorted(r["n"] for r in run_to_completion(numbers(), state_dir=state, fresh=True)["out"]) == every_number
