"""Pipeline files (headrace/api/pipeline_file.py): every error with its line, the same plan as
the fluent API, runs on Spark, Flume-style selectors and sink groups, the Flume netcat example,
and the commands headrace init, validate and run."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.api.file_steps import STEP_KINDS
from headrace.api.pipeline_file import SINK_TYPES, SOURCE_TYPES, load_pipeline_file
from headrace.cli import load_pipeline, main
from headrace.connectors.files_sink import read_rows
from headrace.errors import PipelineFileError
from headrace.testing import run_to_completion

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
STEPS_MODULE = "pf_test_steps"  # the Python steps the files below import, written once per run

STEPS_SOURCE = '''
import headrace as hr

NOT_A_FUNCTION = 42


def parse(record):
    region, _, message = record["line"].partition(" ")
    return {"region": region, "message": message}


def is_long(record):
    return len(record["message"]) > 3


def words(record):
    return [{"word": w} for w in record["message"].split()]


def first_letter(record):
    return record["word"][:1]


def longest(a, b):
    return a if len(a["word"]) >= len(b["word"]) else b


def same_batch(batch):
    return batch


class Alerts(hr.KeyedProcessFunction):
    seen = hr.ValueState()

    def __init__(self, threshold=2):
        self.threshold = threshold

    def process(self, record, ctx):
        self.seen.update((self.seen.value() or 0) + 1)
        if self.seen.value() == self.threshold:
            ctx.emit({"word": record["word"], "times": self.seen.value()})
'''


@pytest.fixture(scope="module", autouse=True)
def steps_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp("steps")
    (folder / f"{STEPS_MODULE}.py").write_text(STEPS_SOURCE)
    sys.path.insert(0, str(folder))
    yield
    sys.path.remove(str(folder))


def write(folder: Path, text: str, name: str = "pipeline.yaml") -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def error_of(folder: Path, text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline_file(write(folder, text), environ=environ or {})
    return str(caught.value)


BASE = """
pipeline: errors
sources:
  lines:
    type: TestSource
    batches: [[{line: eu hello}]]
    schema: "line string"
steps:
  - name: parsed
    from: lines
    map: pf_test_steps:parse
    schema: "region string, message string"
sinks:
  out: {type: TestSink, from: parsed}
