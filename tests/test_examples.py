"""Every example builds a valid pipeline and explains itself; the docs' test-kit example runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from headrace.cli import load_pipeline

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
FRAGMENT = "<!-- fragment -->"
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    where: str  # README.md:29
    code: str
    fragment: bool  # marked <!-- fragment --> on the line before: a piece of a larger program


def python_blocks(path: Path) -> list[Block]:
    """The fenced python blocks of a Markdown file, in order."""
    text = path.read_text()
    blocks = []
    for match in _PYTHON_BLOCK.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(f"{path.relative_to(ROOT)}:{line}", match.group(1), before.strip() == FRAGMENT))
    return blocks


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_explains(path):
    pipeline = load_pipeline(str(path))
    text = pipeline.explain()
    assert text.startswith(f"pipeline {pipeline.name!r}")
    assert "guarantee:" in text


def test_examples_exist():
    assert {p.stem for p in EXAMPLES} >= {"word_count", "windowed_word_count", "ysb", "sessions", "files_to_postgres"}


def test_testing_doc_example_runs(spark):
    """The example in docs/testing.md, run as written."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "testing.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/testing.md", "exec"), namespace)
    namespace["test_counts_per_window"]()


PROGRESS_LINE = re.compile(r"^batch \d+ \| ")
NOISE = ("[warning]", "WARN", "Python worker", "Traceback", "Exception")


def headrace_command() -> list[str]:
    """``headrace`` as a user types it: the console script beside this Python, else the module."""
    script = Path(sys.executable).with_name("headrace")
    return [str(script)] if script.exists() else [sys.executable, "-m", "headrace.cli"]


def test_readme_tour_runs_as_the_readme_says_quietly_on_a_first_run(tmp_path):
    """The README's tour saved as words.py: ``headrace explain words.py`` prints the plan and starts
    nothing (the file calls ``p.run()``); ``headrace run words.py`` runs it, its functions reaching
    Spark's workers, on a first run (no JVM class archive yet: the JVM writes one as it exits) with
    nothing on stderr but the progress lines: no JVM class-data warnings, no Python-worker chatter."""
    (tmp_path / "words.py").write_text(python_blocks(ROOT / "README.md")[0].code)
    env = {**os.environ, "HEADRACE_CACHE_DIR": str(tmp_path / "cache"), "PYSPARK_PYTHON": sys.executable}

    def headrace(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*headrace_command(), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)

    explained = headrace("explain", "words.py")
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.count("pipeline 'word_counts'") == 2  # the file's print(p.explain()), then the command's
    assert "--- batch" not in explained.stdout and explained.stderr == ""
    assert not (tmp_path / ".headrace").exists()  # no checkpoint, no Spark log: nothing ran

    ran = headrace("run", "words.py")
    assert ran.returncode == 0, ran.stderr
    assert "fused Python stage #1" in ran.stdout
    assert "--- batch" in ran.stdout and "window_start" in ran.stdout
    assert "word_counts: 20,000 rows in 2 batches, 0 dead letters, stopped: input exhausted" in ran.stdout
    assert [line for line in ran.stderr.splitlines() if not PROGRESS_LINE.match(line)] == [], ran.stderr
    assert not [word for word in NOISE if word in ran.stderr], ran.stderr
    assert list((tmp_path / "cache" / "jvm").glob("*.jsa")), "not a first run: no class archive was written"


def test_fraud_alerts_prints_what_docs_process_md_shows(spark, capsys):
    """examples/fraud_alerts.py, run as a script, prints the output docs/process.md shows."""
    import runpy

    root = Path(__file__).resolve().parents[1]
    runpy.run_path(str(root / "examples" / "fraud_alerts.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("card ")]
    doc = (root / "docs" / "process.md").read_text()
    shown = doc.split("prints:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    assert printed == shown == ["card 4711: 0.50 then 900.00 (alert 1)", "card 4711: 0.25 then 650.00 (alert 2)"]


def test_apex_word_count_prints_what_docs_operators_md_shows(spark, capsys):
    """examples/apex_word_count.py, run as a script, prints the output docs/operators.md shows."""
    import runpy

    root = Path(__file__).resolve().parents[1]
    runpy.run_path(str(root / "examples" / "apex_word_count.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    doc = (root / "docs" / "operators.md").read_text()
    shown = doc.split("prints:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    assert printed == shown
    assert shown[1] == "  from window 0: brown=1 dog=2 fox=1 jumps=1 lazy=1 over=1 quick=1 sleeps=1 the=3"


def test_two_stage_windows_prints_what_docs_windows_md_shows(spark, capsys):
    """examples/two_stage_windows.py, run as a script, prints the output docs/windows.md shows."""
    import runpy

    root = Path(__file__).resolve().parents[1]
    runpy.run_path(str(root / "examples" / "two_stage_windows.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if "busiest minute" in line]
    doc = (root / "docs" / "windows.md").read_text()
    shown = doc.split("`python examples/two_stage_windows.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines() == [
        "cart [00:00, 00:05) busiest minute 1, total 2",
        "home [00:00, 00:05) busiest minute 3, total 6",
        "home [00:05, 00:10) busiest minute 1, total 1",
    ]

