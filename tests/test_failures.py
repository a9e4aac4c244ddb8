"""Every way a run fails reaches the user as one headrace error that names the step and the
cause, with Spark's trace kept for ``--verbose``; a failure worth restarting (here: the Python
process serving a source's offsets, killed) restarts the query from its checkpoint by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

import headrace as hr
from headrace.cli import main
from headrace.connectors.base import SinkConnector
from headrace.environment.lease import LeaseHeld
from headrace.errors import REFUSED_EXIT_STATUS, PipelineFileError
from headrace.runtime.failures import classify
from headrace.runtime.restarts import RestartPolicy
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource, run_to_completion

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the step functions below reach Spark's workers

UNBOUNDED = '''
import headrace as hr


def parse(record):
    raise ValueError(f"cannot parse {record['line'][:3]!r}")


p = hr.Pipeline("unbounded_failing")
(p.source("lines", hr.sources.Generator("words", rows_per_batch=50))
  .map(parse, schema={"n": "long"}, name="parse").sink("out", hr.sinks.Null()))
'''


def write(folder: Path, text: str) -> str:
    path = folder / "unbounded.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def numbers(steps: int, rows: int = 10) -> TestSource:
    return TestSource([[{"n": step * rows + i} for i in range(rows)] for step in range(steps)], schema={"n": "long"})


# -- one line, naming the step -----------------------------------------------------------------------

def test_an_unbounded_run_whose_function_raises_is_one_line(spark, tmp_path, capsys):
    path = write(tmp_path, UNBOUNDED)
    assert main(["run", path, "--state-dir", str(tmp_path / "state"), "--quiet"]) == REFUSED_EXIT_STATUS
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("headrace: step 'parse' (parse at unbounded.py:5) raised ValueError: cannot parse ")


def test_verbose_adds_sparks_trace_before_the_error(spark, tmp_path, capsys):
    path = write(tmp_path, UNBOUNDED)
    assert main(["run", path, "--state-dir", str(tmp_path / "state"), "--quiet", "--verbose"]) == REFUSED_EXIT_STATUS
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("headrace: step 'parse' (parse at unbounded.py:5) raised ValueError: ")
    trace = "\n".join(err[:-1])
    assert "Traceback (most recent call last)" in trace and "\tat org.apache.spark." in trace


class BrokenSink(SinkConnector):
    def write_batch(self, df: Any, batch_id: int) -> None:
        raise RuntimeError("disk full")


def test_a_sink_that_raises(spark, tmp_path):
    p = hr.Pipeline("broken_sink")
    p.source("numbers", numbers(2)).sink("out", BrokenSink())
    with pytest.raises(hr.SinkError) as error:
        run_to_completion(p, state_dir=str(tmp_path))
    defined_at = p.plan.nodes["out"].defined_at
    assert defined_at.startswith("test_failures.py:")
    assert str(error.value) == f"sink 'out' ({defined_at}) failed to write batch 0: RuntimeError: disk full"


def crash(record: dict[str, Any]) -> dict[str, Any]:
    os.kill(os.getpid(), signal.SIGKILL)  # the Python worker running this task dies
    return record


def test_a_crashed_python_worker_beyond_retries(spark, tmp_path, capsys):
    """The test session has one attempt per task (``local[2]``): the crash fails the query; it is
    restarted once (the policy), crashes again, and the run ends naming the step."""
    p = hr.Pipeline("crashing")
    p.source("numbers", numbers(2)).map(crash, schema={"n": "long"}, name="crash").sink("out", TestSink())
    run = PipelineRun(p, state_dir=str(tmp_path), progress="line", restart_attempts=1, restart_backoff="100ms")
    with pytest.raises(hr.PipelineFailed) as error:
        run.start().wait()
    defined_at = p.plan.nodes["crash"].defined_at
    assert str(error.value) == (
        f"step 'crash' ({defined_at}): a Python worker crashed while running it (the process exited unexpectedly: "
        "killed, out of memory or a fault in native code) (not restarted again: the restart policy allows 1 "
        "restart within 10m)")
    assert run.restarts == 1
    assert "Python worker exited unexpectedly" in (error.value.trace or "")
    shown = capsys.readouterr().err
    assert f"restart 1 (1 restart within 10m) in 0.1 s after: step 'crash' ({defined_at}): a Python worker" in shown


class JarlessSink(SinkConnector):
    native_format = "org.example.NoSuchFormat"  # a Spark format whose jar is not on the classpath


def test_a_missing_spark_class(spark, tmp_path):
    p = hr.Pipeline("jarless")
    p.source("numbers", numbers(1)).sink("out", JarlessSink())
    with pytest.raises(hr.PipelineFailed) as error:
        PipelineRun(p, state_dir=str(tmp_path), progress="quiet").start()
    assert str(error.value) == (
        f"sink 'out' ({p.plan.nodes['out'].defined_at}): Spark has no data source 'org.example.NoSuchFormat' "
        "(class org.example.NoSuchFormat.DefaultSource not found): add the jar that provides it to Spark's "
        "classpath (spark.jars.packages or spark.jars)")


# -- refusals: what running again cannot cure is never restarted --------------------------------------

def refusal_plan() -> Any:
    p = hr.Pipeline("refusals")
    p.source("numbers", numbers(1)).map(lambda r: r, schema={"n": "long"}, name="parse").sink("out", TestSink())
    return p.plan


EARLIER_RUN = ("sink 'out' (app.py:9): the directory 'out' already holds batches of an earlier run; remove it or use a "
               "new path")
UNREACHABLE = "sink 'out' (app.py:9): PostgreSQL unreachable after 6 attempts over 15.5 s: connection refused"
WORKER = "Traceback (most recent call last):\n  File \"worker.py\", line 3\n"


@pytest.mark.fast
@pytest.mark.parametrize(("raised", "kind", "restartable", "refusal"), [
    (hr.PlanError("step 'parse': unknown column 'x'"), hr.PlanError, False, True),
    (hr.IncompatibleCheckpoint("pipeline 'refusals' cannot restart from its checkpoint"), hr.IncompatibleCheckpoint,
     False, True),
    (hr.SinkError(EARLIER_RUN), hr.SinkError, False, True),
    (hr.SinkError(UNREACHABLE, refusal=False), hr.SinkError, True, False),  # as the connector raises it
    (hr.SourceError("source 'numbers': ConnectionResetError: reset by peer"), hr.SourceError, True, False),
    (RuntimeError(f"{WORKER}headrace.errors.SinkError: {EARLIER_RUN}\n"), hr.SinkError, False, True),
    (RuntimeError(f"{WORKER}headrace.errors.StepFunctionError: step 'parse' raised ValueError: bad (record: 1)\n"),
     hr.StepFunctionError, False, True),
    (RuntimeError(f"{WORKER}headrace.errors.StepFunctionError: step 'parse' raised ConnectionRefusedError: no\n"),
     hr.StepFunctionError, True, False),
    (RuntimeError("org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)"),
     hr.PipelineFailed, True, False),
    (RuntimeError("java.lang.ClassNotFoundException: org.example.Missing"), hr.PipelineFailed, False, True),
    (RuntimeError("java.lang.IllegalStateException: something headrace cannot tell"), hr.PipelineFailed, False,
     False),
])
def test_a_failure_worth_a_restart_is_never_a_refusal_and_a_refusal_is_never_restarted(
        raised: BaseException, kind: type, restartable: bool, refusal: bool):
    failure = classify(refusal_plan(), raised)
    assert (type(failure.error), failure.restartable, failure.error.refusal) == (kind, restartable, refusal)


@pytest.mark.fast
def test_giving_up_on_a_transient_failure_keeps_it_no_refusal():
    failure = classify(refusal_plan(), hr.SinkError(UNREACHABLE, refusal=False))
    given_up = failure.giving_up(3, "3 restarts within 10m")
    assert (type(given_up), given_up.refusal) == (hr.SinkError, False)
    assert str(given_up) == f"{UNREACHABLE} (not restarted again: the restart policy allows 3 restarts within 10m)"


@pytest.mark.fast
def test_the_error_classes_say_whether_running_again_can_help():
    refusals = [hr.PlanError, hr.SetupError, hr.IncompatibleCheckpoint, hr.StepFunctionError, hr.SourceError,
                hr.SinkError, LeaseHeld, PipelineFileError]
    assert [cls for cls in refusals if not cls.refusal] == []
    assert [hr.PipelineFailed.refusal, hr.HeadraceError.refusal] == [False, False]


def test_a_files_sink_refusing_an_earlier_runs_directory_is_not_restarted(spark, tmp_path, capsys):
    """The refusal is raised once, with restarts allowed: no restart is tried, and ``headrace run``
    ends with the refusal's exit status and its one line."""
    out = tmp_path / "out"
    (out / "batch-0").mkdir(parents=True)  # an earlier run's batch
    path = tmp_path / "refused.py"
    path.write_text(textwrap.dedent(f"""\
        import headrace as hr
        from headrace.testing import TestSource

        p = hr.Pipeline("refused")
        p.source("numbers", TestSource([[{{"n": 1}}]], schema={{"n": "long"}})).sink(
            "out", hr.sinks.Files({str(out)!r}, format="jsonl"))
    """))
    expected = (f"headrace: sink 'out' (refused.py:5): the directory {str(out)!r} already holds batches of an "
                "earlier run; remove it or use a new path")
    status = main(["run", str(path), "--state-dir", str(tmp_path / "state"), "--restart-attempts", "3",
                   "--restart-backoff", "10ms"])
    captured = capsys.readouterr()
    assert (status, captured.err.strip().splitlines()) == (REFUSED_EXIT_STATUS, [expected])
    assert "restart" not in captured.out
    assert sorted(os.listdir(out)) == ["batch-0"]