"""


def base_with(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new)


# -- errors, each with its line ----------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("pipeline: x\nsources:\n  a: [1, 2\nsinks: {}\n",
     "pipeline.yaml:4: not valid YAML: while parsing a flow sequence did not find expected ',' or ']'"),
    ("", "pipeline.yaml: the file is empty; a pipeline file starts with `pipeline: NAME`"),
    (base_with("sinks:", "sinkz:"),
     "pipeline.yaml:12: unknown key 'sinkz' (did you mean 'sinks'?); the file takes pipeline, guarantee, trigger, "
     "batch_duration, sources, tables, steps, sinks, sink_groups"),
    (base_with("    schema: \"region", "    shema: \"region"),
     "pipeline.yaml:11: step 'parsed': unknown key 'shema' (did you mean 'schema'?); a map step takes name, from, "
     "selector, map, schema"),
    (base_with("    map: pf_test_steps:parse", "    mapp: pf_test_steps:parse"),
     "pipeline.yaml:8: step 'parsed': the step does nothing (did you mean 'map'?): give it one action, "
     + ", ".join(STEP_KINDS)),
    (base_with("    from: lines", "    from: liens"),
     "pipeline.yaml:9: step 'parsed': from: 'liens' is not a source or step (did you mean 'lines'?); the sources "
     "and steps are lines, parsed"),
    (base_with("  out: {type: TestSink, from: parsed}", "  out: {type: TestSink, from: lines}"),
     "pipeline.yaml:8: step 'parsed': nothing reads it: name it in the `from:` of a step or sink, or remove it"),
    (base_with("    from: lines\n", ""),
     "pipeline.yaml:8: step 'parsed': the step needs from: the source or step it reads"),
    (base_with("pf_test_steps:parse", "pf_test_stepz:parse"),
     "pipeline.yaml:10: step 'parsed': cannot import module 'pf_test_stepz': no module named 'pf_test_stepz' on "
     "the Python path (the pipeline file's directory is on it)"),
    (base_with("pf_test_steps:parse", "pf_test_steps:parsee"),
     "pipeline.yaml:10: step 'parsed': module 'pf_test_steps' has no attribute 'parsee' (did you mean 'parse'?); "
     "its functions and classes: Alerts, first_letter, is_long, longest, parse, same_batch, words"),
    (base_with("pf_test_steps:parse", "pf_test_steps:NOT_A_FUNCTION"),
     "pipeline.yaml:10: step 'parsed': pf_test_steps:NOT_A_FUNCTION is a int (42), not a function"),
    (base_with("pf_test_steps:parse", "pf_test_steps.parse"),
     "pipeline.yaml:10: step 'parsed': 'pf_test_steps.parse' is not an import path; write module:function, "
     "e.g. my_steps:parse"),
    (base_with("    schema: \"region string, message string\"\n", ""),
     "pipeline.yaml:10: step 'parsed': map needs the output schema of parse at pf_test_steps.py:7: annotate its "
     "return type with a dataclass or TypedDict, or pass schema={'field': 'type', ...}"),
    (base_with("    type: TestSource", "    type: TestSorce"),
     "pipeline.yaml:4: source 'lines': unknown source type 'TestSorce' (did you mean 'TestSource'?); the source "
     "types are " + ", ".join(SOURCE_TYPES.names)),
    (base_with("    schema: \"line string\"", "    schema: \"line string\"\n    flsh: false"),
     "pipeline.yaml:7: source 'lines': TestSource has no option 'flsh' (did you mean 'flush'?); its options are "
     "batches, event_time, flush, max_out_of_orderness, schema, selector, type"),
    (base_with("    batches: [[{line: eu hello}]]\n", ""),
     "pipeline.yaml:3: source 'lines': TestSource needs batches"),
    (base_with("    schema: \"line string\"", "    schema: \"line strin\""),
     "pipeline.yaml:3: source 'lines': TestSource schema: unknown type 'strin'; use one of binary, boolean, date, "
     "double, float, int, long, string, timestamp"),
    (base_with("  out: {type: TestSink, from: parsed}", "  out: {type: Console, from: parsed, limit: -1}"),
     "pipeline.yaml:13: sink 'out': Console sink: limit must be a whole number >= 0 or None, got -1"),
    (base_with("pipeline: errors", "pipeline: errors\nguarantee: exactly-once")
     .replace("{type: TestSink, from: parsed}", "{type: Console, from: parsed}"),
     "pipeline.yaml:2: pipeline 'errors' asks for exactly-once but can only give at-least-once: sink 'out' (Console "
     "at pipeline.yaml:14) is at-least-once; use connectors that give exactly-once or ask for less"),
    (base_with("pipeline: errors", "pipeline: errors\nguarantee: twice"),
     "pipeline.yaml:2: pipeline 'errors': unknown guarantee 'twice'; use one of exactly-once, at-least-once, "
     "at-most-once"),
    (base_with("    from: lines", "    from: lines\n    filter: \"length(line) > 2\""),
     "pipeline.yaml:11: step 'parsed': the step has two actions, filter and map; a step does one thing: split it "
     "in two"),
    (base_with("  - name: parsed", "  - name: lines"),
     "pipeline.yaml:8: step 'lines': the name is already used by the source at line 3; every source, table, step "
     "and sink needs a name of its own"),
    (base_with("    type: TestSource", "    type: TestSource\n    type: Generator"),
     "pipeline.yaml:5: the key 'type' appears twice (first at line 4); keep one"),
    (base_with("    batches: [[{line: eu hello}]]", "    batches: [[{line: eu hello}]]\n    flush: ${FLUSH}"),
     "pipeline.yaml:6: the environment variable FLUSH is not set; set it, or give a default: ${FLUSH:-value}"),
])
@pytest.mark.fast
def test_each_error_names_its_line(tmp_path, text, message):
    assert error_of(tmp_path, text) == message


STREAM = """
pipeline: steps
sources:
  clicks:
    type: TestSource
    batches: [[{{user: a, amount: 3, ts: 1000}}]]
    schema: "user string, amount long, ts timestamp"
    event_time: ts
steps:
  - name: step
    from: clicks
{action}
sinks:
  out: {{type: TestSink, from: step}}
