"""Storm-style topologies on the operator runtime: the examples' exact output, groupings, tick
tuples, windowed bolts, spouts (ack, fail, replay after SIGKILL) and every user error's message."""

from __future__ import annotations

import pickle
import runpy
from collections import Counter
from pathlib import Path

import cloudpickle
import pytest
from hypothesis import given
from hypothesis import strategies as st

import headrace as hr
from headrace.code_locations import remember_definitions
from headrace.engine.instances import Route, WindowSpec, run_window
from headrace.engine.tuple_windows import LATE, WindowBuffer, WindowConfig
from headrace.errors import PlanError, SourceError, StepFunctionError
from headrace.groupings import stable_hash
from headrace.plan.nodes import OperatorNode
from headrace.testing import TestSink, TestSource, run_to_completion

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "topologies.md").read_text()


def run_example(name: str, capsys) -> tuple[list[str], dict]:
    """Run ``examples/<name>.py`` as a script: the lines it prints and its namespace."""
    namespace = runpy.run_path(str(ROOT / "examples" / f"{name}.py"), run_name="__main__")
    return capsys.readouterr().out.splitlines(), namespace


def shown_in_docs(name: str) -> list[str]:
    """The output docs/topologies.md shows under ``python examples/<name>.py``."""
    after = DOC.split(f"python examples/{name}.py\n```\n```\n", 1)[1]
    return after.split("```", 1)[0].rstrip("\n").splitlines()


# ---------------------------------------------------------------------------------------------
# The examples, run as scripts: their exact output, the same as the docs show

def test_exclamation_topology(spark, capsys):
    printed, _ = run_example("storm_exclamation", capsys)
    expected = [f"{w}!!!!!! x2" for w in sorted(["nathan", "mike", "jackson", "golda", "bertels"])]
    assert printed == expected == shown_in_docs("storm_exclamation")


def test_word_count_a_words_task_never_changes_and_its_counts_increase(spark, capsys):
    printed, namespace = run_example("storm_word_count", capsys)
    rows = namespace["out"]["counts"]
    words = [w for s in namespace["SENTENCES"] for w in s.split()]
    by_word: dict[str, list[tuple[int, int]]] = {}
    for row in rows:
        by_word.setdefault(row["word"], []).append((row["count"], row["task"]))
    assert {w: len(seen) for w, seen in by_word.items()} == Counter(words)
    for word, seen in by_word.items():
        assert [count for count, _ in seen] == list(range(1, len(seen) + 1)), word  # strictly increasing
        assert {task for _, task in seen} == {stable_hash([word]) % 2}, word  # one task, by the stable hash
    expected = [f"{w}: {n} (task {stable_hash([w]) % 2})" for w, n in sorted(Counter(words).items()) if n > 1]
    assert printed == expected == shown_in_docs("storm_word_count")
    assert printed == ["and: 2 (task 0)", "seven: 2 (task 0)", "the: 4 (task 1)"]


def test_sliding_count_window_of_30_every_10(spark, capsys):
    printed, _ = run_example("storm_sliding_window", capsys)
    sums = [55, 210, 465, 765, 1065, 1365]
    expected = [f"sum {s} of {min(30, 10 * (i + 1))} tuples (10 new, {0 if i < 3 else 10} expired)"
                for i, s in enumerate(sums)]
    assert printed == expected == shown_in_docs("storm_sliding_window")


def test_event_time_window_with_a_late_tuple(spark, capsys):
    printed, _ = run_example("storm_event_time_window", capsys)
    assert printed == shown_in_docs("storm_event_time_window") == [
        "[5s, 15s): 1 2 -> 3",
        "[10s, 20s): 1 2 3 6 -> 12",
        "[15s, 25s): 3 4 6 -> 13",
        "[20s, 30s): 4 -> 4",
        "[25s, 35s): 7 -> 7",
        "[30s, 40s): 7 -> 7",
        "late: value 5 at 13s",
    ]


def test_rolling_top_words_ranks_every_three_seconds_of_the_test_clock(spark, capsys):
    printed, _ = run_example("storm_rolling_top_words", capsys)
    assert printed == shown_in_docs("storm_rolling_top_words") == [
        " 3s: storm 2, flink 1, spark 1",
        " 6s: spark 3, storm 2, apex 1",
        " 9s: spark 3, storm 3, apex 1",
        "12s: spark 2, apex 1, heron 1",
        "15s: heron 1, storm 1",
    ]


def test_fluent_stream_apex_operators_and_a_bolt_in_one_pipeline(spark, capsys):
    printed, namespace = run_example("storm_mixed", capsys)
    assert printed == shown_in_docs("storm_mixed") == ["to x3", "be x3", "the x3"]
    kinds = {n.name: (n.kind, getattr(n, "api", None)) for n in namespace["pipeline"].plan.nodes.values()}
    assert kinds["split"][0] == "python" and kinds["normalise"] == ("operator", "apex")
    assert kinds["count"] == ("operator", "storm") and kinds["milestones"] == ("operator", "apex")


# ---------------------------------------------------------------------------------------------
# Groupings, in one topology

class Numbers(hr.Spout):
    declare_output_fields = "value long, key string"
    bounded = True

    def __init__(self) -> None:
        self.value = 0

    def next_tuple(self) -> None:
        if self.value < 24:
            self.emit([self.value, f"k{self.value % 4}"])
            self.value += 1


class Router(hr.Bolt):
    """Passes each number on, and sends it directly to task ``value % 3`` on the stream ``direct``."""

    def declare_output_fields(self, declarer):
        declarer.declare("value long, key string")
        declarer.declare_stream("direct", "value long, key string", direct=True)

    def process(self, tuple):
        self.emit(tuple.values, anchors=tuple)
        self.emit_direct(tuple.get_integer("value") % 3, tuple.values, anchors=tuple, stream="direct")


class Where(hr.Bolt):
    """Says which task got each value, and from which task."""

    declare_output_fields = "value long, key string, task int, from_task int"

    def prepare(self, context):
        self.task = context.task_index

    def process(self, tuple):
        self.emit([tuple["value"], tuple["key"], self.task, tuple.source_task], anchors=tuple)


