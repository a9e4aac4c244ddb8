"""``GET /metrics``: each pipeline's figures in Prometheus's text format.

The drivers append each micro-batch's figures to ``progress.jsonl`` in their state dir
(``HEADRACE_PROGRESS_LOG``, ``headrace/runtime/progress.py``); the server reads what each file
gained since the last scrape. Counters add up every batch id once, across the drivers a
pipeline has had: a batch that a killed driver ran and its successor ran again counts once, with
its last report. Names follow Prometheus's rules: one ``headrace_`` prefix, base units
(seconds), ``_total`` for counters; labels ``pipeline``, and ``step`` or ``sink`` for a step's
records (``headrace/spark/step_counts.py``) and a sink's write time.

A rate (records per second, the pipeline's and each step's) is the last batch's while a driver
runs the pipeline (running or draining); a pipeline that is not running has a rate of 0. The
batches are those of the checkpoint's commit log, a rescale's batch (which reads no input and
reports no progress) among them.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from headrace.contract import END_OF_INPUT_MS
from headrace.environment.checkpoints import COMMITS, last_batch
from headrace.server.checkpoint_info import checkpoint_dir
from headrace.server.registry import DRAINING, RUNNING, Entry

COUNTED = ("input_rows", "dead_letters", "late_rows_dropped")
PER_NAME = ("step_records", "sink_ms", "drift_flags")  # figures summed per step or sink
SLOW_SINK_MS = 1000  # a sink slower than this, taking more than half of a batch's time, is drawn red
RECENT_BATCHES = 1000  # batch ids a replay could still run again; older ones are folded into the sums
CHARTED_BATCHES = 120  # the recent batches ``figures`` gives


@dataclass
class _Totals:
    offset: int = 0  # how far the progress file has been read
    folded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
    # each step's records, each sink's write time, each learn step's drift flags: PER_NAME -> name -> sum
    folded_per_name: dict[str, Counter[str]] = field(default_factory=lambda: {key: Counter() for key in PER_NAME})
    recent: dict[int, dict[str, Any]] = field(default_factory=dict)  # batch id -> its figures
    last: dict[str, Any] = field(default_factory=dict)  # the last batch's figures

    def read(self, path: str) -> None:
        try:
            with open(path, "rb") as log:
                log.seek(self.offset)
                data = log.read()
        except FileNotFoundError:
            return
        complete = data[:data.rfind(b"\n") + 1]  # a line being written is read next time
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                figures = json.loads(line)
            except ValueError:
                continue
            if isinstance(figures, dict) and isinstance(figures.get("batch"), int):
                self.recent[figures["batch"]] = figures
                self.last = figures
        for batch in sorted(self.recent)[:-RECENT_BATCHES]:
            figures = self.recent.pop(batch)
            for name in COUNTED:
                self.folded[name] += _count(figures, name)
            for key in PER_NAME:
                self.folded_per_name[key].update(_per_name(figures, key))

    def total(self, name: str) -> int:
        return self.folded[name] + sum(_count(figures, name) for figures in self.recent.values())

    def per_name_totals(self, key: str) -> Counter[str]:
        """Each step's records (``step_records``), each sink's write milliseconds (``sink_ms``) or each learn
        step's drift flags (``drift_flags``), every batch once."""
        total = Counter(self.folded_per_name[key])
        for figures in self.recent.values():
            total.update(_per_name(figures, key))
        return total

    def history(self, batches: int) -> list[dict[str, Any]]:
        return [self.recent[batch] for batch in sorted(self.recent)[-batches:]]


def _count(figures: dict[str, Any], name: str) -> int:
    return int(figures.get(name) or 0)


def _per_name(figures: dict[str, Any], key: str) -> dict[str, int]:
    found = figures.get(key)
    return {str(name): int(value) for name, value in found.items()
            if isinstance(value, int) and not isinstance(value, bool)} if isinstance(found, dict) else {}