"""


@pytest.mark.parametrize("action, message", [
    ("    select: [user, nope]",
     "pipeline.yaml:11: step 'step': unknown column 'nope'; the stream from 'clicks_event_time' has user, amount, "
     "ts"),
    ("    select: [\"amount * 2\"]",
     "pipeline.yaml:11: step 'step': select takes column names and {name: expression} entries, got 'amount * 2'; "
     "name a computed column: {doubled: \"amount * 2\"}"),
    ("    window:\n      tumbling: -5s\n      aggregate: {n: count}",
     "pipeline.yaml:12: step 'step': hr.Tumbling: the window size must be positive, got '-5s'"),
    ("    window:\n      tumbling: 5s\n      aggregate: {n: count, total: sum(amont)}",
     "pipeline.yaml:11: step 'step': unknown column 'amont'; the stream from 'clicks_event_time' has user, "
     "amount, ts"),
    ("    window:\n      tumbling: 5s\n      aggregate: {n: cuont}",
     "pipeline.yaml:13: step 'step': aggregate n: 'cuont' is not an aggregate (did you mean 'count'?); write count, "
     "sum(col), min(col), max(col) or mean(col)"),
    ("    window:\n      tumbling: 5s\n      sliding: 2s\n      aggregate: {n: count}",
     "pipeline.yaml:13: step 'step': the window has tumbling and sliding; give one"),
    ("    window:\n      sliding: 5s\n      aggregate: {n: count}",
     "pipeline.yaml:12: step 'step': a sliding window needs a size and a slide: sliding: {size: 10s, slide: 5s}"),
    ("    window:\n      tumbling: 5s\n      trigger: {early_every: 0}\n      aggregate: {n: count}",
     "pipeline.yaml:13: step 'step': EveryN needs a positive number of records, got 0"),
    ("    window:\n      tumbling: 5s\n      allowed_lateness: -1s\n      aggregate: {n: count}",
     "pipeline.yaml:11: step 'step': allowed_lateness must not be negative, got '-1s'"),
    ("    aggregate: {n: count}",
     "pipeline.yaml:10: step 'step': aggregate works per key: read from a key_by step, not 'clicks'"),
    ("    key_by: usr",
     "pipeline.yaml:11: step 'step': unknown key field 'usr'; the stream from 'clicks_event_time' has user, "
     "amount, ts"),
    ("    event_time: user",
     "pipeline.yaml:11: step 'step': event-time field 'user' is a string; it must be a timestamp or epoch "
     "milliseconds (long)"),
    ("    join: userz\n    on: user",
     "pipeline.yaml:11: step 'step': join: 'userz' is neither a table under tables: nor a source or step; the tables "
     "are none; the sources and steps are clicks"),
    ("    union: [step]",
     "pipeline.yaml:11: step 'step': the steps read from each other in a cycle: step -> step"),
    ("    late_records: true",
     "pipeline.yaml:10: step 'step': late_records reads from a window step or a join of two streams; 'clicks' is "
     "neither"),
    ("    process: pf_test_steps:Alerts\n    schema: \"word string, times long\"",
     "pipeline.yaml:10: step 'step': process works per key: read from a key_by step, not 'clicks'"),
])
@pytest.mark.fast
def test_step_errors_name_the_line_of_the_value(tmp_path, action, message):
    assert error_of(tmp_path, STREAM.format(action=action)) == message


SELECTED = """
pipeline: routes
sources:
  lines:
    type: TestSource
    batches: [[{{region: eu, message: hi}}]]
    schema: "region string, message string"
    selector:
{selector}
sinks:
  eu_out: {{type: TestSink, from: lines}}
  rest: {{type: TestSink, from: lines}}
"""


@pytest.mark.parametrize("selector, message", [
    ("      multiplexing: regoin\n      mapping: {eu: [eu_out]}\n      default: [rest]",
     "pipeline.yaml:8: source 'lines': the selector routes by 'regoin', which is not a field of 'lines' (did you "
     "mean 'region'?); its fields are region, message"),
    ("      multiplexing: region\n      mapping: {eu: [eu_ot]}\n      default: [rest]",
     "pipeline.yaml:9: source 'lines': the selector names 'eu_ot', which does not read from 'lines' (did you mean "
     "'eu_out'?); what reads from it: eu_out, rest"),
    ("      multiplexing: region\n      mapping: {eu: [eu_out]}",
     "pipeline.yaml:8: source 'lines': the multiplexing selector sends nothing to 'rest', which reads from "
     "'lines': map a value to it or list it under default"),
    ("      multiplexing: region\n      mapping: {eu: [eu_out]}\n      defaults: [rest]",
     "pipeline.yaml:10: source 'lines': unknown key 'defaults' (did you mean 'default'?); a selector takes "
     "multiplexing, mapping, default"),
    ("      replicate: true",
     "pipeline.yaml:8: source 'lines': selector is `replicating` or a mapping with multiplexing: FIELD, mapping: "
     "{VALUE: [reader, ...]} and default: [reader, ...]; got a mapping"),
])
@pytest.mark.fast
def test_selector_errors(tmp_path, selector, message):
    assert error_of(tmp_path, SELECTED.format(selector=selector)) == message


GROUPED = """
pipeline: groups
sources:
  lines:
    type: TestSource
    batches: [[{line: a}]]
    schema: "line string"
sinks:
  first: {type: TestSink}
  second: {type: TestSink}
sink_groups:
  both:
    from: lines
    failover: [first, secnd]
