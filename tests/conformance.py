"""Feed the shared event-time conformance cases through real headrace pipelines.

A ``micro_batch`` case becomes a pipeline of TestSources (one per source when the
watermark's scope is ``min_over_sources``, else one), an event-time declaration with the
case's delay, a key, a native window aggregate (sum and count) and a TestSink. Each
``end_batch`` closes one micro-batch, processed to completion before the next.

Dropped records: Spark's native windows drop late records silently, so for these cases
the harness reads, for each micro-batch, the watermark Spark applied to it (from the
query's progress) and reports the events of that batch whose every window ended at or
before it; it then checks that Spark's own count of rows dropped by the watermark
(``numRowsDroppedByWatermark``) is exactly that number.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from pathlib import Path
from typing import Any

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

CASES = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "cases.json"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def load_cases(path: Path = CASES, model: str | None = None) -> list[dict[str, Any]]:
    cases = json.loads(path.read_text())
    return [c for c in cases if model is None or c["watermark_model"] == model]


def _millis(value: datetime.datetime) -> int:
    return int((value - EPOCH).total_seconds() * 1000)


def _window(semantics: dict[str, Any]) -> hr.Tumbling | hr.Sliding | hr.Session:
    window = semantics["window"]
    if window["kind"] == "tumbling":
        return hr.Tumbling(window["size_ms"], window.get("offset_ms", 0))
    if window["kind"] == "sliding":
        return hr.Sliding(window["size_ms"], window["slide_ms"], window.get("offset_ms", 0))
    if window["kind"] == "session":
        return hr.Session(window["gap_ms"])
    raise ValueError(f"micro_batch cases use time windows, not {window['kind']}")


def split_batches(case: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """(index of the closing end_batch marker, events) for each micro-batch."""
    batches, current = [], []
    for index, item in enumerate(case["input"]):
        if item.get("marker") == "end_batch":
            batches.append((index, current))
            current = []
        elif "marker" not in item:
            current.append(item)
    if current:
        raise ValueError(f"case {case['id']}: events after the last end_batch")
    return batches


def run_micro_batch_case(case: dict[str, Any], state_dir: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                         int]:
    """Run one case; returns (output rows, dropped events, Spark's count of dropped rows)."""
    semantics = case["semantics"]
    watermark = semantics["watermark"]
    batches = split_batches(case)
    per_source = watermark.get("scope") == "min_over_sources"
    source_names = watermark["sources"] if per_source else ["events"]
    schema = {"key": "string", "value": "long", "event_time": "timestamp"}

    def rows_of(events: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        return [{"key": e["key"], "value": e["value"], "event_time": e["event_time"]}
                for e in events if not per_source or e.get("source") == source]

    pipeline = hr.Pipeline(f"case_{case['id']}")
    streams = [pipeline.source(name, TestSource([rows_of(events, name) for _, events in batches], schema=schema,
                                                flush=False),
                               event_time="event_time", max_out_of_orderness=watermark["delay_ms"])
               for name in source_names]
    stream = streams[0].union(*streams[1:]) if len(streams) > 1 else streams[0]
    emit = "updates" if semantics["output_mode"] == "update" else "final"
    sink = TestSink()
    (stream.key_by("key").window(_window(semantics), name="windows")
     .aggregate(sum=hr.sum("value"), count=hr.count(), emit=emit).sink("out", sink))

    steps: list[tuple[int, int]] = []  # (rows in the sink, batches run) after each step
    progress: list[dict[str, Any]] = []

    def on_step(run: Any) -> None:
        steps.append((len(sink.rows()), len(run.progress_log)))
        progress[:] = run.progress_log

    run_to_completion(pipeline, state_dir=state_dir, on_step=on_step)
    return (_outputs(sink, steps, batches, emit), *_dropped(case, batches, steps, progress))


def _outputs(sink: TestSink, steps: list[tuple[int, int]],
             batches: list[tuple[int, list[dict[str, Any]]]], emit: str) -> list[dict[str, Any]]:
    rows = sink.rows()
    out, panes = [], Counter()
    start = 0
    for (marker_index, _), (end, _) in zip(batches, steps):
        for row in rows[start:end]:
            window = (row["key"], _millis(row["window_start"]), _millis(row["window_end"]))
            out.append({"key": window[0], "window_start": window[1], "window_end": window[2],
                        "aggregate": {"sum": row["sum"], "count": row["count"]},
                        "kind": "update" if emit == "updates" else "on_time", "pane": panes[window],
                        "at": marker_index})
            panes[window] += 1
        start = end
    return out


def _dropped(case: dict[str, Any], batches: list[tuple[int, list[dict[str, Any]]]],
             steps: list[tuple[int, int]], progress: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    window = case["semantics"]["window"]
    dropped: list[dict[str, Any]] = []
    spark_count = sum(op.get("numRowsDroppedByWatermark", 0) for p in progress for op in p.get("stateOperators", []))
    first_batch = 0
    for (_, events), (_, batches_run) in zip(batches, steps):
        report = progress[first_batch] if first_batch < len(progress) else {}
        mark = (report.get("eventTime") or {}).get("watermark", "1970-01-01T00:00:00.000Z")
        w = _millis(datetime.datetime.fromisoformat(mark.replace("Z", "+00:00")))
        for event in events:
            t = event["event_time"]
            if window["kind"] == "session":
                ends = [t + window["gap_ms"]]
            else:
                ends = [end for _, end in _window(case["semantics"]).assign(t)]
            if w > 0 and all(end <= w for end in ends):
                dropped.append(event)
        first_batch = batches_run
    return dropped, spark_count


def as_multiset(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True) for r in rows)