def test_every_grouping_routes_as_storm_does(spark):
    builder = hr.TopologyBuilder("storm_groupings")
    builder.set_spout("numbers", Numbers(), max_tuples_per_batch=10)
    builder.set_bolt("router", Router(), parallelism=2).shuffle_grouping("numbers")
    builder.set_bolt("direct", Where(), 3).direct_grouping("router", stream="direct")
    builder.set_bolt("all", Where(), 2).all_grouping("router")
    builder.set_bolt("global", Where(), 2).global_grouping("router")
    builder.set_bolt("local", Where(), 2).local_or_shuffle_grouping("router")
    builder.set_bolt("partial", Where(), 3).partial_key_grouping("router", "key")
    builder.set_bolt("custom", Where(), 3).custom_grouping("router", lambda t, tasks: t["value"] % tasks)
    builder.set_bolt("fields", Where(), 3).fields_grouping("router", ["key"])
    for name in ("direct", "all", "global", "local", "partial", "custom", "fields"):
        builder.stream(name).sink(f"{name}_out", TestSink())
    out = run_to_completion(builder.create_topology())
    values = set(range(24))
    assert {r["value"] for r in out["direct_out"]} == values
    assert all(r["task"] == r["value"] % 3 for r in out["direct_out"])
    assert Counter(r["value"] for r in out["all_out"]) == Counter({v: 2 for v in values})
    assert {r["task"] for r in out["all_out"] if r["value"] == 5} == {0, 1}
    assert {r["task"] for r in out["global_out"]} == {0} and len(out["global_out"]) == 24
    assert all(r["task"] == r["from_task"] for r in out["local_out"]) and len(out["local_out"]) == 24
    assert {r["from_task"] for r in out["local_out"]} == {0, 1}
    tasks_of_key: dict[str, set[int]] = {}
    for r in out["partial_out"]:
        tasks_of_key.setdefault(r["key"], set()).add(r["task"])
    assert all(1 <= len(t) <= 2 for t in tasks_of_key.values()) and len(out["partial_out"]) == 24
    assert all(r["task"] == r["value"] % 3 for r in out["custom_out"]) and len(out["custom_out"]) == 24
    assert all(r["task"] == stable_hash([r["key"]]) % 3 for r in out["fields_out"])
    assert sorted(r["value"] for r in out["fields_out"]) == sorted(values)


# ---------------------------------------------------------------------------------------------
# Spouts: fail and retry, errors, restart after SIGKILL

class RetryingSpout(hr.Spout):
    """Emits each sentence with its attempt number; emits a failed one again (Storm's reliable spout)."""

    declare_output_fields = "sentence string, attempt int"
    bounded = True

    def __init__(self, sentences: list[str]) -> None:
        self.todo = [(s, 1) for s in sentences]
        self.pending: dict[int, tuple[str, int]] = {}
        self.next_id = 0

    def next_tuple(self):
        if self.todo:
            sentence, attempt = self.todo.pop(0)
            self.pending[self.next_id] = (sentence, attempt)
            self.emit([sentence, attempt], msg_id=self.next_id)
            self.next_id += 1

    def ack(self, msg_id):
        del self.pending[msg_id]

    def fail(self, msg_id):
        sentence, attempt = self.pending.pop(msg_id)
        self.todo.append((sentence, attempt + 1))

    def finished(self):
        return not self.pending  # the input ends once every sentence was acknowledged


class Picky(hr.Bolt):
    """Fails the word "bad" on its sentence's first attempt; passes the other words on."""

    declare_output_fields = "word string, sentence string, attempt int"

    def process(self, tuple):
        if tuple["word"] == "bad" and tuple["attempt"] == 1:
            self.fail(tuple)
            return
        self.emit(tuple.values, anchors=tuple)
        self.ack(tuple)


class Words(hr.Bolt):
    declare_output_fields = "word string, sentence string, attempt int"

    def process(self, tuple):
        for word in tuple["sentence"].split():
            self.emit([word, tuple["sentence"], tuple["attempt"]], anchors=tuple)


def test_a_tuple_a_bolt_fails_is_failed_at_its_spout_which_emits_it_again(spark):
    sentences = ["a good one", "a bad one", "another good one"]
    builder = hr.TopologyBuilder("storm_fail_retry")
    builder.set_spout("sentences", RetryingSpout(sentences), max_tuples_per_batch=2)
    builder.set_bolt("words", Words(), 2).shuffle_grouping("sentences")
    builder.set_bolt("picky", Picky(), 2).shuffle_grouping("words")  # fails a word of "a bad one": anchored
    builder.stream("picky").sink("out", TestSink())
    rows = run_to_completion(builder.create_topology())["out"]
    attempts = Counter((r["sentence"], r["attempt"]) for r in rows)
    assert attempts == Counter({("a good one", 1): 3, ("another good one", 1): 3, ("a bad one", 2): 3,
                                ("a bad one", 1): 2})  # attempt 1: "bad" failed, "a" and "one" passed


class BadValues(hr.Spout):
    declare_output_fields = "count long"
    bounded = True

    def next_tuple(self):
        self.emit(["three"])


class Passing(hr.Bolt):
    declare_output_fields = "count long"

    def process(self, tuple):
        self.emit(tuple.values)


def test_a_spout_value_that_does_not_fit_its_declared_type_fails_naming_it(spark):
    builder = hr.TopologyBuilder("storm_bad_spout")
    builder.set_spout("counts", BadValues())
    builder.set_bolt("pass", Passing()).shuffle_grouping("counts")
    builder.stream("pass").sink("out", TestSink())
    with pytest.raises(SourceError) as caught:
        run_to_completion(builder.create_topology())
    message = str(caught.value)
    assert "spout 'counts' (BadValues.next_tuple at test_topology.py:" in message
    assert "emitted ['three'], which does not fit its fields (`count` long)" in message


class Undeclared(hr.Bolt):
    declare_output_fields = "word string"

    def process(self, tuple):
        self.emit([tuple["word"]], stream="words")


