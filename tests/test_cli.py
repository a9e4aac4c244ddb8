"""The ``headrace`` command: run, explain, demo, --help and bad input.

Commands that start Spark run in-process through ``headrace.cli.main`` (they share the
test session); ``--help`` and bad input, which never start Spark, run as subprocesses.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from headrace.cli import load_pipeline, main
from headrace.errors import REFUSED_EXIT_STATUS

PIPELINES = '''
import os
import headrace as hr
from headrace.testing import TestSource

BATCHES = [[{"word": "spark", "t": 1000}, {"word": "flow", "t": 2000}], [{"word": "spark", "t": 3000}]]
SCHEMA = {"word": "string", "t": "long"}


def shout(record):
    return {"word": record["word"].upper(), "t": record["t"]}


words = hr.Pipeline("words")
(words.source("words", TestSource(BATCHES, schema=SCHEMA), event_time="t")
      .map(shout, schema={"word": "string", "t": "timestamp"}, name="shout")
      .key_by("word").window(hr.Tumbling("10s"), name="per_10s").count()
      .sink("counts", hr.sinks.Console(limit=None)))

saved = hr.Pipeline("saved_words")
(saved.source("words", TestSource(BATCHES, schema=SCHEMA))
      .filter(hr.col("word") == "spark", name="sparks")
      .sink("files", hr.sinks.Files(os.environ.get("HR_TEST_OUT", "out"), format="jsonl")))
'''


def write(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def headrace(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The command in a subprocess, for what never starts Spark."""
    return subprocess.run([sys.executable, "-m", "headrace.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# -- --help ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("command, expected", [
    ([], ["run", "explain", "demo"]),
    (["run"], ["FILE[:PIPELINE]", "--fresh", "--backfill", "--drain", "--max-seconds", "--state-dir", "--master",
               "--quiet", "--json"]),
    (["explain"], ["FILE[:PIPELINE]", "--json"]),
    (["demo"], ["--variant", "--limit", "--state-dir", "--quiet", "--json"]),
    (["switch"], ["NAME", "TARGET", "--dsn", "--batch", "--live", "--time", "--cutoff"]),
])
@pytest.mark.fast
def test_every_command_has_help(tmp_path, command, expected):
    result = headrace(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: headrace {' '.join(command)}".rstrip())
    for word in expected:
        assert word in result.stdout


@pytest.mark.fast
def test_run_help_names_its_exit_statuses(tmp_path):
    text = " ".join(headrace("run", "--help", cwd=tmp_path).stdout.split())
    assert (f"{REFUSED_EXIT_STATUS} refused: the pipeline cannot run as it is (a plan or setup error, a checkpoint "
            "the plan cannot continue, a source's or sink's own refusal, a user function that raised, another driver "
            "running it): running it again will not help, so headrace server does not") in text


@pytest.mark.fast
def test_no_command_is_a_usage_error(tmp_path):
    result = headrace(cwd=tmp_path)
    assert result.returncode == 2
    assert "usage: headrace" in result.stderr


# -- bad input ---------------------------------------------------------------------------------------

@pytest.mark.fast
def test_missing_file(tmp_path):
    for command in ("run", "explain"):
        result = headrace(command, "missing.py", cwd=tmp_path)
        assert result.returncode == 2
        assert one_line_error(result) == "headrace: error: no such file: missing.py"


@pytest.mark.fast
def test_file_without_a_pipeline(tmp_path):
    path = write(tmp_path, "empty.py", "import headrace as hr\nx = 1\n")
    result = headrace("run", path, cwd=tmp_path)
    assert result.returncode == 2
    assert one_line_error(result) == f"headrace: error: {path} defines no headrace Pipeline at module level"


@pytest.mark.fast
def test_several_pipelines_need_a_name_and_an_unknown_name_is_refused(tmp_path):
    path = write(tmp_path, "two.py", PIPELINES)
    result = headrace("explain", path, cwd=tmp_path)
    assert result.returncode == 2
    assert one_line_error(result) == (f"headrace: error: {path} defines several pipelines (words, saved); choose "
                                      f"one with {path}:NAME")
    result = headrace("run", f"{path}:nope", cwd=tmp_path)
    assert result.returncode == 2
    assert one_line_error(result) == f"headrace: error: {path} has no pipeline named 'nope'; it has: words, saved"


@pytest.mark.fast
def test_a_file_that_raises_plan_error_at_load(tmp_path):
    path = write(tmp_path, "broken.py", """\
        import headrace as hr
        from headrace.testing import TestSource

        p = hr.Pipeline("broken")
        events = p.source("events", TestSource([], schema={"user": "string"}))
        events.key_by("usr")
    """)
    for command, status in (("run", REFUSED_EXIT_STATUS), ("explain", 1)):
        result = headrace(command, path, cwd=tmp_path)
        assert result.returncode == status
        assert one_line_error(result) == ("headrace: step 'key_by' (broken.py:6): unknown key field 'usr'; the stream "
                                          "from 'events' has user")


@pytest.mark.fast
def test_a_file_that_fails_otherwise_at_load(tmp_path):
    path = write(tmp_path, "typo.py", "import headrace as hr\np = hr.Pipelin('x')\n")
    result = headrace("explain", path, cwd=tmp_path)
    assert result.returncode == 2
    assert one_line_error(result) == (f"headrace: error: {path} failed to load: AttributeError: module 'headrace' "
                                      "has no attribute 'Pipelin'")


@pytest.mark.fast
def test_an_invalid_pipeline_is_refused_before_spark_starts(tmp_path):
    path = write(tmp_path, "nowhere.py", """\
        import headrace as hr
        from headrace.testing import TestSource, TestSink

        p = hr.Pipeline("nowhere")
        events = p.source("events", TestSource([], schema={"user": "string"}))
        events.sink("out", TestSink())
        events.filter(hr.col("user") == "ann", name="anns")
    """)
    for command, status in (("run", REFUSED_EXIT_STATUS), ("explain", 1)):
        result = headrace(command, path, cwd=tmp_path)
        assert result.returncode == status
        assert one_line_error(result) == ("headrace: step 'anns' (nowhere.py:7): this stream goes nowhere: send it "
                                          "to a sink with .sink(...) or remove the step")


# -- explain (in-process: no Spark) -----------------------------------------------------------------

@pytest.mark.fast
def test_explain_prints_the_plan_and_its_json(tmp_path, capsys):
    path = write(tmp_path, "pipelines.py", PIPELINES)
    assert main(["explain", f"{path}:words"]) == 0
    text = capsys.readouterr().out
    expected = load_pipeline(f"{path}:words")
    assert text == expected.explain() + "\n"
    assert "fused Python stage #1 (mapInArrow: shout)" in text
    assert "counts" in text and "guarantee: at-least-once" in text

    assert main(["explain", f"{path}:saved_words", "--json"]) == 0  # by the pipeline's name, not the variable's
    plan = json.loads(capsys.readouterr().out)
    assert plan == load_pipeline(f"{path}:saved").to_json()
    assert plan["pipeline"] == "saved_words"
    assert [n["name"] for n in plan["nodes"]] == ["words", "sparks", "files"]


@pytest.mark.fast
def test_explain_into_a_reader_that_left_ends_without_a_traceback(tmp_path):
    """``headrace explain FILE | head``, the reader gone before a line is written: nothing on
    stderr, and the status of a command ended by SIGPIPE."""
    import os

    path = write(tmp_path, "pipelines.py", PIPELINES)
    reader, writer = os.pipe()
    os.close(reader)  # the reader left: every write fails
    try:
        done = subprocess.run([sys.executable, "-m", "headrace.cli", "explain", f"{path}:words"], stdout=writer,
                              stderr=subprocess.PIPE, text=True, timeout=120, check=False)
    finally:
        os.close(writer)
    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.fast
def test_explain_of_a_file_that_runs_a_pipeline_explains_that_one_and_starts_nothing(tmp_path, capsys,
                                                                                       monkeypatch):
    """A file that calls ``p.run(...)`` at module level: ``headrace explain`` stops the file there
    (the code after it does not run), explains that pipeline (one of two) and starts nothing:
    ``fresh=True`` deletes no checkpoint."""
    monkeypatch.chdir(tmp_path)
    runs = "\nsaved.run(state_dir='state', fresh=True)\nprint('after the run')\n"
    path = write(tmp_path, "runs.py", PIPELINES + runs)
    checkpoint = tmp_path / "state" / "saved_words" / "checkpoint"
    checkpoint.mkdir(parents=True)
    assert main(["explain", path]) == 0
    text = capsys.readouterr().out
    assert text.startswith("pipeline 'saved_words'") and "after the run" not in text
    assert text == load_pipeline(f"{path}:saved").explain() + "\n"
    assert checkpoint.exists()


# -- run and demo (in-process: they share the test's Spark session) -------------------------------

def test_run_prints_the_console_sink_and_ends_with_the_input(spark, tmp_path, capsys):
    path = write(tmp_path, "pipelines.py", PIPELINES)
    assert main(["run", f"{path}:words", "--state-dir", str(tmp_path / "state"), "--quiet"]) == 0
    out = capsys.readouterr().out
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in out.splitlines()
            if line.startswith("|") and "window_start" not in line]
    assert sorted(rows) == [["FLOW", "1970-01-01 00:00:00+00:00", "1970-01-01 00:00:10+00:00", "1"],
                            ["SPARK", "1970-01-01 00:00:00+00:00", "1970-01-01 00:00:10+00:00", "2"]]
    assert "--- batch 0 ---" in out


