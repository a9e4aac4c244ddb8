"""Operator state pickled by an older version, whose classes lived in other modules, still loads
(a checkpoint stores each key's state pickled, naming the classes' modules). No Spark session."""

from __future__ import annotations

import pickle
import sys
import types

import pytest

from headrace.engine.process_logic import ProcessState
from headrace.engine.window_panes import Pane, WindowState
from headrace.spark.stateful import load_state

pytestmark = pytest.mark.fast  # needs no JVM and no service


def _pickled_as(monkeypatch: pytest.MonkeyPatch, state: object, old_module: str, classes: list[type]) -> bytes:
    """``state`` pickled as a version that kept ``classes`` in ``old_module`` would have pickled it."""
    module = types.ModuleType(old_module)
    for cls in classes:
        setattr(module, cls.__name__, cls)
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, old_module, module)
        for cls in classes:
            patch.setattr(cls, "__module__", old_module)
        data = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    assert old_module.encode() in data
    return data


def test_window_state_stored_under_headrace_window_state_loads(monkeypatch):
    state = WindowState(panes={("k", 0.0, 10.0): Pane([[2, 0]], [[1, 0]], pending_records=1)}, clock=5)
    data = _pickled_as(monkeypatch, state, "headrace.window_state", [WindowState, Pane])
    assert "headrace.window_state" not in sys.modules
    assert load_state(data) == state


def test_process_state_stored_under_headrace_process_loads(monkeypatch):
    state = ProcessState(cells={"k": {"count": (3, float("inf"))}}, timers={"k": {("event_time", 7)}}, sequence=1)
    data = _pickled_as(monkeypatch, state, "headrace.process", [ProcessState])
    assert load_state(data) == state


def test_current_state_loads_as_is():
    state = WindowState(clock=1)
    assert load_state(pickle.dumps(state)) == state