# -- restart settings ----------------------------------------------------------------------------------

@pytest.mark.fast
def test_restart_settings_are_checked_before_spark_starts(tmp_path, monkeypatch):
    with pytest.raises(hr.PlanError) as error:
        RestartPolicy.of(attempts=-1)
    assert str(error.value) == "restart_attempts: expected a whole number of restarts, 0 or more, got -1"
    with pytest.raises(hr.PlanError) as error:
        RestartPolicy.of(backoff="-1s")
    assert str(error.value) == "restart_backoff: a duration cannot be negative, got '-1s'"
    path = write(tmp_path, UNBOUNDED)
    done = subprocess.run([sys.executable, "-m", "headrace.cli", "run", path, "--restart-window", "0s"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == REFUSED_EXIT_STATUS
    assert done.stderr.strip().splitlines() == ["headrace: restart_window must be a positive duration, got '0s'"]

    monkeypatch.setenv("HEADRACE_RESTART_WINDOW", "soon")
    with pytest.raises(hr.PlanError) as error:
        RestartPolicy.of()
    assert str(error.value).startswith("HEADRACE_RESTART_WINDOW: cannot read 'soon' as a duration; write e.g. ")
    monkeypatch.setenv("HEADRACE_RESTART_ATTEMPTS", "many")
    with pytest.raises(hr.PlanError) as error:
        RestartPolicy.of(window="1min")
    assert str(error.value) == ("HEADRACE_RESTART_ATTEMPTS: expected a whole number of restarts, 0 or more, got "
                                "'many'")


@pytest.mark.fast
def test_run_help_shows_the_restart_and_verbose_options(tmp_path):
    done = subprocess.run([sys.executable, "-m", "headrace.cli", "run", "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0
    for option in ("--verbose", "--restart-attempts", "--restart-window", "--restart-backoff"):
        assert option in done.stdout


@pytest.mark.fast
def test_the_restart_policy_counts_restarts_within_its_window():
    policy = RestartPolicy.of(attempts=2, window="1min", backoff="1s")
    assert [policy.next_delay(at) for at in (0, 1, 2)] == [1.0, 2.0, None]
    assert policy.next_delay(61) == 1.0  # the restarts at 0 s and 1 s have left the window


# -- restarted by itself -------------------------------------------------------------------------------

def source_runners(jvm: int) -> list[int]:
    """Spark's Python streaming source runners: child processes of this session's JVM."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2:].split()[1])
        if parent == jvm and "pyspark.sql.streaming.python_streaming_source_runner" in cmdline:
            found.append(int(entry))
    return found


def test_a_killed_source_runner_is_restarted_and_the_output_is_exact(spark, tmp_path, capsys):
    steps, rows = 12, 10
    p = hr.Pipeline("runner_killed")
    out = TestSink()
    p.source("numbers", numbers(steps, rows)).map(lambda r: {"n": r["n"] * 2}, schema={"n": "long"}).sink("out", out)
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    killed: list[int] = []

    def kill_the_runner(run: PipelineRun) -> None:
        if len(run.progress_log) == 5 and not killed:
            killed.extend(source_runners(jvm))
            for pid in killed:
                os.kill(pid, signal.SIGKILL)

    run = PipelineRun(p, state_dir=str(tmp_path), progress="json", restart_backoff="200ms").start()
    result = run.wait(until_exhausted=True, on_settled=kill_the_runner)
    assert killed, "no source runner found"
    assert result.restarts == 1 and result.stopped_by == "input exhausted"
    assert sorted(r["n"] for r in out.rows()) == [2 * n for n in range(steps * rows)]
    assert (result.batches, result.input_rows) == (steps + 1, steps * rows)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    restart = next(line["restart"] for line in lines if "restart" in line)
    assert restart["number"] == 1 and restart["delay_s"] == 0.2
    assert restart["error"] == (f"source 'numbers' ({p.plan.nodes['numbers'].defined_at}): Spark lost the Python "
                                "process that serves its offsets (the streaming source runner died or its connection "
                                "broke)")
    assert lines[-1]["restarts"] == 1


STRANGER = '''#!/bin/sh
# Spark's Python for this test: the first worker that runs a stateful step's driver side never
# starts; in its place a stranger reaches the worker's socket with a wrong secret, as a worker
# Spark gave up on does when it reaches a later worker's port on a busy machine.
case "$*" in *transform_with_state_driver_worker*)
  if [ ! -e "{marker}" ]; then
    touch "{marker}"
    exec "{python}" -c "import os, socket, struct
s = socket.create_connection(('127.0.0.1', int(os.environ['PYTHON_WORKER_FACTORY_PORT'])))
s.sendall(struct.pack('>i', 5) + b'wrong')
s.recv(16)"
  fi;;
esac
exec "{python}" "$@"
'''


def test_a_python_worker_that_does_not_start_is_restarted_and_the_output_is_exact(spark, tmp_path, capsys):
    stranger = tmp_path / "python.sh"
    stranger.write_text(STRANGER.format(marker=tmp_path / "once", python=sys.executable))
    stranger.chmod(0o755)
    p = hr.Pipeline("worker_not_started")
    out = TestSink()
    rows = [[{"k": (step * 10 + i) % 3, "n": step * 10 + i} for i in range(10)] for step in range(3)]
    (p.source("numbers", TestSource(rows, schema={"k": "long", "n": "long"})).key_by("k")
     .window(hr.Count(5), name="fives").count().sink("out", out))
    context = spark.sparkContext
    python, context.pythonExec = context.pythonExec, str(stranger)  # the workers of this run's query start through it
    try:
        run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="json", restart_backoff="100ms").start()
        result = run.wait(until_exhausted=True)
    finally:
        context.pythonExec = python
    assert (tmp_path / "once").exists() and result.restarts == 1
    counted = Counter(row["k"] for batch in rows for row in batch)
    assert sorted((r["k"], r["count"]) for r in out.rows()) == sorted(
        (k, 5) for k, n in counted.items() for _ in range(n // 5))
    restart = next(json.loads(line)["restart"] for line in capsys.readouterr().out.splitlines() if '"restart"' in line)
    assert restart["error"] == (
        f"step 'fives' ({p.plan.nodes['fives'].defined_at}): a Python worker for it did not start (it failed to "
        "connect back to Spark: java.lang.IllegalArgumentException: Authentication failed.)")