def test_run_json_reports_progress_and_result(spark, tmp_path, capsys, monkeypatch):
    out_dir = tmp_path / "out"
    monkeypatch.setenv("HR_TEST_OUT", str(out_dir))
    path = write(tmp_path, "pipelines.py", PIPELINES)
    assert main(["run", f"{path}:saved", "--state-dir", str(tmp_path / "state"), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    result = lines[-1]["result"]
    assert result["pipeline"] == "saved_words"
    assert result["stopped_by"] == "input exhausted"
    assert result["checkpoint"] == str(tmp_path / "state" / "saved_words" / "checkpoint")
    progress = lines[:-1]
    assert [p["batch"] for p in progress] == list(range(len(progress))) and progress
    assert result["batches"] == len(progress)
    assert sum(p["input_rows"] for p in progress) == result["input_rows"]
    from headrace.connectors.files_sink import read_rows
    assert sorted(r["word"] for r in read_rows(str(out_dir), format="jsonl")) == ["spark", "spark"]


def test_run_a_pipeline_whose_function_fails(spark, tmp_path, capsys):
    path = write(tmp_path, "failing.py", """\
        import headrace as hr
        from headrace.testing import TestSource, TestSink


        def parse(record):
            return {"n": int(record["text"])}


        p = hr.Pipeline("failing")
        (p.source("lines", TestSource([[{"text": "1"}, {"text": "one"}]], schema={"text": "string"}))
          .map(parse, schema={"n": "long"}, name="parse").sink("out", TestSink()))
    """)
    assert main(["run", path, "--state-dir", str(tmp_path / "state"), "--quiet"]) == REFUSED_EXIT_STATUS
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("headrace: step 'parse' (parse at failing.py:5) raised ValueError: invalid literal "
                              "for int() with base 10: 'one' (record: ")


def demo_json(tmp_path: Path, capsys: Any, *options: str) -> tuple[list[dict[str, Any]], str]:
    assert main(["demo", "--limit", "300000", "--state-dir", str(tmp_path), *options]) == 0
    captured = capsys.readouterr()
    return [json.loads(line) for line in captured.out.splitlines()], captured.err


def test_demo_json_is_machine_readable(spark, tmp_path, capsys):
    lines, err = demo_json(tmp_path, capsys, "--json")
    result = lines[-1]["result"]
    assert result["pipeline"] == "ysb"
    assert result["stopped_by"] == "input exhausted"
    assert result["input_rows"] >= 300_000
    assert all("batch" in line for line in lines[:-1])
    # The windowed counts still show, on stderr: campaign rows with their counts.
    assert "|campaign_id|window_start" in err.replace(" ", "")


def test_demo_quiet_prints_only_the_windows(spark, tmp_path, capsys):
    assert main(["demo", "--limit", "300000", "--state-dir", str(tmp_path), "--quiet", "--variant", "python"]) == 0
    out = capsys.readouterr().out
    assert "pipeline 'ysb'" not in out and "rows in" not in out  # no plan, no summary
    counts = [int(line.split("|")[4]) for line in out.splitlines() if line.startswith("|campaign-")]
    assert counts and all(count > 0 for count in counts)


@pytest.mark.fast
def test_the_demo_pipelines_steps_are_named_by_their_own_lines(capsys):
    """``headrace explain examples/ysb.py`` (and ``headrace demo``) label each step with its line in
    headrace/demo.py, where the pipeline is written, not with the line or console script that called it."""
    import re

    import headrace.demo

    root = Path(__file__).resolve().parent.parent
    assert main(["explain", str(root / "examples" / "ysb.py")]) == 0
    out = capsys.readouterr().out
    source = Path(headrace.demo.__file__).read_text().splitlines()
    labels = re.findall(r"^  (\w+) .*\n.*\[(\S+):(\d+)\]$", out, flags=re.MULTILINE)
    assert len(labels) == 9, out
    for step, file, line in labels:
        assert file == "demo.py", out
        call = " ".join(source[int(line) - 1:int(line) + 1])  # the call named on its line, or spread to the next
        assert step.removesuffix("_event_time") in call, (step, line)


@pytest.mark.fast
def test_the_kafka_clients_log_shows_only_with_verbose():
    """librdkafka's warnings (a coordinator still loading, a refused connection: retried by the sink)
    stay off a first run's stderr; ``--verbose`` prints them. A subprocess, as pytest's own log
    handlers would hide Python's last-resort handler."""
    script = ("import sys\nfrom headrace.cli import show_logs_on_stderr\n"
              "from headrace.connectors.kafka_sink import CLIENT_LOG\n"
              "if sys.argv[1:] == ['--verbose']:\n    show_logs_on_stderr()\n"
              "CLIENT_LOG.warning('GETPID [rdkafka#producer-2]: Failed to acquire transactional PID: retrying')\n")
    quiet = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    verbose = subprocess.run([sys.executable, "-c", script, "--verbose"], capture_output=True, text=True, check=True)
    assert quiet.stderr == ""
    assert verbose.stderr == ("headrace: headrace.kafka: GETPID [rdkafka#producer-2]: Failed to acquire "
                              "transactional PID: retrying\n")


@pytest.mark.fast
def test_the_jvms_stderr_keeps_a_users_traceback_and_drops_a_worker_cut_off_as_the_run_stops():
    from headrace.environment.session import pass_on_stderr

    cut_off = [b"Traceback (most recent call last):\n",
               b'  File "/v/pyspark.zip/pyspark/daemon.py", line 262, in manager\n',
               b'  File "/v/pyspark.zip/pyspark/serializers.py", line 602, in read_int\n',
               b"    raise EOFError\n", b"EOFError\n"]
    users = [b"Traceback (most recent call last):\n", b'  File "/app/fraud.py", line 9, in score\n',
             b"    raise EOFError\n", b"EOFError\n"]
    shown: list[bytes] = []
    pass_on_stderr([*cut_off, b"\n", *users, b"after\n"], shown.append)
    assert shown == [*users, b"after\n"]