def test_a_bolt_emitting_on_an_undeclared_stream_fails_naming_the_bolt_and_line(spark):
    builder = hr.TopologyBuilder("storm_bad_emit")
    builder.set_spout("words", TestSource([[{"word": "a"}]], schema="word string"))
    builder.set_bolt("shout", Undeclared()).shuffle_grouping("words")
    builder.stream("shout").sink("out", TestSink())
    with pytest.raises(StepFunctionError) as caught:
        run_to_completion(builder.create_topology())
    assert ("bolt 'shout' (test_topology.py:" in str(caught.value)
            and "emit on stream 'words', which the bolt does not declare (declared: default); declare it in "
                "declare_output_fields" in str(caught.value))


def test_sigkill_of_the_driver_then_restart_gives_the_uninterrupted_output(tmp_path):
    """The spool (tuples handed to Spark), the bolts' state and the sink survive a SIGKILL: the
    word counts equal those computed here, each count once; every tuple is acknowledged."""
    from driver_process import KilledRun
    from topology_driver import SENTENCES

    totals: Counter = Counter()
    expected = []
    for sentence in SENTENCES:
        for word in sentence.split():
            totals[word] += 1
            expected.append((word, totals[word], stable_hash([word]) % 2))
    out, acks = tmp_path / "out", tmp_path / "acks"
    args = {"name": "storm_killed", "state_dir": str(tmp_path / "state"), "out": str(out), "acks": str(acks)}
    run = KilledRun(ROOT / "tests" / "topology_driver.py", args, tmp_path / "driver.log")
    run.kill_after(2)
    assert run.committed() < len(SENTENCES) // 4, "the driver should have been killed mid-stream"
    run.restart_until("every count written and every tuple acknowledged",
                      lambda: len(run.written()) >= len(expected) and acks.exists()
                      and {int(a) for a in acks.read_text().split()} >= set(range(40)))
    got = sorted((r["word"], r["count"], r["task"]) for r in run.written())
    assert got == sorted(expected)


# ---------------------------------------------------------------------------------------------
# The plan: bolts are operators, subscriptions are edges

class Exclaim(hr.Bolt):
    declare_output_fields = "word string"

    def process(self, tuple):
        self.emit([tuple["word"] + "!"], anchors=tuple)


class Untyped(hr.Bolt):
    declare_output_fields = ("word",)

    def process(self, tuple):
        self.emit([tuple["word"]])


def words_builder(name: str = "storm_plan") -> hr.TopologyBuilder:
    builder = hr.TopologyBuilder(name)
    builder.set_spout("word", TestSource([[{"word": "a"}]], schema="word string"))
    return builder


@pytest.mark.fast
def test_a_bolt_is_an_operator_node_and_each_subscription_an_edge():
    builder = words_builder()
    builder.set_bolt("e1", Exclaim(), 3).shuffle_grouping("word")
    builder.set_bolt("e2", Exclaim(), 2).fields_grouping("e1", "word").all_grouping("word")
    builder.stream("e2").sink("out", TestSink())
    plan = builder.create_topology().plan
    e2 = plan.nodes["e2"]
    assert isinstance(e2, OperatorNode) and e2.api == "storm" and e2.partitions == 2
    assert [(e.source, e.port, e.target_port, e.grouping.describe()) for e in e2.edges] == [
        ("e1", "default", "e1.default", "fields(word)"), ("word", None, "word.default", "all")]
    assert e2.output_ports == (("default", (("word", "string"),)),)
    assert "operator Exclaim x2 (e1.default <- e1.default fields(word); word.default <- word all)" in \
        builder.pipeline.explain()


def error_of(build) -> str:
    with pytest.raises(PlanError) as caught:
        build()
    return str(caught.value)


class NoProcess(hr.Bolt):
    declare_output_fields = "word string"


class Sum(hr.BaseWindowedBolt):
    declare_output_fields = "total long"

    def execute(self, window):
        self.emit([sum(t["value"] for t in window.get())])


class NoExecute(hr.BaseWindowedBolt):
    declare_output_fields = "total long"


class Ticking(Sum):
    tick_every = "1s"


class Directed(hr.Bolt):
    def declare_output_fields(self, declarer):
        declarer.declare_stream("direct", "word string", direct=True)

    def process(self, tuple):
        pass


@pytest.mark.fast
def test_errors_in_components_and_parallelism_name_the_step_and_the_value():
    builder = words_builder("storm_errors_a")
    assert "unknown component 'splt'; declared so far: word, x (declare a component with set_spout or set_bolt " \
           "before subscribing to it)" in error_of(lambda: builder.set_bolt("x", Exclaim()).shuffle_grouping("splt"))
    assert "set_bolt('p') (test_topology.py:" in error_of(lambda: builder.set_bolt("p", Exclaim(), 0))
    assert "parallelism must be a whole number of tasks, at least 1, got 0" in \
        error_of(lambda: builder.set_bolt("p", Exclaim(), 0))
    assert "got '2'" in error_of(lambda: builder.set_bolt("p", Exclaim(), "2"))
    assert "got True" in error_of(lambda: builder.set_bolt("p", Exclaim(), True))
    assert "give an instance of the bolt, e.g. Exclaim(), not the class" in \
        error_of(lambda: builder.set_bolt("p", Exclaim))
    assert "expected an hr.Bolt, got Unifier; add Apex operators with pipeline.add_operator" in \
        error_of(lambda: builder.set_bolt("p", hr.Unifier()))
    assert "NoProcess has no process(self, tuple) method" in error_of(lambda: builder.set_bolt("p", NoProcess()))
    assert "NoExecute has no execute(self, window) method" in \
        error_of(lambda: builder.set_bolt("p", NoExecute().with_window(3)))
    assert "Sum has no window: call with_window(length, sliding_interval) on it" in \
        error_of(lambda: builder.set_bolt("p", Sum()))
    assert "a windowed bolt is driven by its window; tick_every is for other bolts" in \
        error_of(lambda: builder.set_bolt("p", Ticking().with_window(3)))
    assert "component id 'a.b' must not contain '.'" in error_of(lambda: builder.set_bolt("a.b", Exclaim()))
    assert "component id '__system' must be a non-empty string" in \
        error_of(lambda: builder.set_bolt("__system", Exclaim()))
    assert "the name is already used by the source step" in error_of(lambda: builder.set_bolt("word", Exclaim()))


