"""The keyed process step's logic, without Spark: declared state with TTL, timers of both
domains, the end of input, and every mistake a user can make, with its message."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

import headrace as hr
from headrace.engine.process_logic import ProcessLogic, ProcessState
from headrace.errors import StepFunctionError
from headrace.state import StateUsageError

pytestmark = pytest.mark.fast  # needs no JVM and no service

OUTPUT = (("key", "string"), ("what", "string"), ("n", "long"))


def logic(fn: hr.KeyedProcessFunction, event_time: bool = True, output: Any = OUTPUT) -> ProcessLogic:
    return ProcessLogic("step1", fn, output, event_time, f"{type(fn).__name__}.process at here.py:1")


def feed(lg: ProcessLogic, state: ProcessState, records: list[tuple[str, int | None, dict[str, Any]]],
         watermark: int | None = None, now: int = 0, ended: bool = False) -> list[tuple[Any, ...]]:
    return lg.run(state, records, watermark, now, ended)


class Everything(hr.KeyedProcessFunction):
    total = hr.ValueState(default=0)
    recent = hr.ListState()
    per_page = hr.MapState()

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        self.total.set(self.total.get() + record["n"])
        self.recent.append(record["n"])
        self.per_page.put(record["page"], self.per_page.get(record["page"], 0) + 1)
        ctx.emit({"key": ctx.key, "what": f"{self.recent.get()} {sorted(self.per_page.items())}",
                  "n": self.total.get()})


def test_each_key_has_its_own_value_list_and_map_state():
    lg, state = logic(Everything()), ProcessState()
    out = feed(lg, state, [("a", 1, {"n": 1, "page": "x"}), ("b", 1, {"n": 10, "page": "x"}),
                           ("a", 2, {"n": 2, "page": "y"})])
    out += feed(lg, state, [("a", 3, {"n": 3, "page": "x"})])
    assert out == [("a", "[1] [('x', 1)]", 1), ("b", "[10] [('x', 1)]", 10),
                   ("a", "[1, 2] [('x', 1), ('y', 1)]", 3), ("a", "[1, 2, 3] [('x', 2), ('y', 1)]", 6)]


class Remember(hr.KeyedProcessFunction):
    last = hr.ValueState(ttl="10s")
    items = hr.ListState(ttl=10_000)
    seen = hr.MapState(ttl="10s")

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        if record.get("write"):
            self.last.set(record["write"])
            self.items.append(record["write"])
            self.seen.put(record["write"], ctx.processing_time)
        ctx.emit({"key": ctx.key, "what": f"{self.last.get()} {self.items.get()} {self.seen.keys()}",
                  "n": len(self.items)})


def test_state_expires_its_ttl_after_it_was_written_and_is_swept():
    lg, state = logic(Remember(), event_time=False), ProcessState()
    assert feed(lg, state, [("a", None, {"write": "x"})], now=1_000) == [("a", "x ['x'] ['x']", 1)]
    assert feed(lg, state, [("a", None, {"write": "y"})], now=6_000) == [("a", "y ['x', 'y'] ['x', 'y']", 2)]
    # x was written at 1 s: gone at 11 s; y (6 s) lives until 16 s
    assert feed(lg, state, [("a", None, {})], now=11_000) == [("a", "y ['y'] ['y']", 1)]
    assert feed(lg, state, [("b", None, {})], now=16_000) == [("b", "None [] []", 0)]
    assert state.cells == {}  # the sweep dropped the key whose state all expired


class Timeout(hr.KeyedProcessFunction):
    """Emits 'timeout' 5 s of event time after a key's last record, and counts records."""

    deadline = hr.ValueState()
    seen = hr.ValueState(default=0)

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        if self.deadline.exists():
            ctx.delete_event_time_timer(self.deadline.get())
        assert ctx.timestamp is not None
        self.deadline.set(ctx.timestamp + 5_000)
        ctx.register_event_time_timer(ctx.timestamp + 5_000)
        self.seen.set(self.seen.get() + 1)

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        ctx.emit({"key": ctx.key, "what": f"{timer.domain}@{timer.time}", "n": self.seen.get()})
        self.deadline.clear()
        self.seen.clear()


