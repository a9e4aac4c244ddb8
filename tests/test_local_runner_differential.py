"""Differential tests of the local runner: the generated pipelines of tests/model/ run through
``run_locally`` and through the reference interpreter (fast, many examples), and a few through
both ``run_locally`` and Spark (``run_to_completion``).

The local runner reads TestSources and writes to TestSinks, so a spec's micro-batches become
TestSource steps without its bad lines (a file source's dead letters), its sinks TestSinks, and
the sources of a union get the same number of steps (empty ones added, for the model as well, so
that both end at the same step); specs with SQL are left out."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from model import interpreter
from model.build import _stateful, _stateless
from model.generate import specs
from model.spec import EVENT_SCHEMA, SECOND_SOURCE, SOURCE, BadLine, Spec, SqlStep, SqlWindow

import headrace as hr
from headrace.testing import TestSink, TestSource, run_locally, run_to_completion

LOCAL_EXAMPLES = int(os.environ.get("HEADRACE_LOCAL_FUZZ_EXAMPLES", "30"))  # more: set it higher


def local_spec(spec: Spec) -> Spec | None:
    """``spec`` as the local runner can run it (None: it has SQL): its bad lines left out, every
    sink a TestSink, the sources of a union of the same number of steps."""
    if isinstance(spec.stateful, SqlWindow) or any(isinstance(s, SqlStep) for s in spec.steps):
        return None
    steps = max(len(spec.batches), len(spec.union.batches) if spec.union else 0)

    def good(batches: Any) -> tuple[Any, ...]:
        kept = tuple(tuple(line for line in batch if not isinstance(line, BadLine)) for batch in batches)
        return kept + ((),) * (steps - len(kept))

    union = dataclasses.replace(spec.union, batches=good(spec.union.batches)) if spec.union else None
    return dataclasses.replace(spec, batches=good(spec.batches), union=union, dead_letters=None,
                               sinks=tuple("test" for _ in spec.sinks), tap="test" if spec.tap else None)


def build(spec: Spec, name: str) -> hr.Pipeline:
    """The spec's pipeline on TestSources and TestSinks (tests/model/build.py's steps)."""
    p = hr.Pipeline(name)
    stream = _source(p, SOURCE, spec.batches, spec.delay)
    for number, step in enumerate(spec.steps):
        stream = _stateless(p, stream, step, f"step_{number}")
    united = stream
    if spec.union:
        united = stream.union(_source(p, SECOND_SOURCE, spec.union.batches, spec.union.delay), name="united")
    final = _stateful(united, spec.stateful) if spec.stateful else united
    for sink_name in spec.sink_kinds():
        (stream if sink_name == "tap" else final).sink(sink_name, TestSink())
    return p


def _source(p: hr.Pipeline, name: str, batches: Any, delay: int) -> hr.Stream:
    steps = [[line.as_dict() for line in batch] for batch in batches]
    return p.source(name, TestSource(steps, schema=EVENT_SCHEMA), event_time="ts", max_out_of_orderness=delay)


def as_multiset(rows: list[dict[str, Any]]) -> Counter:
    def plain(value: Any) -> Any:
        if isinstance(value, datetime.datetime):
            return round(value.timestamp() * 1000)
        return value
    return Counter(tuple(sorted((k, plain(v)) for k, v in row.items())) for row in rows)


@pytest.mark.fast
@settings(max_examples=LOCAL_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(spec=specs)
def test_the_local_runner_agrees_with_the_model(spec):
    runnable = local_spec(spec)
    if runnable is None:
        return
    expected = interpreter.run(runnable)
    got = run_locally(build(runnable, "local_differential"))
    for name in runnable.sink_kinds():
        want, have = as_multiset(expected.sinks[name]), as_multiset(got[name])
        assert have == want, (f"sink {name!r}: the local runner gave {sorted(have - want)} more and "
                              f"{sorted(want - have)} fewer rows than the model")


@settings(max_examples=4, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(spec=specs)
def test_the_local_runner_agrees_with_spark(spec, spark, tmp_path_factory):
    runnable = local_spec(spec)
    if runnable is None:
        return
    local = run_locally(build(runnable, "local_vs_spark"))
    on_spark = run_to_completion(build(runnable, "local_vs_spark"), state_dir=str(tmp_path_factory.mktemp("state")))
    for name in runnable.sink_kinds():
        assert as_multiset(local[name]) == as_multiset(on_spark[name]), name
