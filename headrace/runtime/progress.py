"""What a run reports: Spark's progress report of each micro-batch, the figures headrace
reads from it, the run's totals, and the live display (one line, JSON lines, or nothing).

A *batch* is a micro-batch Spark ran: it has a batch id, and Spark sends one progress event
for it when it ends. A batch counts whether or not it read rows (a batch can run only to move
the watermark and fire windows); Spark's idle reports, sent while a query waits for data, run
nothing and are not batches. A batch id Spark runs again after a restart is counted once (its
last report stands). *Input rows* are the records the sources handed over, not counting the
control rows headrace's sources add (watermark moves, the end-of-input flush): Spark's
``numInputRows`` counts those, and each source's ``hr_control_<source>`` metric says how many
to take off. A source that feeds several branches of the query (a stateful step and its dead
letters) is scanned once per branch, and Spark counts its rows in each; its
``hr_repeat_<source>`` metric says how many of those counts to take off.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from headrace import config
from headrace.contract import (
    CONTROL_METRIC_PREFIX,
    DEAD_LETTER_METRIC_PREFIX,
    DRIFT_METRIC_PREFIX,
    LATE_METRIC_PREFIX,
    RECORDS_FIELD,
    REPEAT_METRIC_PREFIX,
    STEP_METRIC_PREFIX,
    flush_rows,
)
from headrace.spark import marked_counts, sink_timings
from headrace.spark.marked_counts import GOOD_ROWS, MarkedStep

TOTALS = ("input_rows", "dead_letters", "late_rows_dropped")


def _observed(progress: dict[str, Any], prefix: str, field: str) -> int:
    observed = progress.get("observedMetrics") or {}
    return sum(int(row.get(field) or 0) for name, row in observed.items() if name.startswith(prefix) and row)


def _partition_offsets(offset: Any) -> dict[tuple[str, str], int] | None:
    """A Kafka-shaped offset ({topic: {partition: offset}}, or its JSON text) as
    {(topic, partition): offset}; None for any other shape."""
    if isinstance(offset, str):
        try:
            offset = json.loads(offset)
        except ValueError:
            return None
    if not isinstance(offset, dict) or not offset:
        return None
    positions = {}
    for topic, partitions in offset.items():
        if not isinstance(partitions, dict):
            return None
        for partition, position in partitions.items():
            if not isinstance(position, int) or isinstance(position, bool):
                return None
            positions[(topic, partition)] = position
    return positions


def lag(source: dict[str, Any]) -> tuple[int, str] | None:
    """What a source had beyond what the batch read, when Spark planned it, and its unit: a
    Python source's reported backlog (``headrace/environment/admission.py``), or a partitioned
    source's (Kafka's) latest offsets minus the batch's end offsets. None when unknown.

    >>> lag({"latestOffset": '{"backlog": 3, "unit": "files"}'})
    (3, 'files')
    >>> lag({"latestOffset": {"t": {"0": 10}}, "endOffset": {"t": {"0": 4}}})
    (6, 'records')
    """
    reported = source.get("latestOffset")
    if isinstance(reported, str):
        try:
            reported = json.loads(reported)
        except ValueError:
            reported = None
    if isinstance(reported, dict) and isinstance(reported.get("backlog"), int):
        return reported["backlog"], str(reported.get("unit", "records"))
    latest, end = _partition_offsets(source.get("latestOffset")), _partition_offsets(source.get("endOffset"))
    if latest is None or end is None:
        return None
    return sum(max(0, position - end.get(partition, 0)) for partition, position in latest.items()), "records"


def summarise(progress: dict[str, Any]) -> dict[str, Any]:
    """The figures headrace shows, read from one Spark progress report. Late records dropped
    are Spark's (native windows) plus those the window processors report."""
    state_rows = sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators", []))
    dropped = sum(op.get("numRowsDroppedByWatermark", 0) for op in progress.get("stateOperators", []))
    dropped += _observed(progress, LATE_METRIC_PREFIX, "late_dropped")
    repeated = _observed(progress, REPEAT_METRIC_PREFIX, "repeated_rows")
    rows = (progress.get("numInputRows") or 0) - control_rows(progress) - repeated
    durations = progress.get("durationMs") or {}
    batch_ms = durations.get("triggerExecution")
    lags = [behind for behind in map(lag, progress.get("sources") or ()) if behind is not None]
    records, files = [n for n, unit in lags if unit == "records"], [n for n, unit in lags if unit == "files"]
    return {
        "batch": progress.get("batchId"),
        "input_rows": rows,
        "rows_per_second": round(rows * 1000 / batch_ms, 1) if batch_ms else 0.0,
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "state_rows": state_rows,
        "late_rows_dropped": dropped,
        "dead_letters": _observed(progress, DEAD_LETTER_METRIC_PREFIX, "dead_letters"),
        "batch_ms": batch_ms,
        "lag": sum(records) if records else None,  # records the sources left for later batches
        "lag_files": sum(files) if files else None,
        # where the batch's time went, by Spark's phases (planning, running the batch, commits)
        "phases_ms": {phase: ms for phase, ms in durations.items() if phase != "triggerExecution"},
        "state_memory_bytes": sum(op.get("memoryUsedBytes", 0) for op in progress.get("stateOperators", [])),
        # each stateful operator's, in Spark's order (its state operators' ids)
        "state_operators": [{"operator": op.get("operatorName"), "rows": op.get("numRowsTotal", 0),
                             "memory_bytes": op.get("memoryUsedBytes", 0)}
                            for op in progress.get("stateOperators", [])],
        "step_records": step_records(progress),
        # each learn step's records flagged as drift (ADWIN), in the batch
        "drift_flags": _per_step(progress, DRIFT_METRIC_PREFIX, "drift_flags"),
    }