@pytest.mark.fast
def test_errors_in_subscriptions_name_the_stream_and_what_it_declares():
    builder = words_builder("storm_errors_b")
    builder.set_bolt("e", Exclaim()).shuffle_grouping("word")
    builder.set_bolt("d", Directed()).shuffle_grouping("word")
    declarer = builder.set_bolt("x", Exclaim())
    assert "bolt 'x': fields_grouping('e', stream='default') (test_topology.py:" in \
        error_of(lambda: declarer.fields_grouping("e", "wrd"))
    assert "stream 'default' of 'e' has no field(s) wrd; its fields: word string" in \
        error_of(lambda: declarer.fields_grouping("e", "wrd"))
    assert "stream 'default' of 'word' has no field(s) key; its fields: word string" in \
        error_of(lambda: declarer.partial_key_grouping("word", ["key"]))
    assert "'e' has no stream 'words'; its streams: default" in \
        error_of(lambda: declarer.shuffle_grouping("e", stream="words"))
    assert "stream 'default' of 'e' is not declared direct; a direct grouping needs a stream its bolt declares " \
           "with direct=True" in error_of(lambda: declarer.direct_grouping("e"))
    assert "stream 'direct' of 'd' is declared direct; subscribe to it with direct_grouping" in \
        error_of(lambda: declarer.shuffle_grouping("d", stream="direct"))
    declarer.shuffle_grouping("e")
    assert "bolt 'x' already subscribes to stream 'default' of 'e'; a bolt takes each stream once" in \
        error_of(lambda: declarer.all_grouping("e"))
    assert "a bolt cannot subscribe to its own stream" in error_of(lambda: declarer.shuffle_grouping("x"))
    assert "fields must be a field name or a list of them, e.g. ['word'], got []" in \
        error_of(lambda: declarer.fields_grouping("word", []))
    assert "custom_grouping (test_topology.py:" in error_of(lambda: declarer.custom_grouping("word", 3))
    assert "expected a function (tuple, tasks) -> task index" in error_of(lambda: declarer.custom_grouping("word", 3))


@pytest.mark.fast
def test_errors_in_streams_out_of_a_topology():
    builder = words_builder("storm_errors_c")
    builder.set_bolt("u", Untyped()).shuffle_grouping("word")
    builder.set_bolt("d", Directed()).shuffle_grouping("word")
    assert "stream 'default' of bolt 'u' declares fields (word) without types; declare them with types, e.g. " \
           "declare_output_fields = 'word string, count long'" in error_of(lambda: builder.stream("u"))
    assert "stream 'direct' of 'd' is direct (its emitter names the task of each tuple); read it through a bolt " \
           "with direct_grouping" in error_of(lambda: builder.stream("d", "direct"))
    assert "'u' has no stream 'counts'; its streams: default" in error_of(lambda: builder.stream("u", "counts"))
    assert "unknown component 'nothing'" in error_of(lambda: builder.stream("nothing"))
    assert "'word' is a source, not a bolt" in error_of(lambda: builder.port("word"))


class TwoStreams(hr.Spout):
    declare_output_fields = {"a": "x long", "b": "y long"}

    def next_tuple(self):
        pass


class UntypedSpout(hr.Spout):
    declare_output_fields = ("word",)

    def next_tuple(self):
        pass


class TypedSpout(hr.Spout):
    declare_output_fields = "word string"

    def next_tuple(self):
        pass


class OddlyBounded(TypedSpout):
    bounded = "yes"


@pytest.mark.fast
def test_errors_in_spouts():
    builder = hr.TopologyBuilder("storm_errors_d")
    assert "a spout declares exactly one stream (declare_output_fields = 'word string'), got 2: a, b" in \
        error_of(lambda: builder.set_spout("s", TwoStreams()))
    assert "a spout's fields need types, e.g. declare_output_fields = 'word string': they are the columns of its " \
           "micro-batches (got word)" in error_of(lambda: builder.set_spout("s", UntypedSpout()))
    assert "give an instance of the spout, e.g. TypedSpout(), not the class" in \
        error_of(lambda: builder.set_spout("s", TypedSpout))
    assert "parallelism 2 applies to an hr.Spout; a source connector's parallelism is its own partitions" in \
        error_of(lambda: builder.set_spout("s", TestSource([[]], schema="word string"), 2))
    assert "expected an hr.Spout, a headrace source connector or a stream, got list" in \
        error_of(lambda: builder.set_spout("s", []))
    assert "max_tuples_per_batch must be a whole number, at least 1, got 0" in \
        error_of(lambda: builder.set_spout("s", TypedSpout(), max_tuples_per_batch=0))
    assert "OddlyBounded.bounded must be True or False, got 'yes'" in \
        error_of(lambda: builder.set_spout("s", OddlyBounded()))
    other = hr.Pipeline("elsewhere")
    stream = other.source("w", TestSource([[]], schema="word string"))
    assert "the stream belongs to pipeline 'elsewhere', not to 'storm_errors_d'" in \
        error_of(lambda: builder.set_spout("s", stream))