"""


@pytest.mark.parametrize("old, new, message", [
    ("[first, secnd]", "[first, secnd]",
     "pipeline.yaml:13: sink group 'both': 'secnd' is not a sink under sinks: (did you mean 'second'?); the sinks "
     "are first, second"),
    ("[first, secnd]", "[first]",
     "pipeline.yaml:13: sink group 'both': failover: lists the member sinks in order, a primary and at least one "
     "backup: [primary, backup]"),
    ("  second: {type: TestSink}", "  second: {type: TestSink, from: lines}",
     "pipeline.yaml:9: sink 'second': the sink is a member of sink group 'both' (line 11), which reads the "
     "stream: remove from: here"),
    ("    from: lines\n", "",
     "pipeline.yaml:11: sink group 'both': the group needs from: the source or step its members write"),
    ("  first: {type: TestSink}", "  first: {type: Failover}",
     "pipeline.yaml:8: sink 'first': a failover group is declared under sink_groups: {name: {from: step, failover: "
     "[primary, backup]}}"),
])
@pytest.mark.fast
def test_sink_group_errors(tmp_path, old, new, message):
    text = GROUPED.replace("[first, secnd]", "[first, second]") if old != "[first, secnd]" else GROUPED
    assert error_of(tmp_path, text.replace(old, new)) == message


@pytest.mark.fast
def test_a_sink_outside_any_group_needs_from(tmp_path):
    text = GROUPED.replace("[first, secnd]", "[first, second]").replace("sinks:\n", "sinks:\n  third: {type: Null}\n")
    assert error_of(tmp_path, text) == ("pipeline.yaml:8: sink 'third': the sink needs from: the source or step it "
                                        "writes (or list it in a sink group's failover:)")


@pytest.mark.fast
def test_environment_variables_fill_values_and_keep_their_types(tmp_path):
    batches = "    batches: [[{line: eu hello}]]"
    text = base_with(batches, f"{batches}\n    flush: ${{FLUSH:-true}}")
    path = write(tmp_path, text.replace("pipeline: errors", "pipeline: ${NAME}"))
    pipeline = load_pipeline_file(path, environ={"NAME": "from_env", "FLUSH": "false"})
    assert pipeline.name == "from_env"
    assert pipeline.plan.nodes["lines"].connector.flush is False
    assert load_pipeline_file(path, environ={"NAME": "x"}).plan.nodes["lines"].connector.flush is True


@pytest.mark.fast
def test_every_step_kind_is_one_registry_entry():
    assert list(STEP_KINDS) == ["filter", "select", "with_columns", "event_time", "key_by", "map", "flat_map",
                                "map_batches", "join", "union", "dead_letters", "dedupe", "aggregate", "reduce",
                                "process", "window", "late_records", "sql", "operator"]
    assert all(kind.summary for kind in STEP_KINDS.values())
    assert "Failover" not in SINK_TYPES and "Console" in SINK_TYPES and "Socket" in SOURCE_TYPES


@pytest.mark.fast
def test_the_connector_types_are_those_of_hr_sources_and_hr_sinks():
    """A file's `type:` names are read from headrace/sources.py and sinks.py without importing them."""
    from headrace.connectors.base import SinkConnector, SourceConnector

    for types, module, base, left_out in ((SOURCE_TYPES, hr.sources, SourceConnector, set()),
                                          (SINK_TYPES, hr.sinks, SinkConnector, {"Failover"})):
        classes = [n for n in module.__all__ if isinstance(getattr(module, n), type)
                   and issubclass(getattr(module, n), base) and n not in left_out]
        assert types.names == classes
        assert all(types.get(name) is getattr(module, name) for name in classes)


# -- the same plan as the fluent API ----------------------------------------------------------------

def plan_without_places(pipeline: hr.Pipeline) -> dict[str, Any]:
    """The plan's JSON without where each step was defined (a file's line, a Python line)."""
    plan = pipeline.to_json()
    for node in plan["nodes"]:
        assert re.fullmatch(r"[\w.]+:\d+", node.pop("defined_at")), node
    return plan


NATIVE = """
pipeline: native_steps
sources:
  clicks:
    type: TestSource
    batches: [[{user: a, amount: 3, ts: 1000}]]
    schema: "user string, amount long, ts timestamp"
    event_time: ts
    max_out_of_orderness: 1s
tables:
  users:
    rows: [{user: a, country: fr}]
    schema: "user string, country string"
steps:
  - name: big
    from: clicks
    filter: "amount > 2"
  - name: cents
    from: big
    with_columns: {cents: "amount * 100", one: 1}
  - name: enriched
    from: cents
    join: users
    on: user
    how: left
  - name: slim
    from: enriched
    select: [user, country, ts, {doubled: "amount * 2"}]
  - name: by_user
    from: slim
    key_by: [user, country]
  - name: per_user
    from: by_user
    window:
      sliding: {size: 10s, slide: 5s}
      trigger: {early_every: 2}
      allowed_lateness: 5s
      accumulation: discarding
      aggregate: {n: count, most: max(doubled)}
  - name: late
    from: per_user
    late_records: true
sinks:
  out: {type: TestSink, from: per_user}
  late_out: {type: TestSink, from: late}
"""