def control_rows(progress: dict[str, Any]) -> int:
    """The control rows the pipeline's sources handed over in the batch, all sources together."""
    control = _observed(progress, CONTROL_METRIC_PREFIX, "control_rows")
    control += _observed(progress, DEAD_LETTER_METRIC_PREFIX, "control_rows")  # counted with the dead letters
    return control + sum(flush_rows(s.get("startOffset"), s.get("endOffset")) for s in progress.get("sources") or ())


def _per_step(progress: dict[str, Any], prefix: str, field: str) -> dict[str, int]:
    observed = progress.get("observedMetrics") or {}
    return {name[len(prefix):]: int((row or {}).get(field) or 0) for name, row in observed.items()
            if name.startswith(prefix)}


def step_records(progress: dict[str, Any]) -> dict[str, int]:
    """The records each counted step handed on in the batch (``headrace/spark/step_counts.py``),
    and those each source read in a pipeline with several, in its step metric or beside its dead
    letters or control rows.

    >>> step_records({"observedMetrics": {"hr_step_parse": {"records": 7}, "hr_late_w": {"late_dropped": 1},
    ...                                   "hr_dead_letters_bids": {"dead_letters": 1, "records": 9}}})
    {'parse': 7, 'bids': 9}
    """
    observed = progress.get("observedMetrics") or {}
    counted = {}
    for name, row in observed.items():
        for prefix in (STEP_METRIC_PREFIX, DEAD_LETTER_METRIC_PREFIX, CONTROL_METRIC_PREFIX):
            if name.startswith(prefix) and row and RECORDS_FIELD in row:
                counted[name[len(prefix):]] = int(row[RECORDS_FIELD] or 0)
    return counted


class BatchLog:
    """The batches of one run, by batch id, with their figures and the run's totals. A pipeline's
    one source (of ``sources``) has its records among the steps': the batch's input rows. Each
    marked step (``marks``, set once the query is compiled) has its marker's rows less the control
    rows among them. Each step of ``same_as_output`` ((step, its consumer)) has its consumer's
    records, and each of ``same_as_input`` ((step, its input), in the plan's order) its input's, a
    source's less its dead letters (``headrace/spark/step_counts.py``)."""

    def __init__(self, sources: Sequence[str] = (), same_as_input: Sequence[tuple[str, str]] = (),
                 same_as_output: Sequence[tuple[str, str]] = ()) -> None:
        self.sources = set(sources)
        self.only_source = sources[0] if len(sources) == 1 else None
        self.same_as_input = list(same_as_input)
        self.same_as_output = list(same_as_output)
        self.marks: dict[int, MarkedStep] = {}
        self._reports: dict[int, dict[str, Any]] = {}
        self._figures: dict[int, dict[str, Any]] = {}
        self._totals = dict.fromkeys(TOTALS, 0)

    def record(self, progress: dict[str, Any]) -> dict[str, Any]:
        """Keep one batch's progress report (a later report of the same batch id replaces an
        earlier one) and return its figures."""
        batch = int(progress["batchId"])
        figures = {**summarise(progress), "sink_ms": sink_timings.take(str(progress.get("name") or ""), batch)}
        if self.only_source is not None:
            figures["step_records"] = {self.only_source: figures["input_rows"], **figures["step_records"]}
        dead_by_source = self._add_marked(figures, progress)
        self._follow_inputs(figures["step_records"], progress, dead_by_source)
        replaced = self._figures.get(batch, {})
        for name in TOTALS:
            self._totals[name] += (figures[name] or 0) - (replaced.get(name) or 0)
        self._reports[batch], self._figures[batch] = progress, figures
        return figures

    def _add_marked(self, figures: dict[str, Any], progress: dict[str, Any]) -> dict[str, int]:
        """Add the records of each marked step, and of the steps fused before one that hand on
        as many records as their next step does; a source whose marker counts its good rows has
        its dead letters added to the batch's. Returns the dead letters, by source, of those."""
        records = figures["step_records"]
        dead: dict[str, int] = {}
        rows = marked_counts.take(str(progress.get("name") or ""), int(progress["batchId"]))
        control = control_rows(progress)
        for position, passed in rows.items():
            if position not in self.marks:
                continue
            step, copies, counts = self.marks[position]
            if counts == GOOD_ROWS:  # the pipeline's one source: its records are the batch's input rows
                dead[step] = figures["input_rows"] - passed
            else:
                records[step] = passed - copies * control
        figures["dead_letters"] += sum(dead.values())
        for step, consumer in self.same_as_output:
            if consumer in records and step not in records:
                records[step] = records[consumer]
        return dead

    def _follow_inputs(self, records: dict[str, int], progress: dict[str, Any], dead_by_source: dict[str, int]) -> None:
        """Add the records of each step that hands on its input's one for one: a source's less
        its dead letters (unknown in a batch whose marker count did not come)."""
        observed = progress.get("observedMetrics") or {}
        by_good_rows = {mark.step for mark in tuple(self.marks.values()) if mark.counts == GOOD_ROWS}
        for step, upstream in self.same_as_input:
            if upstream not in records or step in records:
                continue
            dead = 0
            if upstream in by_good_rows:
                if upstream not in dead_by_source:
                    continue
                dead = dead_by_source[upstream]
            elif upstream in self.sources:
                dead = int((observed.get(f"{DEAD_LETTER_METRIC_PREFIX}{upstream}") or {}).get("dead_letters") or 0)
            records[step] = records[upstream] - dead

    def __len__(self) -> int:
        return len(self._reports)

    @property
    def reports(self) -> list[dict[str, Any]]:
        """Spark's progress reports, one per batch, in batch order."""
        return [self._reports[batch] for batch in sorted(self._reports)]

    @property
    def figures(self) -> list[dict[str, Any]]:
        """headrace's figures of each batch (what the progress log holds), in batch order."""
        return [self._figures[batch] for batch in sorted(self._figures)]

    def totals(self) -> dict[str, int]:
        return dict(self._totals)