def running(entry: Entry) -> bool:
    """Whether a driver runs the pipeline's batches: only then has it a rate."""
    return entry.status in (RUNNING, DRAINING)


def batches_committed(entry: Entry, last: dict[str, Any]) -> int:
    """The batches of the pipeline's checkpoint (its last committed batch id + 1): its commit log's,
    which holds a rescale's batch too, or the last report's when that is further on."""
    checkpoint = checkpoint_dir(entry)
    committed = last_batch(checkpoint, COMMITS) if checkpoint else None
    return max(-1 if committed is None else committed, last.get("batch", -1)) + 1


def step_figures(totals: _Totals, moving: bool = True) -> dict[str, dict[str, Any]]:
    """Each counted step's records (every batch once) and rate in the last batch (0 unless
    ``moving``: the pipeline is not running); each timed sink's write time, in all and in the last
    batch, and whether it is slow: its write took more than half of the last batch's time, and at
    least ``SLOW_SINK_MS``."""
    last = totals.last
    seconds = (last.get("batch_ms") or 0) / 1000
    records, last_records = totals.per_name_totals("step_records"), _per_name(last, "step_records")

    def rate(name: str) -> float | None:
        if not moving:
            return 0
        return round(last_records[name] / seconds, 1) if seconds and name in last_records else None

    steps: dict[str, dict[str, Any]] = {
        name: {"records_total": count, "records_last_batch": last_records.get(name), "records_per_second": rate(name)}
        for name, count in records.items()}
    for name, version in _per_name(last, "model_versions").items():  # a score step's model, in the last batch
        steps.setdefault(name, {})["model_version"] = version
    flags, last_flags = totals.per_name_totals("drift_flags"), _per_name(last, "drift_flags")
    for name, count in flags.items():  # a learn step's drift flags (ADWIN)
        steps.setdefault(name, {}).update({"drift_flags_total": count, "drift_flags_last_batch": last_flags.get(name)})
    written, last_written = totals.per_name_totals("sink_ms"), _per_name(last, "sink_ms")
    for name, milliseconds in written.items():
        took = last_written.get(name)
        steps.setdefault(name, {}).update({
            "write_seconds_total": milliseconds / 1000, "write_ms_last_batch": took,
            "slow": took is not None and took >= SLOW_SINK_MS and took * 2 > (last.get("batch_ms") or 0)})
    return steps