@pytest.mark.fast
def test_errors_in_declared_fields_and_windows():
    class Mixed(Exclaim):
        declare_output_fields = "word string, count"

    class Reserved(Exclaim):
        declare_output_fields = ("_hr_seq",)

    class Twice(Exclaim):
        declare_output_fields = ("word", "word")

    class BadStream(Exclaim):
        declare_output_fields = {"__tick": ("word",)}

    class BadTick(Exclaim):
        tick_every = "soon"

    class NoTick(Exclaim):
        tick_every = "0s"

    builder = words_builder("storm_errors_e")
    assert "give every field a type or none: 'word string, count' mixes them" in \
        error_of(lambda: builder.set_bolt("b", Mixed()))
    assert "field names starting with '_hr_' are headrace's own" in error_of(lambda: builder.set_bolt("b", Reserved()))
    assert "a field name appears twice in ['word', 'word']" in error_of(lambda: builder.set_bolt("b", Twice()))
    assert "stream id '__tick' must be an identifier (letters, digits and _) not starting with '__'" in \
        error_of(lambda: builder.set_bolt("b", BadStream()))
    assert "BadTick.tick_every: cannot read 'soon' as a duration" in error_of(lambda: builder.set_bolt("b", BadTick()))
    assert "NoTick.tick_every must be a positive duration such as '10s', got '0s'" in \
        error_of(lambda: builder.set_bolt("b", NoTick()))
    assert "Sum.with_window (test_topology.py:" in error_of(lambda: Sum().with_window(0))
    assert "the window length must be at least 1 tuple, got 0" in error_of(lambda: Sum().with_window(0))
    assert "the length (30) and the sliding interval ('10s') must both be counts of tuples or both durations" in \
        error_of(lambda: Sum().with_window(30, "10s"))
    assert "the sliding interval must be a positive duration, got '0s'" in \
        error_of(lambda: Sum().with_window("10s", "0s"))
    assert "event-time windows are durations; give with_window a duration such as '10s'" in \
        error_of(lambda: Sum().with_window(30).with_timestamp_field("ts"))
    assert "call with_window(...) first" in error_of(lambda: Sum().with_timestamp_field("ts"))
    assert "the lag must not be negative, got -1" in error_of(lambda: Sum().with_window("10s").with_lag(-1))
    assert "stream id 'late tuples' must be an identifier" in \
        error_of(lambda: Sum().with_window("10s").with_late_tuple_stream("late tuples"))


# ---------------------------------------------------------------------------------------------
# The engine without Spark: what a task does in one window, and the errors raised inside it

def run_bolt(bolt: hr.Bolt, tuples: list, *, routes=None, window: int = 0, now: int = 0, state: bytes | None = None,
             partitions: int = 1, ended: bool = False) -> tuple[list, bytes]:
    """Run task 0 of ``bolt`` over ``tuples`` from component 'src'; its emitted tuples by stream
    (routes: stream -> receiving tasks) and its state."""
    routes = routes or {"default": 2}
    edges = {stream: index for index, stream in enumerate(routes)}
    remember_definitions(bolt)  # as the plan does, for its errors to name this file once pickled by value
    spec = WindowSpec("bolt", cloudpickle.dumps(bolt), partitions, {100: "src.default"},
                      {stream: (Route(edges[stream], hr.groupings.Shuffle(), n),) for stream, n in routes.items()},
                      1, window, now, {0: state} if state is not None else {})
    rows = [(100, cloudpickle.dumps(t), False) for t in tuples] + ([(100, None, True)] if ended else [])
    emitted = run_window(spec, 0, rows)
    by_edge = {index: stream for stream, index in edges.items()}
    out = [(by_edge[e], target, pickle.loads(p)) for e, target, _, p, flush in emitted if e >= 0 and not flush]
    return out, next(p for e, _, _, p, _ in emitted if e == -3)


class Emits(hr.Bolt):
    def declare_output_fields(self, declarer):
        declarer.declare("word string")
        declarer.declare_stream("direct", "word string", direct=True)

    def __init__(self, how):
        self.how = how

    def process(self, tuple):
        self.how(self, tuple)


@pytest.mark.parametrize(("how", "message"), [
    (lambda b, t: b.emit(["a"], stream="words"),
     "emit on stream 'words', which the bolt does not declare (declared: default, direct); declare it in "
     "declare_output_fields"),
    (lambda b, t: b.emit_direct(1, ["a"]),
     "emit_direct on stream 'default', which is not declared direct; declare it with "
     "declarer.declare_stream('default', fields, direct=True)"),
    (lambda b, t: b.emit(["a"], stream="direct"),
     "stream 'direct' is declared direct: emit on it with emit_direct(task, values)"),
    (lambda b, t: b.emit(["a", 1]),
     "emitted 2 value(s) ['a', 1] on stream 'default', which declares 1 field(s) (word string)"),
    (lambda b, t: b.emit({"wrd": "a"}),
     "emitted {'wrd': 'a'} on stream 'default', whose fields are (word string)"),
    (lambda b, t: b.emit("a"), "emit takes a list of values (or a dict by field name), got 'a'"),
    (lambda b, t: b.emit(["a"], anchors=["not a tuple"]), "anchors must be tuples the bolt received"),
    (lambda b, t: b.emit_direct(7, ["a"], stream="direct"),
     "emit_direct to task 7: the receiving bolt has tasks 0 to 1"),
    (lambda b, t: b.fail("x"), "fail takes a tuple the bolt received, got 'x'"),
])
@pytest.mark.fast
def test_emit_errors_name_the_bolt_task_window_and_line(how, message):
    bolt = Emits(how)
    with pytest.raises(StepFunctionError) as caught:
        run_bolt(bolt, [{"word": "x"}], routes={"default": 2, "direct": 2}, window=4)
    assert str(caught.value).startswith("bolt 'bolt' (test_topology.py:")
    assert "task 0, window 4: " + message in str(caught.value)


@pytest.mark.fast
def test_an_exception_in_process_names_the_bolt_method_and_tuple():
    def boom(bolt, tuple):
        raise KeyError("wrd")
    with pytest.raises(StepFunctionError) as caught:
        run_bolt(Emits(boom), [{"word": "x"}])
    assert "bolt 'bolt' (Emits.process at test_topology.py:" in str(caught.value)
    assert "task 0, window 0: process raised KeyError: 'wrd' on Tuple(word='x'; from src:default task 0)" in \
        str(caught.value)


@pytest.mark.fast
def test_a_missing_timestamp_field_names_the_tuple_and_the_field():
    bolt = Sum().with_window("10s").with_timestamp_field("ts")
    with pytest.raises(StepFunctionError) as caught:
        run_bolt(bolt, [{"value": 1}])
    assert "has no timestamp field 'ts'; the window's with_timestamp_field names a field of every tuple" in \
        str(caught.value)


