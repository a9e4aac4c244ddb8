"""Apex-style operators on Spark: windows, partitions, unifiers, application windows, groupings."""

from __future__ import annotations

from collections import Counter

import pytest
from input_files import write_in_order

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

LINES = [
    [{"line": "the quick brown fox"}, {"line": "the lazy dog"}],
    [{"line": "the fox jumps"}, {"line": "over the dog"}],
    [{"line": "quick quick fox"}],
    [{"line": "a dog"}, {"line": "the end"}],
]


class LineSplitter(hr.Operator):
    lines = hr.InputPort()
    words = hr.OutputPort("word string")

    def process(self, record):
        for word in record["line"].split():
            self.words.emit({"word": word})


class SumCounts(hr.Unifier):
    """Adds up the partitions' counts of a window (Apex's unifier of a partitioned counter)."""

    output = hr.OutputPort("word string, count long")

    def begin_window(self, window_id):
        self.window = {}

    def process(self, record):
        self.window[record["word"]] = self.window.get(record["word"], 0) + record["count"]

    def end_window(self):
        for word, count in sorted(self.window.items()):
            self.output.emit({"word": word, "count": count})


class WindowWordCount(hr.Operator):
    """Counts words per application window and emits the window's counts at its end."""

    words = hr.InputPort()
    counts = hr.OutputPort("word string, count long", unifier=SumCounts())

    def __init__(self):
        self.windows = []  # state: the ids of the application windows begun

    def begin_window(self, window_id):
        self.current = {}
        self.windows.append(window_id)

    def process(self, record):
        self.current[record["word"]] = self.current.get(record["word"], 0) + 1

    def end_window(self):
        for word, count in sorted(self.current.items()):
            self.counts.emit({"word": word, "count": count})


def word_count(name: str, partitions: int, application_window: int = 1) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    lines = p.source("lines", TestSource(LINES, schema="line string"))
    split = p.add_operator("split", LineSplitter(), partitions=partitions)
    count = p.add_operator("count", WindowWordCount(), partitions=partitions, application_window=application_window)
    p.add_stream("lines_in", lines, split.lines)
    p.add_stream("words", split.words, count.words, grouping=hr.groupings.Fields("word"))
    sink = TestSink()
    count.counts.stream(name="counts").sink("out", sink)
    return p, sink


def expected_per_window(application_window: int) -> list[Counter]:
    windows: list[Counter] = []
    for index, batch in enumerate(LINES):
        if index % application_window == 0:
            windows.append(Counter())
        for record in batch:
            windows[-1].update(record["line"].split())
    return windows


def by_batch(sink: TestSink) -> list[Counter]:
    return [Counter({r["word"]: r["count"] for r in rows}) for _, rows in sorted(sink.batches.items()) if rows]


@pytest.mark.parametrize("partitions", [1, 2])
def test_word_count_per_window_is_the_same_with_one_or_two_partitions(spark, partitions):
    pipeline, sink = word_count(f"apex_wc_{partitions}", partitions)
    run_to_completion(pipeline)
    assert by_batch(sink) == expected_per_window(1)


def test_application_window_of_three_streaming_windows(spark):
    pipeline, sink = word_count("apex_wc_app3", 2, application_window=3)
    run_to_completion(pipeline)
    assert by_batch(sink) == expected_per_window(3)


def by_batch_unique(sink: TestSink) -> list[Counter]:
    """Like ``by_batch``, checking that a window emits each word once (the unifier merged them)."""
    for rows in sink.batches.values():
        words = [r["word"] for r in rows]
        assert len(words) == len(set(words)), f"a word came out twice in one window: {sorted(words)}"
    return by_batch(sink)


def test_the_unifier_merges_the_partitions_counts_into_one_row_per_word(spark):
    pipeline, sink = word_count("apex_wc_unified", 2)
    run_to_completion(pipeline)
    assert by_batch_unique(sink) == expected_per_window(1)
    assert "count_counts_unifier" in pipeline.explain()


