"""Run event-time conformance cases through real headrace pipelines on local Spark.

    python -m headrace.testing.conformance CASES.json [--relaxed] [--only ID] [--local]

With ``--local`` the cases run through the local runner (``headrace.testing.run_locally``, no
JVM) instead of Spark. Takes a case file in the format of the shared conformance suite, runs every case, prints
one line per case and closes with ``N passed, M failed`` (exit status 1 if any failed).

* ``micro_batch``: the events up to each ``end_batch`` are one micro-batch; the window is a
  plain ``aggregate`` (Spark's native operator), one TestSource per declared source when
  the watermark is the minimum over sources. Spark drops late records silently there, so
  the dropped records are those of each batch whose every window had ended at the
  watermark Spark applied to that batch, and headrace's count of late drops must agree (the
  run's ``late_rows_dropped``: Spark's count for the windows its operator runs, the window
  processor's for the others, such as sliding windows).
* ``per_event`` and ``none``: each event is its own micro-batch; ``watermark``,
  ``processing_time`` and ``end_of_stream`` markers become control steps of the test
  source; the window runs as headrace's stateful processor and its late side output gives
  the dropped records. ``delay_ms: null`` (only markers move the watermark) is a delay
  longer than any event time.
* ``at`` is the index of the input item whose step emitted the output.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import headrace as hr
from headrace.contract import FLUSH_TIME_MS
from headrace.testing import ProcessingTime, TestSink, TestSource, Watermark, run_locally, run_to_completion
from headrace.triggers import Trigger
from headrace.windows import WindowShape

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
NO_DELAY = 10**12  # "only explicit watermark markers move W": events never reach it
SCHEMA = {"key": "string", "value": "long", "event_time": "timestamp"}


def millis(value: datetime.datetime | None) -> int | None:
    return None if value is None else int((value - EPOCH).total_seconds() * 1000)


def _row(item: dict[str, Any]) -> dict[str, Any]:
    return {"key": item["key"], "value": item["value"], "event_time": item["event_time"]}


def _output(row: dict[str, Any], kind: str, pane: int, at: int) -> dict[str, Any]:
    return {"key": row["key"], "window_start": millis(row["window_start"]), "window_end": millis(row["window_end"]),
            "aggregate": {"sum": row["sum"], "count": row["count"]}, "kind": kind, "pane": pane, "at": at}


# -- runners: where a case's pipeline runs --------------------------------------------------------

class SparkCases:
    """Cases run on local Spark (``run_to_completion``); a run is read through its progress reports."""

    def run(self, pipeline: hr.Pipeline, state_dir: str, on_step: Any) -> None:
        run_to_completion(pipeline, state_dir=state_dir, on_step=on_step)

    def batches_run(self, run: Any) -> int:
        return len(run.progress_log)

    def watermarks(self, run: Any) -> list[int]:
        """The watermark (ms) each micro-batch ran with."""
        marks = [(report.get("eventTime") or {}).get("watermark", "1970-01-01T00:00:00.000Z")
                 for report in run.progress_log]
        return [millis(datetime.datetime.fromisoformat(m.replace("Z", "+00:00"))) or 0 for m in marks]

    def late_dropped(self, run: Any) -> int:
        from headrace.runtime.progress import summarise

        return sum(summarise(report)["late_rows_dropped"] for report in run.progress_log)


class LocalCases:
    """Cases run by the local runner (``run_locally``), without a JVM."""

    def run(self, pipeline: hr.Pipeline, state_dir: str, on_step: Any) -> None:
        run_locally(pipeline, on_step=on_step)

    def batches_run(self, run: Any) -> int:
        return len(run.batches)

    def watermarks(self, run: Any) -> list[int]:
        return [batch.watermark for batch in run.batches]

    def late_dropped(self, run: Any) -> int:
        return int(run.late_rows_dropped)


SPARK, LOCAL = SparkCases(), LocalCases()


# -- per_event and none ---------------------------------------------------------------------------

def run_per_event(case: dict[str, Any], state_dir: str, runner: Any = SPARK
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    semantics = case["semantics"]
    watermark = semantics.get("watermark")
    steps: list[Any] = []
    positions: list[int] = []  # the input index of each step
    for at, item in enumerate(case["input"]):
        marker = item.get("marker")
        if marker is None:
            steps.append([_row(item)])
        elif marker == "watermark":
            steps.append(Watermark(item["time"]))
        elif marker == "end_of_stream":
            steps.append(Watermark(FLUSH_TIME_MS))
        elif marker == "processing_time":
            steps.append(ProcessingTime(item["time"]))
        else:
            continue
        positions.append(at)
    pipeline = hr.Pipeline(f"case_{case['id']}")
    source = TestSource(steps, schema=SCHEMA, flush=False)
    if watermark is not None:
        delay = watermark["delay_ms"] if watermark.get("delay_ms") is not None else NO_DELAY
        events = pipeline.source("events", source, event_time="event_time", max_out_of_orderness=delay)
    else:
        events = pipeline.source("events", source)
    windows = events.key_by("key").window(
        WindowShape.from_json(semantics["window"]),
        trigger=Trigger.from_json(semantics["trigger"]) if semantics.get("trigger") else None,
        allowed_lateness=semantics.get("allowed_lateness_ms", 0),
        accumulation=semantics.get("accumulation_mode", "accumulating"), name="windows")
    result = windows.aggregate(sum=hr.sum("value"), count=hr.count())
    panes, late = TestSink(), TestSink()
    result.sink("out", panes)
    result.late_records().sink("late", late)
    marks: list[tuple[int, int]] = []

    def on_step(run: Any) -> None:
        marks.append((len(panes.rows()), len(late.rows())))

    runner.run(pipeline, state_dir, on_step)
    outputs, dropped = [], []
    pane_rows, late_rows = panes.rows(), late.rows()
    start_p = start_l = 0
    for at, (end_p, end_l) in zip(positions, marks):
        # a window with the default emission has no pane columns: its one pane is on time
        outputs += [_output(r, r.get("pane_kind", "on_time"), r.get("pane_index", 0), at)
                    for r in pane_rows[start_p:end_p]]
        for r in late_rows[start_l:end_l]:
            record = json.loads(r["record"])
            dropped.append({"key": r["key"], "value": record["value"], "event_time": millis(r["event_time"])})
        start_p, start_l = end_p, end_l
    return outputs, dropped


# -- micro_batch ----------------------------------------------------------------------------------

def split_batches(case: dict[str, Any]) -> list[tuple[int, list[dict[str, Any]]]]:
    """(index of the closing end_batch marker, events) for each micro-batch."""
    batches: list[tuple[int, list[dict[str, Any]]]] = []
    current: list[dict[str, Any]] = []
    for index, item in enumerate(case["input"]):
        if item.get("marker") == "end_batch":
            batches.append((index, current))
            current = []
        elif "marker" not in item:
            current.append(item)
    if current:
        raise ValueError(f"case {case['id']}: events after the last end_batch")
    return batches


def run_micro_batch(case: dict[str, Any], state_dir: str, runner: Any = SPARK
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    """Returns (outputs, dropped events, the run's count of late drops)."""
    semantics = case["semantics"]
    watermark = semantics["watermark"]
    batches = split_batches(case)
    per_source = watermark.get("scope") == "min_over_sources"
    names = watermark["sources"] if per_source else ["events"]

    def rows_of(events: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        return [_row(e) for e in events if not per_source or e.get("source") == source]

    pipeline = hr.Pipeline(f"case_{case['id']}")
    streams = [pipeline.source(name, TestSource([rows_of(events, name) for _, events in batches], schema=SCHEMA,
                                                flush=False),
                               event_time="event_time", max_out_of_orderness=watermark["delay_ms"])
               for name in names]
    stream = streams[0].union(*streams[1:]) if len(streams) > 1 else streams[0]
    emit = "updates" if semantics["output_mode"] == "update" else "final"
    sink = TestSink()
    (stream.key_by("key").window(WindowShape.from_json(semantics["window"]), name="windows")
     .aggregate(sum=hr.sum("value"), count=hr.count(), emit=emit).sink("out", sink))
    marks: list[tuple[int, int]] = []  # (rows in the sink, batches run) after each step
    last: list[Any] = []  # the run, as the last step left it

    def on_step(run: Any) -> None:
        marks.append((len(sink.rows()), runner.batches_run(run)))
        last[:] = [run]

    runner.run(pipeline, state_dir, on_step)
    rows, outputs, panes, start = sink.rows(), [], Counter[tuple[Any, ...]](), 0
    for (at, _), (end, _) in zip(batches, marks):
        for row in rows[start:end]:
            ident = (row["key"], row["window_start"], row["window_end"])
            outputs.append(_output(row, "update" if emit == "updates" else "on_time", panes[ident], at))
            panes[ident] += 1
        start = end
    late_dropped = runner.late_dropped(last[0]) if last else 0
    watermarks = runner.watermarks(last[0]) if last else []
    return outputs, _dropped_behind_watermark(case, batches, marks, watermarks), late_dropped


def _dropped_behind_watermark(case: dict[str, Any], batches: list[tuple[int, list[dict[str, Any]]]],
                              marks: list[tuple[int, int]], watermarks: list[int]) -> list[dict[str, Any]]:
    shape = WindowShape.from_json(case["semantics"]["window"])
    dropped, first = [], 0
    for (_, events), (_, batches_run) in zip(batches, marks):
        w = watermarks[first] if first < len(watermarks) else 0
        for event in events:
            t = event["event_time"]
            ends = [end for _, end in shape.assign(t)]
            if w > 0 and all(end <= w for end in ends):
                dropped.append(_row(event))
        first = batches_run
    return dropped


# -- comparing ------------------------------------------------------------------------------------

def bag(rows: list[dict[str, Any]], strict: bool = True) -> Counter[str]:
    return Counter(json.dumps({k: v for k, v in r.items() if strict or k != "at"}, sort_keys=True) for r in rows)


def check(case: dict[str, Any], state_dir: str, strict: bool = True, runner: Any = SPARK) -> list[str]:
    """The differences between what headrace emitted and what the case expects (empty: it passes)."""
    problems = []
    expected_dropped = [_row(e) for e in case["expected_dropped"]]
    if case["watermark_model"] == "micro_batch":
        outputs, dropped, late_dropped = run_micro_batch(case, state_dir, runner)
        if late_dropped != len(expected_dropped):
            problems.append(f"the run counted {late_dropped} late drops, the case {len(expected_dropped)}")
    else:
        outputs, dropped = run_per_event(case, state_dir, runner)
    for label, got, want in (("output", bag(outputs, strict), bag(case["expected_output"], strict)),
                             ("dropped", bag(dropped), bag(expected_dropped))):
        problems += [f"missing {label} {row}" for row in sorted((want - got).elements())]
        problems += [f"unexpected {label} {row}" for row in sorted((got - want).elements())]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m headrace.testing.conformance",
                                     description="Run event-time conformance cases through headrace on local Spark.")
    parser.add_argument("cases", help="a JSON file of cases (the shared conformance format)")
    parser.add_argument("--relaxed", action="store_true", help="ignore the 'at' field")
    parser.add_argument("--only", help="run only the case with this id")
    parser.add_argument("--local", action="store_true", help="run the cases with the local runner (no JVM)")
    args = parser.parse_args(argv)
    try:
        cases = json.loads(Path(args.cases).read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {args.cases}: {exc}", file=sys.stderr)
        return 2
    passed = failed = 0
    for case in cases:
        if args.only and case["id"] != args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="headrace-case-") as state:
            try:
                problems = check(case, state, strict=not args.relaxed, runner=LOCAL if args.local else SPARK)
            except Exception as exc:  # noqa: BLE001 - a case that crashes is a failed case
                problems = [f"error: {type(exc).__name__}: {exc}"]
        print(f"{'ok  ' if not problems else 'FAIL'} {case['id']} [{case['watermark_model']}]", flush=True)
        for problem in problems:
            print(f"     {problem}")
        passed, failed = passed + (not problems), failed + bool(problems)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