def native_fluent() -> hr.Pipeline:
    p = hr.Pipeline("native_steps")
    clicks = p.source("clicks", hr.sources.TestSource([[{"user": "a", "amount": 3, "ts": 1000}]],
                                                      schema="user string, amount long, ts timestamp"),
                      event_time="ts", max_out_of_orderness="1s")
    users = p.table("users", [{"user": "a", "country": "fr"}], schema="user string, country string")
    per_user = (clicks.filter(hr.expr("amount > 2"), name="big")
                .with_columns(name="cents", cents=hr.expr("amount * 100"), one=hr.lit(1))
                .join(users, "user", how="left", name="enriched")
                .select("user", "country", "ts", hr.expr("amount * 2").alias("doubled"), name="slim")
                .key_by("user", "country", name="by_user")
                .window(hr.Sliding("10s", "5s"), trigger=hr.AfterWatermark(early=hr.EveryN(2)),
                        allowed_lateness="5s", accumulation="discarding", name="per_user")
                .aggregate(n=hr.count(), most=hr.max("doubled")))
    late = per_user.late_records(name="late")
    per_user.sink("out", hr.sinks.TestSink())
    late.sink("late_out", hr.sinks.TestSink())
    return p


PYTHON = """
pipeline: python_steps
sources:
  lines:
    type: TestSource
    batches: [[{line: eu hello there}]]
    schema: "line string"
  more:
    type: TestSource
    batches: [[{line: us bye}]]
    schema: "line string"
steps:
  - name: all_lines
    from: lines
    union: [more]
  - name: parsed
    from: all_lines
    map: pf_test_steps:parse
    schema: "region string, message string"
  - name: long_only
    from: parsed
    filter: {function: pf_test_steps:is_long}
  - name: same
    from: long_only
    map_batches: pf_test_steps:same_batch
    format: pandas
  - name: split
    from: same
    flat_map: pf_test_steps:words
    schema: {word: string}
  - name: by_letter
    from: split
    key_by: {function: pf_test_steps:first_letter}
  - name: longest
    from: by_letter
    reduce: pf_test_steps:longest
    ttl: 1h
sinks:
  out: {type: Console, from: longest, limit: 5, truncate: 10}
"""


def python_fluent() -> hr.Pipeline:
    import pf_test_steps as steps

    p = hr.Pipeline("python_steps")
    lines = p.source("lines", hr.sources.TestSource([[{"line": "eu hello there"}]], schema="line string"))
    more = p.source("more", hr.sources.TestSource([[{"line": "us bye"}]], schema="line string"))
    (lines.union(more, name="all_lines")
     .map(steps.parse, schema="region string, message string", name="parsed")
     .filter(steps.is_long, name="long_only")
     .map_batches(steps.same_batch, format="pandas", name="same")
     .flat_map(steps.words, schema={"word": "string"}, name="split")
     .key_by(steps.first_letter, name="by_letter")
     .reduce(steps.longest, name="longest", ttl="1h")
     .sink("out", hr.sinks.Console(limit=5, truncate=10)))
    return p


PROCESS = """
pipeline: process_steps
sources:
  files:
    type: Files
    path: {folder}
    format: jsonl
    schema: "word string, t long"
    event_time: t
steps:
  - name: bad
    dead_letters: [files]
  - name: by_word
    from: files
    key_by: word
  - name: alerts
    from: by_word
    process: pf_test_steps:Alerts
    arguments: {{threshold: 3}}
    schema: "word string, times long"
  - name: sessions
    from: by_word
    window:
      session: 30s
      aggregate: {{n: count}}
sinks:
  alerts_out: {{type: TestSink, from: alerts}}
  sessions_out: {{type: TestSink, from: sessions}}
  bad_out: {{type: TestSink, from: bad}}
"""


def process_fluent(folder: str) -> hr.Pipeline:
    import pf_test_steps as steps

    p = hr.Pipeline("process_steps")
    files = p.source("files", hr.sources.Files(folder, format="jsonl", schema="word string, t long"), event_time="t")
    bad = p.dead_letters(hr.Stream(p, p.plan.nodes["files"]), name="bad")
    by_word = files.key_by("word", name="by_word")
    alerts = by_word.process(steps.Alerts(threshold=3), schema="word string, times long", name="alerts")
    sessions = by_word.window(hr.Session("30s"), name="sessions").aggregate(n=hr.count())
    alerts.sink("alerts_out", hr.sinks.TestSink())
    sessions.sink("sessions_out", hr.sinks.TestSink())
    bad.sink("bad_out", hr.sinks.TestSink())
    return p


@pytest.mark.fast
def test_a_file_builds_the_plan_of_its_fluent_twin(tmp_path):
    assert plan_without_places(load_pipeline_file(write(tmp_path, NATIVE))) == plan_without_places(native_fluent())
    assert plan_without_places(load_pipeline_file(write(tmp_path, PYTHON))) == plan_without_places(python_fluent())
    folder = str(tmp_path / "in")
    from_file = load_pipeline_file(write(tmp_path, PROCESS.format(folder=folder)))
    assert plan_without_places(from_file) == plan_without_places(process_fluent(folder))


