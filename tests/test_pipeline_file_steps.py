"""Pipeline files' sql: and operator: steps: built with p.sql and p.add_operator, run on Spark,
and their errors with the file's line."""

from __future__ import annotations

import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from headrace.api.pipeline_file import load_pipeline_file
from headrace.errors import PipelineFileError
from headrace.testing import run_to_completion

MODULE = "pf_operator_steps"
SOURCE = '''
import headrace as hr


def words(record):
    return [{"word": w} for w in record["line"].split()]


class Shout(hr.Operator):
    words = hr.InputPort()
    shouted = hr.OutputPort("word string, times long")

    def __init__(self, suffix="!"):
        self.suffix, self.seen = suffix, {}

    def process(self, record):
        self.seen[record["word"]] = self.seen.get(record["word"], 0) + 1
        self.shouted.emit({"word": record["word"] + self.suffix, "times": self.seen[record["word"]]})


NOT_A_CLASS = 3
'''

LINES = "[[{line: a b a}], [{line: b c}]]"


@pytest.fixture(scope="module", autouse=True)
def steps_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("operator_steps")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    yield
    sys.path.remove(str(folder))


def write(folder: Path, text: str) -> Path:
    path = folder / "pipeline.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_an_sql_step_counts_words(spark, tmp_path):
    pipeline = load_pipeline_file(write(tmp_path, f"""
        pipeline: file_sql
        sources:
          lines: {{type: TestSource, batches: {LINES}, schema: "line string"}}
        steps:
          - name: split
            from: lines
            flat_map: {MODULE}:words
            schema: "word string"
          - name: counts
            sql: SELECT word, count(*) AS n FROM split GROUP BY word
        sinks:
          out: {{type: TestSink, from: counts}}
        """), environ={})
    rows = run_to_completion(pipeline)["out"]
    final = {}
    for row in rows:  # update mode: each batch's counts of the words it touched
        final[row["word"]] = row["n"]
    assert final == dict(Counter("a b a b c".split()))


def test_an_operator_step_runs_the_class_with_its_args(spark, tmp_path):
    pipeline = load_pipeline_file(write(tmp_path, f"""
        pipeline: file_operator
        sources:
          lines: {{type: TestSource, batches: {LINES}, schema: "line string"}}
        steps:
          - name: split
            from: lines
            flat_map: {MODULE}:words
            schema: "word string"
          - name: shout
            from: split
            operator: {MODULE}:Shout
            args: {{suffix: "!!"}}
            partitions: 2
            grouping: {{fields: word}}
        sinks:
          out: {{type: TestSink, from: shout}}
        """), environ={})
    assert "operator Shout x2 (words <- split fields(word))" in pipeline.explain()
    rows = run_to_completion(pipeline)["out"]
    assert sorted((r["word"], r["times"]) for r in rows) == [("a!!", 1), ("a!!", 2), ("b!!", 1), ("b!!", 2),
                                                             ("c!!", 1)]


@pytest.mark.parametrize("step, message", [
    (f"from: lines\n    operator: {MODULE}:NOT_A_CLASS",
     "pipeline.yaml:7: step 'shout': operator: 'pf_operator_steps:NOT_A_CLASS' names int, not a class; name an "
     "hr.Operator subclass"),
    (f"from: lines\n    operator: {MODULE}:Shout\n    input: lines",
     "pipeline.yaml:8: step 'shout': input: choose the input port `from` feeds among words, got 'lines'"),
    (f"from: lines\n    operator: {MODULE}:Shout\n    args: {{loud: true}}",
     "pipeline.yaml:8: step 'shout': Shout(**args) failed: "),
    ("sql: SELECT word FROM nowhere",
     "pipeline.yaml:6: step 'shout': unknown stream or table 'nowhere'"),
])
@pytest.mark.fast
def test_operator_and_sql_step_errors_give_the_line(tmp_path, step, message):
    text = f"""
pipeline: file_errors
sources:
  lines: {{type: TestSource, batches: {LINES}, schema: "line string"}}
steps:
  - name: shout
    {step}
sinks:
  out: {{type: TestSink, from: shout}}
"""
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline_file(write(tmp_path, text), environ={})
    assert str(caught.value).startswith(message), str(caught.value)