def test_event_time_timers_fire_in_time_order_once_the_watermark_reaches_them():
    lg, state = logic(Timeout()), ProcessState()
    assert feed(lg, state, [("a", 1_000, {}), ("b", 2_000, {}), ("a", 3_000, {})]) == []
    assert feed(lg, state, [], watermark=7_000) == [("b", "event_time@7000", 1)]  # a moved to 8 s
    assert lg.next_timer(state, "event_time") == 8_000
    assert feed(lg, state, [("b", 9_000, {})], watermark=8_000) == [("a", "event_time@8000", 2)]
    assert feed(lg, state, [], watermark=20_000) == [("b", "event_time@14000", 1)]
    assert state.cells == {} and state.timers == {} and lg.next_timer(state, "event_time") is None


class Reminder(hr.KeyedProcessFunction):
    """A processing-time timer 1 s after each key's first record; registering twice is one timer."""

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.register_processing_time_timer(1_000 + record["at"])
        ctx.register_processing_time_timer(1_000 + record["at"])

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        ctx.emit({"key": ctx.key, "what": timer.domain, "n": ctx.processing_time})


def test_processing_time_timers_fire_when_processing_time_reaches_them():
    lg, state = logic(Reminder(), event_time=False), ProcessState()
    assert feed(lg, state, [("a", None, {"at": 0}), ("b", None, {"at": 500})], now=0) == []
    assert feed(lg, state, [], now=999) == []
    assert feed(lg, state, [], now=1_200) == [("a", "processing_time", 1_200)]
    assert feed(lg, state, [], now=5_000) == [("b", "processing_time", 5_000)]
    assert feed(lg, state, [], now=9_000) == []


class Periodic(hr.KeyedProcessFunction):
    """A timer that registers the next one: at the end of input it fires once, and stops."""

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.register_event_time_timer(10_000)

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        ctx.emit({"key": ctx.key, "what": str(timer.time), "n": 0})
        ctx.register_event_time_timer(timer.time + 10_000)


def test_at_the_end_of_input_pending_timers_fire_once_and_new_ones_are_discarded():
    lg, state = logic(Periodic()), ProcessState()
    feed(lg, state, [("a", 1_000, {})])
    assert feed(lg, state, [], watermark=15_000) == [("a", "10000", 0)]
    end = 253_402_214_400_000
    assert feed(lg, state, [], watermark=end, ended=True) == [("a", "20000", 0)]
    assert state.timers == {}


class Batched(hr.KeyedProcessFunction):
    """Holds a micro-batch's records for the timer the next watermark passes, then emits them in order."""

    waiting = hr.ListState()

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        self.waiting.append(record["n"])
        ctx.register_event_time_timer((ctx.watermark or 0) + 1)

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        ctx.emit({"key": ctx.key, "what": ",".join(map(str, sorted(self.waiting.get()))), "n": timer.time})
        self.waiting.clear()
        ctx.register_event_time_timer(timer.time + 1)  # at the end: discarded, nothing follows


def test_at_the_end_of_input_the_last_records_come_before_every_timer_theirs_too():
    """Records that arrive with the end (a chained step's results, released by it) are handled first;
    then every timer fires, those the records registered as well, once."""
    lg, state = logic(Batched()), ProcessState()
    assert feed(lg, state, [("a", 900, {"n": 3}), ("a", 800, {"n": 1})], watermark=1_000) == []
    end = 253_402_214_400_000 - 30_000  # after a join, Spark holds the end back by the join's bound
    assert feed(lg, state, [("a", 5_000, {"n": 2}), ("b", 6_000, {"n": 9})], watermark=end, ended=True) == [
        ("a", "1,2,3", 1_001), ("a", "", end + 1), ("b", "9", end + 1)]
    assert state.timers == {}


# -- mistakes, caught with a message that names the step, the function, the key and the record --

def fails(fn: hr.KeyedProcessFunction, message: str, *, event_time: bool = True, watermark: int | None = None,
          now: int = 0, record: dict[str, Any] | None = None) -> None:
    lg = logic(fn, event_time=event_time)
    with pytest.raises(StepFunctionError) as error:
        feed(lg, ProcessState(), [("k1", 5_000, record or {"n": 1})], watermark=watermark, now=now)
    assert str(error.value) == message