class Tagged(hr.Operator):
    """Emits each value with the partition that got it and the window it came in."""

    values = hr.InputPort()
    tagged = hr.OutputPort("value long, partition int, window long, committed string")

    def __init__(self):
        self.committed_windows = []

    def setup(self, context):
        self.partition = context.partition

    def begin_window(self, window_id):
        self.window = window_id

    def committed(self, window_id):
        self.committed_windows.append(window_id)

    def process(self, record):
        self.tagged.emit({"value": record["value"], "partition": self.partition, "window": self.window,
                          "committed": ",".join(map(str, self.committed_windows))})


def test_a_custom_partitioner_routes_by_a_mask_and_committed_follows_each_window(spark):
    batches = [[{"value": v} for v in range(0, 10)], [{"value": v} for v in range(10, 20)],
               [{"value": v} for v in range(20, 30)]]
    p = hr.Pipeline("apex_mask")
    values = p.source("values", TestSource(batches, schema="value long"))
    tagged = p.add_operator("tagged", Tagged(), partitions=4)
    by_mask = hr.groupings.Custom(lambda record, n: record["value"] & 0b11)
    p.add_stream("by_mask", values, tagged.values, grouping=by_mask)
    sink = TestSink()
    tagged.tagged.stream().sink("out", sink)
    run_to_completion(p)
    rows = sink.rows()
    assert sorted(r["value"] for r in rows) == list(range(30))
    assert all(r["partition"] == r["value"] & 0b11 for r in rows)
    windows = sorted({r["window"] for r in rows})
    assert len(windows) == 3
    for row in rows:  # every instance runs every window, so each was told of each earlier window
        assert row["committed"] == ",".join(str(w) for w in range(windows[0], row["window"]))


def test_sigkill_of_the_driver_then_restart_gives_the_uninterrupted_output(tmp_path):
    """Operator state (running totals) and the unifier's state (windows merged) survive a SIGKILL:
    the output equals the one computed here in plain Python."""
    import json
    from pathlib import Path

    from driver_process import KilledRun

    texts = [" ".join(f"w{(i * 7 + j * 3) % 11}" for j in range(i % 4 + 3)) for i in range(30)]
    files = [texts[k::6] for k in range(6)]  # 6 files of 5 lines: one streaming window each
    folder = tmp_path / "input"
    folder.mkdir()
    for number, lines in enumerate(files):
        text = "".join(json.dumps({"line": t}) + "\n" for t in lines)
        write_in_order(folder / f"part-{number:02d}.jsonl", text, number)
    totals: Counter = Counter()
    expected = []
    for window, lines in enumerate(files):
        words = [w for line in lines for w in line.split()]
        totals.update(words)
        expected += [(window, w, totals[w], window + 1) for w in sorted(set(words))]

    args = {"name": "apex_killed", "input": str(folder), "state_dir": str(tmp_path / "state"),
            "out": str(tmp_path / "out")}
    run = KilledRun(Path(__file__).resolve().parent / "operator_driver.py", args, tmp_path / "driver.log")
    run.kill_after(2)
    assert run.committed() < len(files), "the driver should have been killed mid-stream"
    run.restart_until("every window written", lambda: len(run.written()) >= len(expected))
    got = sorted((r["window"], r["word"], r["total"], r["merged"]) for r in run.written())
    assert got == sorted(expected)


class TwoPorts(hr.Operator):
    left = hr.InputPort()
    right = hr.InputPort()
    out = hr.OutputPort()

    def process_left(self, record):
        self.out.emit(record)


class Echo(hr.Operator):
    first = hr.InputPort()
    second = hr.InputPort(handler="process_first")
    out = hr.OutputPort()

    def process_first(self, record):
        self.out.emit(record)