class ProgressDisplay:
    """Prints each batch's figures and each restart; ``mode`` is ``line``, ``json`` or ``quiet``."""

    def __init__(self, mode: str = "line", stream: TextIO | None = None) -> None:
        self.mode = mode
        self.stream = stream or (sys.stdout if mode == "json" else sys.stderr)
        self.interactive = self.stream.isatty()
        self.log_path = config.PROGRESS_LOG.get()  # every batch's figures as JSON lines, whatever the mode

    def started(self) -> None:
        """The query started (its plan and checkpoint accepted): noted in the progress log, where the
        server sees that a driver it started is under way (``headrace/server/operations.py``)."""
        if self.log_path:
            self._log({"started": True, "at": round(time.time(), 3)})

    def batch(self, figures: dict[str, Any], totals: dict[str, int], restarts: int) -> None:
        if self.log_path:
            self._log({**figures, **{f"total_{name}": value for name, value in totals.items()}, "restarts": restarts,
                       "at": round(time.time(), 3)})
        if self.mode == "json":
            self._write(json.dumps({**figures, "total_dead_letters": totals["dead_letters"], "restarts": restarts}))
        elif self.mode == "line":
            line = (f"batch {figures['batch']} | {figures['rows_per_second']:,.0f} rows/s | "
                    f"watermark {figures['watermark'] or '-'} | state rows {figures['state_rows']} | "
                    f"dead letters {totals['dead_letters']} | late dropped {totals['late_rows_dropped']}")
            line += f" | lag {figures['lag']:,} records" if figures.get("lag") is not None else ""
            line += f" | lag {figures['lag_files']:,} files" if figures.get("lag_files") is not None else ""
            line += f" | restarts {restarts}" if restarts else ""
            self._write(line, in_place=True)

    def backfilled(self, last_batch: int | None) -> None:
        """A backfill read what the sources held; the pipeline goes on live."""
        text = (f"backfill done: the history read up to batch {last_batch}; now live" if last_batch is not None
                else "backfill done: no history to read; now live")
        if self.log_path:
            self._log({"backfilled_to": last_batch, "at": round(time.time(), 3)})
        if self.mode == "json":
            self._write(json.dumps({"backfilled_to": last_batch}))
        elif self.mode == "line":
            self._write(text)

    def restart(self, number: int, policy: str, delay_s: float, error: Exception) -> None:
        """A failed query about to be restarted from its checkpoint."""
        if self.mode == "json":
            self._write(json.dumps({"restart": {"number": number, "policy": policy, "delay_s": delay_s,
                                                "error": str(error)}}))
        elif self.mode == "line":
            self._write(f"restart {number} ({policy}) in {delay_s:g} s after: {error}")

    def _log(self, figures: dict[str, Any]) -> None:
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(figures) + "\n")

    def _write(self, text: str, in_place: bool = False) -> None:
        """One line; on a terminal the batch line is rewritten in place and other lines go below it."""
        if not (self.interactive and self.mode == "line"):
            self.stream.write(text + "\n")
        elif in_place:
            self.stream.write("\r" + text.ljust(110))
        else:
            self.stream.write("\n" + text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.mode == "line" and self.interactive:
            self.stream.write("\n")
            self.stream.flush()
