"""Differential test: random pipelines run through headrace (real Spark) and through the reference
model (tests/model/interpreter.py, plain Python written from the docs), every sink's output, the
dead letters and the counts compared.

A fixed set of examples runs in CI (derandomized). More: ``--fuzz-examples N`` and
``HEADRACE_FUZZ_SEED=S`` (a seed of your own, else a random one). See docs/testing.md.
"""

from __future__ import annotations

import datetime
import itertools
import os
import pickle
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, note, reject, seed, settings
from hypothesis import strategies as st
from model import interpreter
from model.build import build, write_input
from model.generate import killable_specs, specs
from model.spec import Rolling, Spec

import headrace.testing
from headrace.connectors.files_sink import read_rows
from headrace.runtime.runner import PipelineRun

CI_EXAMPLES = 5
CI_KILLED_EXAMPLES = 1
HERE = Path(__file__).resolve().parent
_names = itertools.count()


def normalise(value: Any, field: str) -> Any:
    """Times as epoch milliseconds, whichever sink they came through."""
    if isinstance(value, datetime.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return round(moment.timestamp() * 1000)
    if isinstance(value, str) and field in ("window_start", "window_end", "ts"):
        return normalise(datetime.datetime.fromisoformat(value), field)
    return value


def as_multiset(rows: list[dict[str, Any]], sink: str, kind: str) -> Counter:
    if kind == "files":  # JSON lines leave null fields out (Spark's to_json)
        rows = [{k: v for k, v in row.items() if v is not None} for row in rows]
    if sink == "dead":  # the model knows the file and line, not the folder, nor the parser's words
        rows = [{"source": r["source"], "position": os.path.basename(r["position"]), "raw": r["raw"]} for r in rows]
    return Counter(tuple(sorted((k, normalise(v, k)) for k, v in row.items())) for row in rows)


def run_headrace(spec: Spec, folder: Path) -> tuple[dict[str, list[dict[str, Any]]], Any]:
    write_input(spec, folder / "input")
    built = build(spec, f"differential_{os.getpid()}_{next(_names)}", folder)
    result = PipelineRun(built.pipeline, state_dir=str(folder / "state"), progress="quiet", fresh=True).start().wait()
    rows = {}
    for name, connector in built.sinks.items():
        rows[name] = connector.rows() if isinstance(connector, headrace.testing.TestSink) else \
            read_rows(str(folder / name), "jsonl") if (folder / name).is_dir() else []
    return rows, result


def known_defect(spec: Spec) -> str | None:
    """The fixed test of a defect this spec would meet (tests/test_differential_found.py), while it
    is open, or of a pipeline headrace refuses when it is built."""
    if isinstance(spec.stateful, Rolling) and "files" in spec.sinks:
        return "test_running_counts_into_a_file_sink_are_refused_when_built"
    return None


def check_agreement(spec: Spec) -> None:
    note(repr(spec))
    if known_defect(spec):
        reject()
    expected = interpreter.run(spec)
    folder = Path(tempfile.mkdtemp(prefix="headrace-differential-"))
    try:
        got, result = run_headrace(spec, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for name, kind in spec.sink_kinds().items():
        want, have = as_multiset(expected.sinks[name], name, kind), as_multiset(got[name], name, kind)
        assert have == want, (f"sink {name!r}: headrace gave {sorted(have - want)} more and "
                              f"{sorted(want - have)} fewer rows than the model")
    assert result.dead_letters == expected.dead_letters
    assert result.late_rows_dropped == expected.late_dropped


def fuzzed(check: Any, examples: int) -> Any:
    """``check`` with the run's settings: derandomized, or from HEADRACE_FUZZ_SEED."""
    chosen_seed = os.environ.get("HEADRACE_FUZZ_SEED")
    options: dict[str, Any] = dict(max_examples=examples, deadline=None, database=None,
                                   suppress_health_check=list(HealthCheck),
                                   phases=[Phase.explicit, Phase.generate])  # shrinking would rerun Spark for long
    if chosen_seed is None:
        return settings(derandomize=True, **options)(check)
    return seed(int(chosen_seed))(settings(derandomize=False, **options)(check))


def test_headrace_agrees_with_the_model(spark, pytestconfig):
    examples = pytestconfig.getoption("fuzz_examples") or CI_EXAMPLES
    fuzzed(given(spec=specs)(check_agreement), examples)()


def check_killed_run(spec: Spec, kill_after: int) -> None:
    """The spec's pipeline in a driver process, killed with SIGKILL (its process group) once
    ``kill_after`` micro-batches committed, then restarted: its file sink holds the model's rows."""
    from driver_process import Driver, KilledRun

    note(repr(spec))
    if known_defect(spec):
        reject()
    expected = interpreter.run(spec).sinks["out_0"]
    folder = Path(tempfile.mkdtemp(prefix="headrace-differential-killed-"))
    try:
        write_input(spec, folder / "input")
        with open(folder / "spec.pickle", "wb") as handle:
            pickle.dump(spec, handle)
        args = {"name": f"differential_killed_{os.getpid()}_{next(_names)}", "spec": str(folder / "spec.pickle"),
                "folder": str(folder), "state_dir": str(folder / "state"), "out": str(folder / "out_0")}
        run = KilledRun(HERE / "differential_driver.py", args, folder / "driver.log")
        run.kill_after(kill_after)
        if run.committed() >= len(spec.batches):
            reject()  # the kill came after the whole input: nothing is left for the restart
        # restarted, and killed again once the output is whole (and a second more: a duplicate
        # would show); how a graceful stop ends is not this test's business
        driver = Driver(HERE / "differential_driver.py", args, folder / "driver.log")
        try:
            driver.wait_for("the model's rows and every micro-batch",
                            lambda: len(run.written()) >= len(expected) and run.committed() >= len(spec.batches))
            time.sleep(1)
        finally:
            driver.kill()
        assert as_multiset(run.written(), "out_0", "files") == as_multiset(expected, "out_0", "files")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_driver_restarts_to_the_models_output(pytestconfig):
    fuzz = pytestconfig.getoption("fuzz_examples")
    examples = max(1, fuzz // 5) if fuzz else CI_KILLED_EXAMPLES
    fuzzed(given(spec=killable_specs, kill_after=st.integers(1, 3))(check_killed_run), examples)()
