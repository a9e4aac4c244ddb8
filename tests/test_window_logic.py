"""The window operator's logic, without Spark: every per_event and none conformance case,
driven the way Spark drives it (a micro-batch per event, then a watermark step)."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from headrace.engine.window_functions import WindowFunction
from headrace.engine.window_panes import Fired, WindowLogic, WindowState
from headrace.triggers import AfterDelay, AfterWatermark, CountTrigger, Emission, EveryN
from headrace.windows import Count, Global, Session, Sliding, Tumbling

pytestmark = pytest.mark.fast  # needs no JVM and no service


class SumCount(WindowFunction):
    def create(self) -> tuple[int, int]:
        return (0, 0)

    def add(self, acc: tuple[int, int], record: dict[str, Any]) -> tuple[int, int]:
        return (acc[0] + record["value"], acc[1] + 1)

    def merge(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc: tuple[int, int], key: Any, window: Any) -> list[dict[str, Any]]:
        return [{"sum": acc[0], "count": acc[1]}]


def logic_for(case: dict[str, Any]) -> WindowLogic:
    semantics, window = case["semantics"], case["semantics"]["window"]
    shape = {"tumbling": lambda: Tumbling(window["size_ms"], window.get("offset_ms", 0)),
             "sliding": lambda: Sliding(window["size_ms"], window["slide_ms"], window.get("offset_ms", 0)),
             "session": lambda: Session(window["gap_ms"]),
             "count": lambda: Count(window["size"], window.get("slide")),
             "global": lambda: Global()}[window["kind"]]()
    trigger_spec = semantics["trigger"]
    if trigger_spec["type"] == "count":
        trigger: Any = CountTrigger(trigger_spec["n"])
    else:
        early_spec, early = trigger_spec.get("early") or {}, None
        if "every_n_elements" in early_spec:
            early = EveryN(early_spec["every_n_elements"])
        if "processing_time_delay_ms" in early_spec:
            early = AfterDelay(early_spec["processing_time_delay_ms"])
        trigger = AfterWatermark(early, trigger_spec.get("on_time_empty_pane", "skip"))
    emission = Emission(trigger, semantics.get("allowed_lateness_ms", 0),
                        semantics.get("accumulation_mode", "accumulating") == "accumulating")
    return WindowLogic(shape, emission, SumCount())


def drive(case: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    logic, state = logic_for(case), WindowState()
    watermark, max_time = -math.inf, -math.inf
    delay = (case["semantics"].get("watermark") or {}).get("delay_ms")
    outputs, dropped_all = [], []
    for at, item in enumerate(case["input"]):
        fired: list[Fired] = []
        dropped: list[Any] = []
        if "marker" not in item:
            logic.on_watermark(state, watermark, fired)
            logic.process(state, [(item["key"], item["event_time"], item)], watermark, fired, dropped)
            if delay is not None:
                max_time = max(max_time, item["event_time"])
                watermark = max(watermark, max_time - delay)
            logic.on_watermark(state, watermark, fired)
        elif item["marker"] == "watermark":
            watermark = max(watermark, item["time"])
            logic.on_watermark(state, watermark, fired)
        elif item["marker"] == "end_of_stream":
            watermark = math.inf
            logic.on_watermark(state, watermark, fired)
        elif item["marker"] == "processing_time":
            logic.on_clock(state, item["time"], fired)
        outputs += [{"key": f.key, "window_start": f.start, "window_end": f.end, "aggregate": r, "kind": f.kind,
                     "pane": f.pane, "at": at} for f in fired for r in f.results]
        dropped_all += [d.record for d in dropped]
    return outputs, dropped_all


CASES_FILE = Path(__file__).resolve().parent / "conformance" / "cases.json"
CASES = [c for c in json.loads(CASES_FILE.read_text()) if c["watermark_model"] in ("per_event", "none")]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_logic_matches_case(case):
    outputs, dropped = drive(case)

    def bag(rows: list[dict[str, Any]]) -> Counter[str]:
        return Counter(json.dumps(r, sort_keys=True) for r in rows)

    assert bag(outputs) == bag(case["expected_output"])
    assert bag(dropped) == bag(case["expected_dropped"])
