"""Every example builds a valid pipeline and explains itself; the docs' test-kit example runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.cli import load_pipeline

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


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


def test_readme_tour_runs_as_written(spark, tmp_path, monkeypatch, capsys):
    """The README's tour, run as written (with its state under a temporary directory)."""
    monkeypatch.setenv("HEADRACE_STATE_DIR", str(tmp_path))
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "pipeline 'word_counts'" in printed
    assert "fused Python stage #1" in printed
    assert "--- batch" in printed and "window_start" in printed


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