class PastTimers(hr.KeyedProcessFunction):
    """Registers timers at and behind both clocks; each fires at once, after the record."""

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.register_event_time_timer(ctx.watermark)
        ctx.register_event_time_timer(ctx.watermark - 500)
        ctx.register_processing_time_timer(ctx.processing_time - 1)
        ctx.emit({"key": ctx.key, "what": "record", "n": record["n"]})

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        ctx.emit({"key": ctx.key, "what": timer.domain, "n": timer.time})


def test_timers_at_or_behind_the_clocks_fire_at_once():
    lg = ProcessLogic("step1", PastTimers(), (("key", "string"), ("what", "string"), ("n", "long")), True, "here")
    out = feed(lg, ProcessState(), [("k1", 5_000, {"n": 1}), ("k2", 5_000, {"n": 2})], watermark=4_000, now=2_000)
    assert out == [("k1", "record", 1), ("k1", "processing_time", 1_999), ("k1", "event_time", 3_500),
                   ("k1", "event_time", 4_000), ("k2", "record", 2), ("k2", "processing_time", 1_999),
                   ("k2", "event_time", 3_500), ("k2", "event_time", 4_000)]


class NoOnTimer(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.register_event_time_timer(99_000)


def test_a_timer_needs_on_timer():
    fails(NoOnTimer(), "step 'step1' (NoOnTimer.process at here.py:1): NoOnTimer registers a timer but does not "
          "define on_timer(timer, ctx), which a firing timer calls (key: 'k1', record: {'n': 1})")


class EventTimer(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.register_event_time_timer(10_000)

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        pass


def test_an_event_time_timer_needs_event_time():
    fails(EventTimer(), "step 'step1' (EventTimer.process at here.py:1): an event-time timer needs event "
          "time, and this stream has none: declare it with .with_event_time('field', max_out_of_orderness) before "
          "key_by, or use a processing-time timer (key: 'k1', record: {'n': 1})", event_time=False)


class BadTimerValue(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.register_event_time_timer("soon")

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        pass


def test_a_timer_takes_milliseconds_or_a_datetime():
    fails(BadTimerValue(), "step 'step1' (BadTimerValue.process at here.py:1): register_event_time_timer takes "
          "epoch milliseconds (int) or a datetime, got 'soon' (key: 'k1', record: {'n': 1})")


class UndeclaredState(hr.KeyedProcessFunction):
    def open(self) -> None:
        self.factor = 2  # configuration: fine

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        self.total = record["n"] * self.factor


def test_state_used_without_being_declared_is_refused():
    fails(UndeclaredState(), "step 'step1' (UndeclaredState.process at here.py:1): UndeclaredState set self.total "
          "while handling a record or timer, but 'total' is not declared state: an instance attribute is shared by "
          "every key and lost on restart; declare it as a class attribute, e.g. `total = hr.ValueState()`, and "
          "write it with self.total.set(...) (key: 'k1', record: {'n': 1})")


class AssignsState(hr.KeyedProcessFunction):
    total = hr.ValueState()

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        self.total = 5


def test_state_is_written_through_its_handle():
    fails(AssignsState(), "step 'step1' (AssignsState.process at here.py:1): AssignsState.total is declared state: "
          "write it through its handle (self.total.set(...), .append(...) or .put(...)), not by assignment "
          "(key: 'k1', record: {'n': 1})")


class StateInOpen(hr.KeyedProcessFunction):
    total = hr.ValueState()

    def open(self) -> None:
        self.total.set(0)

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        pass


def test_state_outside_a_record_or_timer_is_refused():
    fails(StateInOpen(), "step 'step1' (StateInOpen.open): state StateInOpen.total was used outside process() and "
          "on_timer(): state belongs to a key, so it can only be read or written while a record or a timer of that "
          "key is handled")


class Emits(hr.KeyedProcessFunction):
    def __init__(self, record: Any) -> None:
        self.record = record

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        ctx.emit(self.record)


@pytest.mark.parametrize(("emitted", "problem"), [
    ({"key": "k1", "what": "x"}, "emitted {'key': 'k1', 'what': 'x'}, which does not fit the output schema (key "
                                 "string, what string, n long): missing 'n'"),
    ({"key": "k1", "what": "x", "n": 1, "extra": 2}, "emitted {'extra': 2, 'key': 'k1', 'n': 1, 'what': 'x'}, "
                                                     "which does not fit the output schema (key string, what string, "
                                                     "n long): unexpected 'extra'"),
    ({"key": "k1", "what": "x", "n": "many"}, "emitted field 'n' = 'many' (str), which does not fit its declared "
                                              "type long (record: {'key': 'k1', 'n': 'many', 'what': 'x'})"),
    ({"key": "k1", "what": "x", "n": True}, "emitted field 'n' = True (bool), which does not fit its declared type "
                                            "long (record: {'key': 'k1', 'n': True, 'what': 'x'})"),
    (["k1", "x", 1], "emitted list ['k1', 'x', 1]; emit a dict or a dataclass instance with the output fields key, "
                     "what, n"),
])
def test_an_output_that_does_not_fit_the_schema_is_refused(emitted, problem):
    fails(Emits(emitted), f"step 'step1' (Emits.process at here.py:1): {problem} (key: 'k1', record: {{'n': 1}})")


@dataclasses.dataclass
class Out:
    key: str
    what: str
    n: int


def test_dataclass_outputs_and_none_fit():
    lg = logic(Emits(Out("k1", "x", 3)))
    assert feed(lg, ProcessState(), [("k1", 1, {})]) == [("k1", "x", 3)]
    lg = logic(Emits({"key": None, "what": None, "n": None}))
    assert feed(lg, ProcessState(), [("k1", 1, {})]) == [(None, None, None)]


class Raises(hr.KeyedProcessFunction):
    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        raise ValueError(f"cannot handle {record['n']}")


def test_a_function_that_raises_names_the_step_the_key_and_the_record():
    fails(Raises(), "step 'step1' (Raises.process at here.py:1) raised ValueError: cannot handle 1 (key: 'k1', "
          "record: {'n': 1})")


# -- mistakes caught while the pipeline is built --

def keyed() -> hr.KeyedStream:
    from headrace.testing import TestSource

    p = hr.Pipeline("build")
    return p.source("events", TestSource([], schema={"user": "string", "n": "long"})).key_by("user")


class Holds(hr.KeyedProcessFunction):
    def __init__(self) -> None:
        self.lock = threading.Lock()

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        pass


class StateOnInstance(hr.KeyedProcessFunction):
    def __init__(self) -> None:
        self.count = hr.ValueState()

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        pass


class NoProcess(hr.KeyedProcessFunction):
    pass


@pytest.mark.parametrize(("fn", "schema", "message"), [
    (Everything, OUTPUT, "process needs an instance of the function class: Everything(), not the class itself"),
    (lambda r, c: None, OUTPUT, "process needs an instance of a hr.KeyedProcessFunction subclass, got <function "
                                "<lambda> at"),
    (NoProcess(), OUTPUT, "NoProcess does not implement process(record, ctx)"),
    (StateOnInstance(), OUTPUT, "StateOnInstance declares state 'count' on the instance; declare state as class "
                                "attributes, e.g. `class StateOnInstance(hr.KeyedProcessFunction): count = "
                                "hr.ValueState()`"),
    (Holds(), OUTPUT, "Holds cannot be sent to Spark's workers: TypeError: cannot pickle '_thread.lock' object; keep "
                      "connections and files out of __init__ and open them in open()"),
    (Everything(), None, "give the fields of the records the function emits: schema={'field': 'type', ...}, a DDL "
                         "string, a dataclass or a TypedDict"),
])
def test_a_process_function_that_cannot_run_is_refused_as_the_pipeline_is_built(fn, schema, message):
    with pytest.raises(hr.PlanError) as error:
        keyed().process(fn, schema=schema, name="proc")
    assert str(error.value).startswith("step 'proc' (test_process_logic.py:")
    assert message in str(error.value)


def test_a_ttl_must_be_positive():
    with pytest.raises(StateUsageError, match=r"ValueState ttl must be positive, got '0s'"):
        hr.ValueState(ttl="0s")