class Ticks(hr.Bolt):
    declare_output_fields = "time long"
    tick_every = "10s"

    def process(self, tuple):
        if tuple.is_tick():
            self.emit([tuple["time_ms"]])


@pytest.mark.fast
def test_a_tick_tuple_comes_when_the_processing_time_crosses_a_multiple_of_the_period():
    out, state = run_bolt(Ticks(), [], now=5_000)
    assert out == []  # the first window only notes the time
    out, state = run_bolt(Ticks(), [], now=9_999, state=state, window=1)
    assert out == []
    out, state = run_bolt(Ticks(), [], now=10_000, state=state, window=2)
    assert [t.values for _, _, t in out] == [(10_000,)]
    out, state = run_bolt(Ticks(), [], now=45_000, state=state, window=3)  # three multiples crossed: one tick
    assert [t.values for _, _, t in out] == [(40_000,)]


@pytest.mark.fast
def test_a_windowed_bolts_buffer_is_its_state_across_windows():
    bolt = Sum().with_window(4, 2)
    out, state = run_bolt(bolt, [{"value": v} for v in (1, 2, 3)])
    assert [t["total"] for _, _, t in out] == [3]
    out, state = run_bolt(bolt, [{"value": v} for v in (4, 5)], state=state, window=1)
    assert [t["total"] for _, _, t in out] == [10]  # 1 + 2 + 3 + 4: the window spans two micro-batches


@pytest.mark.fast
def test_tuples_helpers_and_their_errors():
    t = hr.Tuple(["storm", 3, 2.5, True, b"x"], ("word", "count", "ratio", "ok", "raw"), source_component="split")
    assert (t.get_string("word"), t.get_integer(1), t.get_long("count"), t.get_double("count"),
            t.get_boolean("ok"), t.get_binary("raw")) == ("storm", 3, 3, 3.0, True, b"x")
    assert t.select(["count", "word"]) == [3, "storm"] and t.get("missing", 0) == 0 and "ratio" in t
    assert t.as_dict()["ratio"] == 2.5 and len(t) == 5 and not t.is_tick()
    with pytest.raises(TypeError, match=r"field 'word' of the tuple from split:default is 'storm' \(str\), not an "
                                        r"integer"):
        t.get_integer("word")
    with pytest.raises(TypeError, match="is True .bool., not an integer"):
        t.get_integer("ok")
    with pytest.raises(KeyError, match="the tuple from split:default has no field 'wrd'; its fields: word, count"):
        t["wrd"]


# ---------------------------------------------------------------------------------------------
# Window activations, against a plain model

@pytest.mark.fast
@given(st.integers(1, 12), st.integers(1, 12), st.integers(0, 60))
def test_count_windows_hold_the_last_length_tuples_every_interval(length, interval, n):
    buffer = WindowBuffer(WindowConfig(length, True, interval, True))
    seen = []
    for value in range(1, n + 1):
        for activation in buffer.add(value, now=0):
            seen.append((activation.tuples, activation.new))
    expected = []
    previous: list[int] = []
    for end in range(interval, n + 1, interval):
        window = list(range(max(1, end - length + 1), end + 1))
        expected.append((window, [v for v in window if v not in previous]))
        previous = window
    assert seen == expected