class Divide(hr.Operator):
    values = hr.InputPort()
    out = hr.OutputPort("value long")

    def process(self, record):
        self.out.emit({"value": 100 // record["value"]})


def _values_pipeline(name: str, batches=([{"value": 1}],)) -> tuple[hr.Pipeline, hr.Stream]:
    p = hr.Pipeline(name)
    return p, p.source("values", TestSource(list(batches), schema="value long"))


@pytest.mark.fast
def test_building_errors_name_the_operator_and_say_what_to_do():
    p, values = _values_pipeline("apex_errors")
    with pytest.raises(hr.PlanError, match=r"step 'split'.*give an instance of the operator, e.g. LineSplitter\(\)"):
        p.add_operator("split", LineSplitter)
    with pytest.raises(hr.PlanError, match=r"step 'x'.*expected an hr.Operator \(or a Storm bolt\), got int"):
        p.add_operator("x", 3)
    with pytest.raises(hr.PlanError, match=r"TwoPorts has input port 'right' but no method process_right\(self, rec"):
        p.add_operator("two", TwoPorts())
    with pytest.raises(hr.PlanError, match=r"partitions must be a whole number of at least 1, got 0"):
        p.add_operator("split", LineSplitter(), partitions=0)
    with pytest.raises(hr.PlanError, match=r"application_window must be a whole number of at least 1, got 1.5"):
        p.add_operator("split", LineSplitter(), application_window=1.5)
    split = p.add_operator("split", LineSplitter())
    with pytest.raises(AttributeError, match=r"operator 'split' has no port 'word'; its ports: lines, words"):
        split.word  # noqa: B018
    with pytest.raises(hr.PlanError, match=r"grouping must be a headrace grouping .* got 'fields'"):
        p.add_stream("in", values, split.lines, grouping="fields")
    p.add_stream("in", values, split.lines)
    with pytest.raises(hr.PlanError, match=r"input port split.lines already takes stream 'in'; an input port takes"):
        p.add_stream("again", values, split.lines)
    with pytest.raises(hr.PlanError, match=r"stream 'nowhere'.*give at least one input port"):
        p.add_stream("nowhere", values)
    echo, divide = p.add_operator("echo", Echo()), p.add_operator("divide", Divide())
    p.add_stream("words", split.words, echo.first)
    p.add_stream("echoed", echo.out, divide.values)
    with pytest.raises(hr.PlanError, match=r"this stream would close a cycle \(echo -> divide -> echo\)"):
        p.add_stream("back", divide.out, echo.second)
    with pytest.raises(hr.PlanError, match=r"output port 'out' of operator 'echo' has no schema; declare one"):
        echo.out.stream()


@pytest.mark.fast
def test_operators_and_sinks_on_different_streams_of_the_query_are_refused():
    p = hr.Pipeline("apex_two_streams")
    values = p.source("values", TestSource([[{"value": 1}]], schema="value long"))
    other = p.source("other", TestSource([[{"value": 2}]], schema="value long"))
    divide = p.add_operator("divide", Divide())
    p.add_stream("in", values, divide.values)
    divide.out.stream().sink("out", TestSink())
    other.sink("raw", TestSink())
    with pytest.raises(hr.PlanError, match=r"step 'divide'.*operators run in each micro-batch on one stream of "
                                           r"Spark's query.*feed the operators and the other sinks from one stream"):
        p.validate()


@pytest.mark.fast
def test_a_stateful_step_after_an_operator_is_refused_with_the_reason():
    p, values = _values_pipeline("apex_after")
    divide = p.add_operator("divide", Divide())
    p.add_stream("in", values, divide.values)
    divide.out.stream(name="quotients").key_by("value").aggregate(n=hr.count(), name="totals").sink("out", TestSink())
    with pytest.raises(hr.PlanError, match=r"step 'totals'.*reads the output of operator 'divide'.*operators run in "
                                           r"each micro-batch after Spark's streaming query"):
        p.validate()


def test_a_handler_that_raises_stops_the_pipeline_naming_operator_partition_window_and_record(spark):
    p, values = _values_pipeline("apex_raises", [[{"value": 5}], [{"value": 0}]])
    divide = p.add_operator("divide", Divide(), partitions=2)
    p.add_stream("in", values, divide.values)
    divide.out.stream().sink("out", TestSink())
    with pytest.raises(hr.StepFunctionError, match=r"operator 'divide' \(Divide.process at test_operator_api.py:\d+\), "
                                                   r"partition \d, window \d+: process raised ZeroDivisionError: "
                                                   r"integer division or modulo by zero on record \{'value': 0\}"):
        run_to_completion(p)


def test_a_record_that_does_not_fit_its_ports_schema_is_named(spark):
    class Wrong(hr.Operator):
        values = hr.InputPort()
        out = hr.OutputPort("value long")

        def process(self, record):
            self.out.emit({"value": "not a number"})

    p, values = _values_pipeline("apex_wrong_shape")
    wrong = p.add_operator("wrong", Wrong())
    p.add_stream("in", values, wrong.values)
    wrong.out.stream().sink("out", TestSink())
    with pytest.raises(hr.StepFunctionError, match=r"output port 'wrong_out': a record does not fit the port's "
                                                   r"schema \(value long\)"):
        run_to_completion(p)


class Totals(hr.Operator):
    """Running totals per word, emitted for the words of each window (state across windows)."""

    words = hr.InputPort()
    totals = hr.OutputPort("window long, word string, total long")

    def __init__(self):
        self.counts = {}

    def begin_window(self, window_id):
        self.window, self.seen = window_id, set()

    def process(self, record):
        self.counts[record["word"]] = self.counts.get(record["word"], 0) + 1
        self.seen.add(record["word"])

    def end_window(self):
        for word in sorted(self.seen):
            self.totals.emit({"window": self.window, "word": word, "total": self.counts[word]})


def totals_pipeline(name: str, locality: str | None) -> tuple[hr.Pipeline, TestSink]:
    p = hr.Pipeline(name)
    lines = p.source("lines", TestSource(LINES, schema="line string"))
    split = p.add_operator("split", LineSplitter(), partitions=2)
    count = p.add_operator("count", Totals(), partitions=2)
    p.add_stream("lines_in", lines, split.lines, grouping=hr.groupings.Fields("line"))
    if locality:
        p.add_stream("words", split.words, count.words, locality=locality)
    else:  # the same routing, instance i to instance i, in stages of their own
        p.add_stream("words", split.words, count.words, grouping="local_or_shuffle")
    sink = TestSink()
    count.totals.stream(name="totals").sink("out", sink)
    return p, sink


def test_a_thread_local_stream_runs_both_operators_in_one_stage_with_the_same_output(spark):
    fused, fused_sink = totals_pipeline("apex_thread_local", "thread_local")
    assert "fused into the Python stage of operator 'split' (thread-local)" in fused.explain()
    run_to_completion(fused)
    plain, plain_sink = totals_pipeline("apex_not_fused", None)
    run_to_completion(plain)
    key = sorted((r["window"], r["word"], r["total"]) for r in fused_sink.rows())
    assert key == sorted((r["window"], r["word"], r["total"]) for r in plain_sink.rows())
    windows = sorted({r["window"] for r in fused_sink.rows()})
    assert len(windows) == len(LINES)  # state carried from window to window inside the fused stage


@pytest.mark.fast
def test_thread_local_errors_say_what_is_needed():
    p, values = _values_pipeline("apex_local_errors")
    one, two = p.add_operator("one", Echo()), p.add_operator("two", Divide(), partitions=2)
    p.add_stream("in", values, one.first)
    with pytest.raises(hr.PlanError, match=r"a thread-local stream joins operators with the same partitions; "
                                           r"'one' has 1, 'two' has 2"):
        p.add_stream("local", one.out, two.values, locality="thread_local")
    with pytest.raises(hr.PlanError, match=r"a thread-local stream takes no grouping"):
        p.add_stream("local", one.out, two.values, locality="thread_local", grouping="all")
    with pytest.raises(hr.PlanError, match=r"locality must be None or 'thread_local', got 'container_local'"):
        p.add_stream("local", one.out, two.values, locality="container_local")
    three = p.add_operator("three", Divide())
    with pytest.raises(hr.PlanError, match=r"a thread-local stream goes from an operator's output port"):
        p.add_stream("local", values, three.values, locality="thread_local")
    p.add_stream("local", one.out, three.values, locality="thread_local")