@pytest.mark.fast
def test_steps_are_defined_at_their_lines_of_the_file(tmp_path):
    pipeline = load_pipeline_file(write(tmp_path, NATIVE))
    places = {name: node.defined_at for name, node in pipeline.plan.nodes.items()}
    assert places == {"clicks": "pipeline.yaml:3", "clicks_event_time": "pipeline.yaml:7",
                      "users": "pipeline.yaml:10", "big": "pipeline.yaml:16", "cents": "pipeline.yaml:19",
                      "enriched": "pipeline.yaml:22", "slim": "pipeline.yaml:27", "by_user": "pipeline.yaml:30",
                      "per_user": "pipeline.yaml:33", "late": "pipeline.yaml:41", "out": "pipeline.yaml:43",
                      "late_out": "pipeline.yaml:44"}
    assert "[pipeline.yaml:33]" in pipeline.explain()


@pytest.mark.fast
def test_the_word_count_example_file_is_the_python_example(tmp_path):
    from_file = load_pipeline_file(EXAMPLES / "word_count.yaml")
    from_python = load_pipeline(str(EXAMPLES / "word_count.py"))
    assert plan_without_places(from_file) == plan_without_places(from_python)


# -- runs on Spark ----------------------------------------------------------------------------------

RUN = """
pipeline: run_{tag}
sources:
  clicks:
    type: TestSource
    schema: "user string, region string, amount long, ts long"
    event_time: ts
    batches:
      - [{{user: a, region: eu, amount: 5, ts: 1000}}, {{user: b, region: us, amount: 7, ts: 2000}},
         {{user: a, region: eu, amount: 1, ts: 3000}}]
      - [{{user: c, region: apac, amount: 2, ts: 11000}}, {{user: a, region: eu, amount: 4, ts: 12000}},
         {{user: d, region: null, amount: 9, ts: 13000}}]
steps:
  - name: sized
    from: clicks
    with_columns: {{big: "amount >= 4"}}
    selector:
      multiplexing: region
      mapping: {{eu: [eu_out, by_user], us: [us_out, by_user]}}
      default: [others]
  - name: by_user
    from: sized
    key_by: user
  - name: per_user
    from: by_user
    window:
      tumbling: 10s
      aggregate: {{n: count, total: sum(amount)}}
sinks:
  eu_out: {{type: TestSink, from: sized}}
  us_out: {{type: TestSink, from: sized}}
  others: {{type: TestSink, from: sized}}
  windows: {{type: TestSink, from: per_user}}
"""


def test_a_file_pipeline_runs_on_spark_and_routes_by_field(spark, tmp_path):
    pipeline = load_pipeline_file(write(tmp_path, RUN.format(tag=uuid.uuid4().hex[:8])))
    assert [n for n in pipeline.plan.nodes if "_to_" in n] == ["sized_to_by_user", "sized_to_eu_out",
                                                                "sized_to_us_out", "sized_to_others"]
    out = run_to_completion(pipeline, state_dir=str(tmp_path / "state"))

    def rows(sink: str) -> list[tuple[Any, ...]]:
        return [(r["user"], r["region"], r["amount"], r["big"]) for r in out[sink]]

    assert rows("eu_out") == [("a", "eu", 5, True), ("a", "eu", 1, False), ("a", "eu", 4, True)]
    assert rows("us_out") == [("b", "us", 7, True)]
    assert rows("others") == [("c", "apac", 2, False), ("d", None, 9, True)]
    windows = sorted((r["user"], r["window_start"].timestamp(), r["n"], r["total"]) for r in out["windows"])
    assert windows == [("a", 0.0, 2, 6), ("a", 10.0, 1, 4), ("b", 0.0, 1, 7)]


# -- the Flume example -------------------------------------------------------------------------------

def console_rows(text: str) -> list[dict[str, str]]:
    """The rows of every table a Console sink printed into ``text``."""
    found: list[dict[str, str]] = []
    for block in re.split(r"^--- batch \d+ ---$", text, flags=re.M)[1:]:
        lines = [line for line in block.splitlines() if line.startswith("|")]
        if not lines:
            continue
        names = [cell.strip() for cell in lines[0].strip("|").split("|")]
        for line in lines[1:]:
            found.append(dict(zip(names, (cell.strip() for cell in line.strip("|").split("|")))))
    return found