@pytest.mark.fast
@given(st.lists(st.integers(0, 40_000), min_size=1, max_size=30), st.integers(1, 4), st.integers(1, 4))
def test_event_time_windows_hold_the_tuples_of_start_to_end_once_the_watermark_passes(times, slots, step):
    every = 1_000 * step
    length = every * slots
    buffer = WindowBuffer(WindowConfig(length, False, every, False, "ts", 0))
    fired = []
    for moment in times:  # one tuple per micro-batch: the watermark moves after each
        late = buffer.add(moment, now=0, time=moment, stream="s") is LATE
        assert late == (buffer.watermark is not None and moment < buffer.watermark)
        fired += [(a.start, a.end, sorted(a.tuples)) for a in buffer.advance(0)]
    fired += [(a.start, a.end, sorted(a.tuples)) for a in buffer.flush()]
    kept, watermark = [], None
    for moment in times:
        if watermark is None or moment >= watermark:
            kept.append(moment)
            watermark = max(watermark or moment, moment)
    ends = sorted({e for m in kept for e in range((m // every + 1) * every, m + length + 1, every)})
    expected = [(e - length, e, sorted(m for m in kept if e - length <= m < e)) for e in ends]
    assert fired == expected


@pytest.mark.fast
def test_two_spouts_with_their_own_sources_are_refused_with_what_to_do():
    builder = words_builder("storm_two_spouts")
    builder.set_spout("more", TestSource([[{"word": "b"}]], schema="word string"))
    builder.set_bolt("e", Exclaim()).shuffle_grouping("word").shuffle_grouping("more")
    builder.stream("e").sink("out", TestSink())
    message = error_of(builder.create_topology)
    assert "step 'e' (test_topology.py:" in message
    assert "operators run in each micro-batch on one stream of Spark's query" in message
    assert "feed the operators and the other sinks from one stream (a source, a step, or a union of sources)" \
        in message


# ---------------------------------------------------------------------------------------------
# The spout's reader without Spark: spool, replay, acks, restart

class Counting(hr.Spout):
    """Emits 0, 1, 2, ... (``limit`` of them), each with its value as message id; notes its acks."""

    declare_output_fields = "value long"
    bounded = True

    def __init__(self, limit: int = 5) -> None:
        self.value, self.limit, self.acked, self.opened = 0, limit, [], 0

    def open(self, context):
        self.opened += 1

    def next_tuple(self):
        if self.value < self.limit:
            self.emit([self.value], msg_id=self.value)
            self.value += 1

    def ack(self, msg_id):
        self.acked.append(msg_id)


def spout_reader(spout: hr.Spout, run_dir: Path, cap: int = 2):
    from headrace.connectors.base import SourceContext
    from headrace.connectors.spout import SpoutReader, SpoutSource
    from headrace.storm import spout_stream

    connector = SpoutSource("numbers", spout, 1, cap, spout_stream(spout, "test"))
    context = SourceContext(str(run_dir), "numbers")
    connector.prepare(context)
    return SpoutReader({**connector.options(), **context.options()})


def read_values(reader, start: dict, end: dict) -> list:
    return [row["value"] for partition in reader.partitions(start, end) for batch in reader.read(partition)
            for row in batch.to_pylist() if row["value"] is not None]


@pytest.mark.fast
def test_a_spout_batch_is_spooled_so_a_replay_reads_it_again_and_acks_follow_the_commit(tmp_path):
    reader = spout_reader(Counting(), tmp_path)
    first = reader.latestOffset(reader.initialOffset())
    second = reader.latestOffset(first)  # the batch up to `first` committed: its tuples are acknowledged
    assert (first, second) == ({"seq": 2}, {"seq": 4})
    assert read_values(reader, first, second) == read_values(reader, first, second) == [2, 3]  # a replay
    assert reader._tasks[0].acked == [0, 1]
    restarted = spout_reader(Counting(), tmp_path)  # the driver died: a new reader from the same run dir
    assert read_values(restarted, first, second) == [2, 3]
    third = restarted.latestOffset(second)
    assert third == {"seq": 5, "flushed": True}  # 4, then nothing: a bounded spout's input ends
    assert read_values(restarted, second, third) == [4]
    assert restarted._tasks[0].opened == 1 and restarted._tasks[0].acked == [0, 1, 2, 3]  # open ran once
    restarted.latestOffset(third)
    assert restarted._tasks[0].acked == [0, 1, 2, 3, 4]


@pytest.mark.fast
def test_tuples_spooled_before_a_crash_go_into_the_next_batch(tmp_path):
    reader = spout_reader(Counting(), tmp_path)
    first = reader.latestOffset(reader.initialOffset())
    reader.latestOffset(first)  # spooled, but the driver dies before Spark logs this offset
    restarted = spout_reader(Counting(), tmp_path)
    again = restarted.latestOffset(first)
    assert again["seq"] == 5 and read_values(restarted, first, again) == [2, 3, 4]  # none lost, none twice


class Chatty(hr.Spout):
    declare_output_fields = "value long"

    def __init__(self, emit):
        self.emit_how = emit

    def next_tuple(self):
        self.emit_how(self)


@pytest.mark.parametrize(("emit", "message"), [
    (lambda s: s.emit([1], stream="other"),
     "emit on stream 'other', which the spout does not declare (it declares 'default')"),
    (lambda s: s.emit([1, 2]), "emitted [1, 2]; emit a list of 1 value(s) for its fields (value)"),
    (lambda s: s.emit(["one"]), "emitted ['one'], which does not fit its fields (`value` long)"),
    (lambda s: 1 / 0, "next_tuple raised ZeroDivisionError: division by zero"),
])
@pytest.mark.fast
def test_spout_errors_name_the_spout_its_method_and_the_tuple(tmp_path, emit, message):
    reader = spout_reader(Chatty(emit), tmp_path)
    with pytest.raises(SourceError) as caught:
        reader.latestOffset(reader.initialOffset())
    assert "spout 'numbers' (Chatty.next_tuple at test_topology.py:" in str(caught.value)
    assert message in str(caught.value)


@pytest.mark.fast
def test_emit_outside_a_run_says_where_it_works():
    with pytest.raises(RuntimeError, match="Counting.emit works only inside next_tuple .to emit a failed tuple "
                                           "again, keep it in fail.. and emit it from next_tuple."):
        Counting().emit([1])
    with pytest.raises(RuntimeError, match="Exclaim.emit works only while the bolt runs"):
        Exclaim().emit(["a"])


@pytest.mark.fast
def test_more_declaration_and_builder_errors():
    class Raises(Exclaim):
        def declare_output_fields(self, declarer):
            raise ValueError("no fields today")

    class Unreadable(Exclaim):
        declare_output_fields = 42

    class Empty(Exclaim):
        def declare_output_fields(self, declarer):
            declarer.declare_stream("s", [])

    class Twice(Exclaim):
        def declare_output_fields(self, declarer):
            declarer.declare("word string")
            declarer.declare("word string")

    class Maybe(Exclaim):
        def declare_output_fields(self, declarer):
            declarer.declare("word string", direct="yes")

    class DirectSpout(TypedSpout):
        def declare_output_fields(self, declarer):
            declarer.declare("word string", direct=True)

    builder = words_builder("storm_errors_f")
    assert "step 'b' (test_topology.py:" in error_of(lambda: builder.set_bolt("b", Raises()))
    assert "declare_output_fields raised ValueError: no fields today" in \
        error_of(lambda: builder.set_bolt("b", Raises()))
    assert "cannot read fields from 42; give names ('word', 'count'), or names with types" in \
        error_of(lambda: builder.set_bolt("b", Unreadable()))
    assert "stream 's': give at least one field" in error_of(lambda: builder.set_bolt("b", Empty()))
    assert "stream 'default' is declared twice" in error_of(lambda: builder.set_bolt("b", Twice()))
    assert "direct must be True or False, got 'yes'" in error_of(lambda: builder.set_bolt("b", Maybe()))
    assert "a spout's stream cannot be direct" in error_of(lambda: builder.set_spout("s", DirectSpout()))
    assert "TopologyBuilder takes an hr.Pipeline or a pipeline name, got 3" in error_of(lambda: hr.TopologyBuilder(3))
    declarer = builder.set_bolt("e", Exclaim())
    assert "grouping (test_topology.py:" in error_of(lambda: declarer.grouping("word", "shuffle"))
    assert "expected an hr.groupings grouping (Fields('word'), Shuffle(), ...), got 'shuffle'" in \
        error_of(lambda: declarer.grouping("word", "shuffle"))
    assert "the window length must be a number of tuples (an int) or a duration ('10s'), got None" in \
        error_of(lambda: Sum().with_window(None))
    assert "the timestamp field must be a field name, got 3" in \
        error_of(lambda: Sum().with_window("10s").with_timestamp_field(3))


@pytest.mark.parametrize(("record", "message"), [
    ("just text", "a bolt takes tuples, dicts or dataclass instances; src:default sent str 'just text'"),
    ({"value": 1, "ts": "noon"}, "the timestamp field 'ts' of Tuple(value=1, ts='noon'; from src:default task 0) is "
                                 "'noon'; it must be epoch milliseconds or a datetime"),
])
@pytest.mark.fast
def test_records_a_bolt_cannot_take_are_named(record, message):
    with pytest.raises(StepFunctionError) as caught:
        run_bolt(Sum().with_window("10s").with_timestamp_field("ts"), [record])
    assert message in str(caught.value)


class Grumpy(Counting):
    def ack(self, msg_id):
        raise OSError("the queue is gone")


@pytest.mark.fast
def test_a_spout_ack_that_raises_names_the_spout_and_method(tmp_path):
    reader = spout_reader(Grumpy(), tmp_path)
    first = reader.latestOffset(reader.initialOffset())
    with pytest.raises(SourceError, match=r"spout 'numbers' \(Grumpy.ack at test_topology.py:\d+\), task 0: ack raised "
                                          r"OSError: the queue is gone"):
        reader.latestOffset(first)


@pytest.mark.fast
def test_a_spouts_parallelism_cannot_change_on_restart(tmp_path):
    from headrace.connectors.base import SourceContext
    from headrace.connectors.spout import SpoutReader, SpoutSource
    from headrace.storm import spout_stream

    reader = spout_reader(Counting(), tmp_path)
    reader.latestOffset(reader.initialOffset())
    connector = SpoutSource("numbers", Counting(), 2, 2, spout_stream(Counting(), "test"))
    context = SourceContext(str(tmp_path), "numbers")
    connector.prepare(context)
    wider = SpoutReader({**connector.options(), **context.options()})
    with pytest.raises(SourceError, match="spout 'numbers' has 2 task.s., but its state in the run directory was "
                                          "saved by 1: each task owns its state, so the parallelism cannot change"):
        wider.latestOffset({"seq": 2})


class Judge(hr.Bolt):
    declare_output_fields = "value long"

    def process(self, tuple):
        (self.fail if tuple["value"] < 0 else self.ack)(tuple)


@pytest.mark.fast
def test_acks_and_fails_are_counted_and_a_failed_tuples_spout_roots_leave_the_window():
    spec = WindowSpec("judge", cloudpickle.dumps(Judge()), 1, {7: "numbers.default"}, {}, 1, 0, 0, {})
    rows = [(7, cloudpickle.dumps({"value": v, "_hr_seq": seq, "_hr_task": 0}), False)
            for seq, v in enumerate([3, -1, 4, -5], start=1)]
    emitted = run_window(spec, 0, rows)
    failed = [pickle.loads(p) for e, _, _, p, _ in emitted if e == -4]
    assert failed == [[("numbers", 2), ("numbers", 4)]]
    attributes, _ = pickle.loads(next(p for e, _, _, p, _ in emitted if e == -3))
    judge = Judge()
    judge.__dict__.update(attributes)
    assert (judge.acked, judge.failed) == (2, 2)


@pytest.mark.fast
def test_a_fluent_step_is_a_component_by_its_name_or_as_a_spout():
    p = hr.Pipeline("storm_fluent_components")
    lines = p.source("lines", TestSource([[{"line": "a b"}]], schema="line string"))
    words = lines.flat_map(lambda r: [{"word": w} for w in r["line"].split()], schema="word string", name="split")
    builder = hr.TopologyBuilder(p)
    builder.set_spout("words", words)
    builder.set_bolt("by_step", Exclaim()).shuffle_grouping("split")
    builder.set_bolt("by_spout", Exclaim()).fields_grouping("words", "word")
    assert builder.stream("words") is not None and builder.stream("words").node.name == "split"
    edges = {name: [(e.source, e.port, e.target_port) for e in p.plan.nodes[name].edges]
             for name in ("by_step", "by_spout")}
    assert edges == {"by_step": [("split", None, "split.default")], "by_spout": [("split", None, "words.default")]}
    assert "stream 'default' of 'split' has no field(s) line; its fields: word string" in \
        error_of(lambda: builder.set_bolt("x", Exclaim()).fields_grouping("split", "line"))


@pytest.mark.fast
def test_a_processing_time_window_holds_the_tuples_of_the_micro_batches_in_it():
    bolt = Sum().with_window("10s")  # tumbling, on the micro-batches' processing time
    totals, state = [], None
    for window, (now, values) in enumerate([(1_000, [1, 2]), (9_000, [3]), (10_000, [4]), (25_000, [5])]):
        out, state = run_bolt(bolt, [{"value": v} for v in values], now=now, state=state, window=window)
        totals.append([t["total"] for _, _, t in out])
    assert totals == [[], [], [6], [4]]  # [0 s, 10 s) once the time reached 10 s; [10 s, 20 s) at 25 s


@pytest.mark.fast
def test_spout_tasks_take_turns_and_each_keeps_its_own_state(tmp_path):
    from headrace.connectors.base import SourceContext
    from headrace.connectors.spout import SpoutReader, SpoutSource
    from headrace.storm import spout_stream

    connector = SpoutSource("numbers", Counting(3), 2, 4, spout_stream(Counting(), "test"))
    context = SourceContext(str(tmp_path), "numbers")
    connector.prepare(context)
    reader = SpoutReader({**connector.options(), **context.options()})
    end = reader.latestOffset(reader.initialOffset())
    rows = [(r["value"], r["_hr_task"]) for p in reader.partitions({"seq": 0}, end) for b in reader.read(p)
            for r in b.to_pylist()]
    assert rows == [(0, 0), (0, 1), (1, 0), (1, 1)]
    reader.latestOffset(end)
    assert [task.acked for task in reader._tasks] == [[0, 1], [0, 1]]
