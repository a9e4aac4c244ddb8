"""Hypothesis strategies drawing random pipeline specs (model/spec.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from model.spec import (
    AGGREGATES,
    SINK_KINDS,
    BadLine,
    Event,
    NativeFilter,
    PythonFilter,
    PythonMap,
    Rolling,
    SecondWindow,
    Session,
    Sliding,
    Spec,
    SqlStep,
    SqlWindow,
    TableJoin,
    Tally,
    Tumbling,
    Union,
    Window,
    WithColumns,
)

BAD_LINES = ("not json", '{"key": "a", "value": "seven", "ts": 1000}', '{"key": "b", "value": 1, "ts": "soon"}')

keys = st.sampled_from(["a", "b", "c", None])
values = st.one_of(st.none(), st.integers(-5, 20))


@st.composite
def batches(draw: st.DrawFn, least: int = 1, most: int = 3) -> tuple[tuple[Event | BadLine, ...], ...]:
    """Micro-batches whose times mostly advance, with out-of-order and late records and bad lines."""
    out = []
    base = 0
    for _ in range(draw(st.integers(least, most))):
        base += draw(st.integers(0, 6_000))
        events = draw(st.lists(st.builds(Event, keys, values, st.integers(max(0, base - 8_000), base + 3_000)),
                               max_size=6))
        bad = draw(st.lists(st.sampled_from(BAD_LINES).map(BadLine), max_size=1))
        lines = events + bad
        out.append(tuple(draw(st.permutations(lines)) if lines else ()))
    return tuple(out)


stateless = st.one_of(
    st.builds(NativeFilter, st.integers(-3, 5)),
    st.builds(PythonFilter, st.integers(2, 5)),
    st.builds(PythonMap, st.integers(-2, 3)),
    st.builds(WithColumns, st.integers(-2, 3)),
    st.builds(SqlStep, st.integers(-2, 3)),
    st.builds(TableJoin, st.sampled_from(["inner", "left"])),
)

aggregates = st.lists(st.sampled_from(AGGREGATES), min_size=1, max_size=3, unique=True).map(tuple)

shapes = st.one_of(
    st.builds(Tumbling, st.sampled_from([1_000, 2_000, 5_000])),
    st.sampled_from([(2_000, 1_000), (3_000, 1_000), (4_000, 2_000)]).map(lambda p: Sliding(*p)),
    st.builds(Session, st.sampled_from([500, 1_000, 2_500])),
)

windows = st.builds(Window, shapes, st.booleans(), aggregates)
windows_of_windows = st.builds(Window, shapes, st.booleans(), aggregates.map(lambda a: ("count", *a[1:]) if "count"
                                                                              not in a else a),
                               st.builds(SecondWindow, st.sampled_from([5_000, 10_000])))
pane_windows = st.builds(Window, st.one_of(shapes.filter(lambda s: not isinstance(s, Session))), st.booleans(),
                         aggregates, st.none(), st.sampled_from([0, 1_000, 3_000]), st.sampled_from([None, 1, 2]),
                         st.booleans())
processes = st.builds(Tally, st.sampled_from([0, 1_000, 3_000]))
sql_windows = st.builds(SqlWindow, st.sampled_from([1, 2, 5]))
stateful = st.one_of(st.none(), windows, windows, windows_of_windows, pane_windows, processes, sql_windows,
                     st.builds(Rolling, aggregates))

sink_kinds = st.sampled_from(SINK_KINDS)


# a pipeline from files to one file sink, read by a driver killed mid-stream (no running aggregates:
# Spark's file writer has no update mode, see tests/test_differential_found.py)
killable_specs = st.builds(
    Spec,
    batches=batches(4, 5),
    delay=st.sampled_from([0, 500, 2_000]),
    steps=st.lists(stateless, max_size=3).map(tuple),
    stateful=st.one_of(st.none(), windows, windows_of_windows, pane_windows, processes),
    sinks=st.just(("files",)),
)

specs = st.builds(
    Spec,
    batches=batches(),
    delay=st.sampled_from([0, 500, 2_000]),
    steps=st.lists(stateless, max_size=3).map(tuple),
    stateful=stateful,
    sinks=st.lists(sink_kinds, min_size=1, max_size=2).map(tuple),
    tap=st.one_of(st.none(), sink_kinds),
    dead_letters=st.one_of(st.none(), sink_kinds),
    union=st.one_of(st.none(), st.none(), st.builds(Union, batches(), st.sampled_from([0, 1_000]))),
)