def serve_lines(lines: list[str]) -> tuple[int, threading.Thread]:
    """A netcat-like server: accept one connection, send the lines, close."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def run() -> None:
        with server:
            connection, _ = server.accept()
            with connection:
                for line in lines:
                    connection.sendall(f"{line}\n".encode())
                    time.sleep(0.05)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread


def test_the_flume_netcat_example_routes_each_line_to_its_sink(spark, tmp_path, monkeypatch, capsys, caplog):
    lines = ["region=eu first from europe", "region=us hello america", "no header here", "region=eu second one",
             "region=apac far away", "region=us bye now", "region=EU upper case is not eu"]
    port, server = serve_lines(lines)
    archive = tmp_path / "archive"
    monkeypatch.setenv("NETCAT_PORT", str(port))
    monkeypatch.setenv("ARCHIVE_DIR", str(archive))
    pipeline = load_pipeline_file(EXAMPLES / "flume_netcat.yaml")
    result = pipeline.run(state_dir=str(tmp_path / "state"), progress="quiet", fresh=True)
    server.join(5)
    assert result.stopped_by == "input exhausted"
    out, err = capsys.readouterr()
    assert console_rows(out) == [{"region": "eu", "message": "first from europe"},
                                 {"region": "eu", "message": "second one"}]
    assert console_rows(err) == [{"region": "us", "message": "hello america"}, {"region": "us", "message": "bye now"}]
    assert read_rows(str(archive), "jsonl") == [{"message": "no header here"},
                                                {"region": "apac", "message": "far away"},
                                                {"message": "region=EU upper case is not eu"}]
    group = pipeline.plan.nodes["archive"].connector
    assert group.failovers == result.batches and group.failovers_by_member == {"archive_primary": result.batches}
    assert any("member 'archive_primary' failed, failing over to 'archive_backup'" in r.getMessage()
               for r in caplog.records)


# -- the commands -----------------------------------------------------------------------------------

def headrace(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, env=env)


@pytest.mark.fast
def test_validate_prints_a_summary_or_the_error_with_its_line(tmp_path):
    good = write(tmp_path, NATIVE, "good.yaml")
    result = headrace("validate", str(good), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (f"{good}: pipeline 'native_steps' is valid: 1 source, 8 steps, 2 sinks; guarantee "
                             "exactly-once\n")
    report = json.loads(headrace("validate", str(good), "--json", cwd=tmp_path).stdout)
    assert {k: report[k] for k in ("valid", "pipeline", "sources", "steps", "sinks", "tables", "guarantee")} == {
        "valid": True, "pipeline": "native_steps", "sources": 1, "steps": 8, "sinks": 2, "tables": 1,
        "guarantee": "exactly-once"}
    assert [n["name"] for n in report["plan"]["nodes"]][-2:] == ["out", "late_out"]
    explained = headrace("validate", str(good), "--explain", cwd=tmp_path).stdout
    assert "pipeline 'native_steps'\n  guarantee: exactly-once" in explained
    assert headrace("explain", str(good), cwd=tmp_path).stdout == explained.split("\n", 1)[1]

    bad = write(tmp_path, NATIVE.replace("filter: \"amount > 2\"", "fliter: \"amount > 2\""), "bad.yaml")
    result = headrace("validate", str(bad), cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("headrace: bad.yaml:14: step 'big': the step does nothing (did you mean 'filter'?): "
                             f"give it one action, {', '.join(STEP_KINDS)}\n")
    report = json.loads(headrace("validate", str(bad), "--json", cwd=tmp_path).stdout)
    error = result.stderr[len("headrace: "):-1]
    assert report == {"file": str(bad), "valid": False, "line": 14, "error": error,
                      "errors": [{"line": 14, "error": error}]}
    assert headrace("validate", "nowhere.yaml", cwd=tmp_path).stderr == "headrace: error: no such file: nowhere.yaml\n"
    result = headrace("validate", str(EXAMPLES / "word_count.py"), cwd=tmp_path)  # a Python file too
    assert result.stdout.endswith("word_count.py: pipeline 'word_count' is valid: 1 source, 3 steps, 1 sink; "
                                  "guarantee at-least-once\n"), result.stderr


NO_SPARK = """
import sys, time
started = time.perf_counter()
from headrace.cli import main
code = main(["validate", sys.argv[1]])
from pyspark import SparkContext
from pyspark.sql import SparkSession
assert SparkContext._gateway is None and SparkContext._jvm is None, "a JVM was started"
assert SparkSession._instantiatedSession is None, "a Spark session was started"
sys.exit(code)
"""


@pytest.mark.fast
@pytest.mark.parametrize("project", ["flume_netcat", "scaffold"])
def test_validate_never_starts_spark(tmp_path, project):
    """(How long it takes is benchmarks/validate.py's to measure: docs/performance.md.)"""
    if project == "scaffold":
        assert main(["init", str(tmp_path / "scaffold")]) == 0
        path = tmp_path / "scaffold" / "pipeline.yaml"
    else:
        path = EXAMPLES / f"{project}.yaml"
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"),  # a JVM could not start: validate must not try
           "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if "java" not in p.lower())}
    result = subprocess.run([sys.executable, "-c", NO_SPARK, str(path)], capture_output=True, text=True,
                            cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stdout


def test_init_then_validate_then_run_the_scaffold(spark, tmp_path, monkeypatch):
    project = tmp_path / "shop-orders"
    result = headrace("init", str(project), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()) == [
        "README.md", "input/orders.jsonl", "pipeline.yaml", "shop_orders_steps.py", "test_pipeline.py"]
    again = headrace("init", str(project), cwd=tmp_path)
    assert again.returncode == 2 and "already exists and is not an empty directory" in again.stderr

    validated = headrace("validate", "pipeline.yaml", cwd=project)
    assert validated.returncode == 0, validated.stderr
    assert validated.stdout == ("pipeline.yaml: pipeline 'shop_orders' is valid: 1 source, 2 steps, 2 sinks; "
                                "guarantee at-least-once\n")

    monkeypatch.chdir(project)
    assert main(["run", "pipeline.yaml", "--quiet", "--state-dir", str(tmp_path / "state")]) == 0
    assert read_rows(str(project / "output"), "jsonl") == [
        {"order_id": "o-1", "customer": "ada", "amount": 120.0, "total": 144.0},
        {"order_id": "o-3", "customer": "alan", "amount": 90.0, "total": 108.0}]

    # the scaffold's own tests pass, run here in this test session's Spark
    import importlib.util

    spec = importlib.util.spec_from_file_location("scaffold_test_pipeline", project / "test_pipeline.py")
    assert spec is not None and spec.loader is not None
    scaffold_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scaffold_tests)
    scaffold_tests.test_add_tax()
    (tmp_path / "own").mkdir()
    scaffold_tests.test_the_pipeline_saves_the_big_orders(tmp_path / "own", monkeypatch)


@pytest.mark.fast
def test_a_file_can_compute_columns_called_name_ttl_and_emit(tmp_path):
    p = load_pipeline_file(write(tmp_path, """
        pipeline: column_names
        sources:
          lines: {type: TestSource, batches: [], schema: "line string, ts long", event_time: ts}
        steps:
          - name: named
            from: lines
            with_columns: {name: "upper(line)"}
          - name: keyed
            from: named
            key_by: name
          - name: per_name
            from: keyed
            aggregate: {ttl: count, total: count}
          - name: windows
            from: keyed
            window: {tumbling: 1s, aggregate: {emit: count}, emit: updates}
        sinks:
          out: {type: TestSink, from: per_name}
          w: {type: TestSink, from: windows}
        """), environ={})
    assert [f for f, _ in p.plan.nodes["named"].schema] == ["line", "ts", "name"]
    assert [f for f, _ in p.plan.nodes["per_name"].schema] == ["name", "ttl", "total"]
    assert [f for f, _ in p.plan.nodes["windows"].schema][-1] == "emit"


@pytest.mark.fast
def test_validate_reports_every_error_of_a_file_at_once(tmp_path):
    text = """
        pipeline: many_errors
        sources:
          lines: {type: TestSource, batches: [], schema: "line string, n long"}
          other: {type: Nowhere}
        steps:
          - name: big
            from: lines
            select: [line, nope]
          - name: bigger
            from: big
            filter: "n > 3"
          - name: doubled
            from: lines
            fliter: "n > 1"
          - name: kept
            from: lines
            select: [line, n]
        sinks:
          out: {type: TestSink, from: bigger}
          kept_out: {type: TestSink, from: kept}
          d: {type: TestSink, from: doubled}
          o: {type: TestSink, from: other}
    """
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline_file(write(tmp_path, text), environ={})
    errors = caught.value.errors
    assert [(e.line, e.subject) for e in errors] == [(4, "source 'other'"), (8, "step 'big'"), (12, "step 'doubled'")]
    assert "unknown source type 'Nowhere'" in errors[0].message
    assert "unknown column 'nope'" in errors[1].message
    assert "the step does nothing (did you mean 'filter'?)" in errors[2].message
    assert str(caught.value) == "\n".join(str(e) for e in errors)
    assert caught.value.line == 4  # the first error's line, as for one error
    result = headrace("validate", "pipeline.yaml", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == "".join(f"headrace: {e}\n" for e in errors)
    report = json.loads(headrace("validate", "pipeline.yaml", "--json", cwd=tmp_path).stdout)
    assert report["valid"] is False and report["line"] == 4
    assert report["errors"] == [{"line": e.line, "error": str(e)} for e in errors]


@pytest.mark.fast
def test_declaration_errors_are_reported_with_the_others(tmp_path):
    with pytest.raises(PipelineFileError) as caught:
        load_pipeline_file(write(tmp_path, """
            pipeline: declarations
            sources:
              lines: {type: TestSource, batches: [], schema: "line string"}
              broken: 3
            steps:
              - name: bad
                from: lines
                select: [nope]
              - name: upper
                from: lines
                filter: "length(line) > 2"
              - name: upper
                from: lines
                filter: "length(line) > 3"
              - name: from_broken
                from: broken
                filter: "x > 1"
            sinks:
              out: {type: TestSink, from: upper}
              b: {type: TestSink, from: from_broken}
              c: {type: TestSink, from: bad}
            """), environ={})
    assert [(e.line, e.subject, e.message[:40]) for e in caught.value.errors] == [
        (4, "source 'broken'", "expected its settings as a mapping (type"),
        (8, "step 'bad'", "unknown column 'nope'; the stream from '"),
        (12, "step 'upper'", "the name is already used by the step at "),
    ]
