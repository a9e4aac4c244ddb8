"""Property tests: window assignment, session merging and count windows against brute-force models."""

from __future__ import annotations

import pickle
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.aggregates import Agg
from headrace.engine.window_functions import BuiltinAggregates
from headrace.engine.window_panes import WindowLogic, WindowState
from headrace.triggers import Emission
from headrace.windows import Count, Session, Sliding, Tumbling

pytestmark = pytest.mark.fast  # needs no JVM and no service

times = st.integers(min_value=0, max_value=10**7)


@given(t=times, size=st.integers(1, 10**5), offset=st.integers(0, 10**5))
def test_tumbling_window_is_the_one_containing_t(t, size, offset):
    [(start, end)] = Tumbling(size, offset).assign(t)
    assert start <= t < end and end - start == size
    assert (start - offset) % size == 0


@given(t=times, slide=st.integers(1, 2000), factor=st.integers(1, 6), offset=st.integers(0, 5000))
def test_sliding_windows_match_brute_force(t, slide, factor, offset):
    size = slide * factor
    offset %= slide
    brute = [(s, s + size) for s in range(t - size - slide, t + slide + 1)
             if (s - offset) % slide == 0 and s <= t < s + size]
    assert Sliding(size, slide, offset).assign(t) == sorted(brute)


def _brute_merge(windows: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """Repeatedly merge any two windows that overlap or touch, until none do."""
    current = set(windows)
    changed = True
    while changed:
        changed = False
        for a in list(current):
            for b in list(current):
                if a != b and a[0] <= b[1] and b[0] <= a[1]:
                    current -= {a, b}
                    current.add((min(a[0], b[0]), max(a[1], b[1])))
                    changed = True
                    break
            if changed:
                break
    return current


@given(order=st.permutations(list(range(12))), gap=st.integers(1, 5))
def test_session_merging_ignores_arrival_order(order, gap):
    """The window operator merges sessions record by record; the result must not depend on order."""
    times_ms = [t * 3 for t in order]
    logic = WindowLogic(Session(gap), Emission(), BuiltinAggregates((("n", Agg("count")),)))
    state = WindowState()
    logic.process(state, [("k", t, {"v": t}) for t in times_ms], float("-inf"), [], [])
    expected = sorted(_brute_merge([(t, t + gap) for t in times_ms]))
    assert sorted((s, e) for _, s, e in state.panes) == expected
    counts = {(s, e): logic.function.result(p.total, "k", None)[0]["n"] for (_, s, e), p in state.panes.items()}
    assert sum(counts.values()) == len(times_ms)


_count_records = st.lists(st.tuples(st.sampled_from("abc"), st.one_of(st.none(), st.integers(-50, 50))), max_size=60)


@given(records=_count_records, size=st.integers(1, 7), cuts=st.lists(st.integers(0, 60), max_size=4),
       switch=st.integers(0, 60))
def test_tumbling_count_windows_fold_records_as_keeping_them_would(records, size, cuts, switch):
    """Tumbling count windows of built-in aggregates fold each record in as it arrives; the panes
    must be those of keeping each key's last `size` records (the path of sliding count windows),
    across micro-batches with the state pickled in between, and from a state the keeping path left."""
    function = BuiltinAggregates((("n", Agg("count")), ("total", Agg("sum", "v")), ("low", Agg("min", "v")),
                                  ("high", Agg("max", "v")), ("avg", Agg("mean", "v"))))
    keeping, folding = (WindowLogic(Count(size), Emission(), function) for _ in range(2))
    assert folding.folds_counts
    keeping.folds_counts = False
    batches = [records[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(records)])]

    def run(logic_at) -> list:
        state, fired, seen = WindowState(), [], 0
        for batch in batches:
            for key, value in batch:
                logic_at(seen).process(state, [(key, 0, {"v": value})], float("-inf"), fired, [])
                seen += 1
            state = pickle.loads(pickle.dumps(state))
        return fired

    expected = run(lambda _: keeping)
    assert run(lambda _: folding) == expected
    assert run(lambda seen: keeping if seen < switch else folding) == expected
    assert len(expected) == sum(n // size for n in Counter(key for key, _ in records).values())


_values = st.one_of(st.lists(st.one_of(st.none(), st.integers(-2**62, 2**62)), max_size=60),
                    st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6)), max_size=60))


@given(values=_values, keys=st.lists(st.sampled_from("ab"), min_size=60, max_size=60), size=st.integers(1, 7),
       cuts=st.lists(st.integers(0, 60), max_size=4))
def test_count_windows_fold_columns_as_records_one_by_one(values, keys, size, cuts):
    """The columnar path (a key's records of a batch folded a slice at a time) gives the panes of
    folding them one by one: the same results, exact integers, the same float sums."""
    function = BuiltinAggregates((("n", Agg("count")), ("seen", Agg("count", "v")), ("total", Agg("sum", "v")),
                                  ("low", Agg("min", "v")), ("high", Agg("max", "v")), ("avg", Agg("mean", "v"))))
    logic = WindowLogic(Count(size), Emission(), function)
    assert logic.counts_columns
    records = list(zip(keys, values))
    batches = [records[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(records)])]
    one_by_one, columnar = WindowState(), WindowState()
    expected: list = []
    got: list = []
    for batch in batches:
        for key, value in batch:
            logic.process(one_by_one, [(key, 0, {"v": value})], float("-inf"), expected, [])
        for key in sorted({key for key, _ in batch}):
            column = [value for k, value in batch if k == key]
            logic.process_counted_columns(columnar, key, {"v": column}, len(column), got)
        columnar = pickle.loads(pickle.dumps(columnar))

    def by_key(fired: list) -> list:
        return sorted((f.key, f.pane, repr(f.results)) for f in fired)
    assert by_key(got) == by_key(expected)