class Metrics:
    """The figures of every pipeline, read incrementally from their progress files."""

    def __init__(self, progress_file: str) -> None:
        self.progress_file = progress_file
        self._totals: dict[str, _Totals] = {}
        self._lock = threading.Lock()

    def _read(self, entry: Entry) -> _Totals:
        totals = self._totals.setdefault(entry.name, _Totals())
        totals.read(os.path.join(entry.state_dir, self.progress_file))
        return totals

    def figures(self, entry: Entry, batches: int = CHARTED_BATCHES) -> dict[str, Any]:
        """One pipeline's totals (each batch id once, and its committed batches), its last batch's
        figures (its rate 0 when it is not running) and its recent batches', oldest first (what the
        web UI charts)."""
        with self._lock:
            totals = self._read(entry)
            moving = running(entry)
            last = totals.last if moving or not totals.last else {**totals.last, "rows_per_second": 0}
            return {"pipeline": entry.name,
                    "totals": {**{name: totals.total(name) for name in COUNTED},
                               "batches": batches_committed(entry, totals.last)},
                    "last": last, "recent": totals.history(batches), "steps": step_figures(totals, moving)}

    def exposition(self, entries: list[Entry], errors: dict[str, int]) -> str:
        """Every pipeline's figures; ``errors``: the errors each one's drivers ended with."""
        families: dict[str, tuple[str, str, list[str]]] = {}

        def add(name: str, kind: str, text: str, pipeline: str, value: float | None, **labels: str) -> None:
            if value is not None:
                named = "".join(f',{label}="{_label(value_of)}"' for label, value_of in labels.items())
                families.setdefault(name, (kind, text, []))[2].append(f'{name}{{pipeline="{_label(pipeline)}"{named}}} '
                                                                       f"{_number(value)}")

        with self._lock:
            for entry in entries:
                totals = self._read(entry)
                last, name = totals.last, entry.name
                moving = running(entry)
                add("headrace_pipeline_running", "gauge", "1 while the pipeline's driver runs", name, int(moving))
                add("headrace_driver_restarts_total", "counter", "drivers the server restarted after they died",
                    name, entry.restarts)
                add("headrace_exceptions_total", "counter", "errors its drivers ended with", name,
                    errors.get(name, 0))
                add("headrace_batches_total", "counter", "micro-batches committed (the last batch id + 1)", name,
                    batches_committed(entry, last))
                add("headrace_input_records_total", "counter", "records read from the sources", name,
                    totals.total("input_rows"))
                add("headrace_dead_letters_total", "counter", "records that went to the dead letters", name,
                    totals.total("dead_letters"))
                add("headrace_late_records_dropped_total", "counter", "records dropped as later than the watermark",
                    name, totals.total("late_rows_dropped"))
                for step, count in sorted(totals.per_name_totals("step_records").items()):
                    add("headrace_step_records_total", "counter", "records a step handed on", name, count, step=step)
                for step, count in sorted(totals.per_name_totals("drift_flags").items()):
                    add("headrace_drift_flags_total", "counter", "records a learn step flagged as drift (ADWIN)", name,
                        count, step=step)
                for step, version in sorted(_per_name(last, "model_versions").items()):
                    add("headrace_model_version", "gauge", "the model version a score step scored the last "
                        "micro-batch with", name, version, step=step)
                for sink, milliseconds in sorted(totals.per_name_totals("sink_ms").items()):
                    add("headrace_sink_write_seconds_total", "counter", "time a sink took to write its batches", name,
                        milliseconds / 1000, sink=sink)
                if last:
                    add("headrace_batch_duration_seconds", "gauge", "the last micro-batch's duration", name,
                        last["batch_ms"] / 1000 if last.get("batch_ms") is not None else None)
                    add("headrace_input_records_per_second", "gauge", "the last micro-batch's processing rate "
                        "(0 when the pipeline is not running)", name, last.get("rows_per_second") if moving else 0)
                    add("headrace_watermark_timestamp_seconds", "gauge", "the event-time watermark", name,
                        _epoch(last.get("watermark")))
                    add("headrace_state_rows", "gauge", "rows in the stateful steps' state", name,
                        last.get("state_rows"))
                    add("headrace_state_memory_bytes", "gauge", "memory of the stateful steps' state stores", name,
                        last.get("state_memory_bytes"))
                    add("headrace_watermark_lag_seconds", "gauge", "how far the watermark was behind the clock "
                        "when the last micro-batch ended", name, _watermark_lag(last))
                    add("headrace_source_lag_records", "gauge", "records the sources left for later batches",
                        name, last.get("lag"))
                    add("headrace_last_batch_timestamp_seconds", "gauge", "when the last micro-batch ended", name,
                        last.get("at"))
        lines = []
        for name, (kind, text, samples) in families.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _watermark_lag(figures: dict[str, Any]) -> float | None:
    """When the batch ended less its watermark, in seconds (None without a watermark, or past the
    end of a bounded input)."""
    watermark, ended = _epoch(figures.get("watermark")), figures.get("at")
    if watermark is None or not isinstance(ended, (int, float)) or watermark * 1000 >= END_OF_INPUT_MS:
        return None
    return round(ended - watermark, 3)


def _epoch(moment: Any) -> float | None:
    """Spark's watermark (``2026-01-01T10:00:00.000Z``) in seconds since the epoch."""
    if not isinstance(moment, str):
        return None
    parsed = datetime.datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return parsed.timestamp() if parsed.year > 1970 else None
