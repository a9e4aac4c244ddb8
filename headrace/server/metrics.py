"""``GET /metrics``: each pipeline's figures in Prometheus's text format.

The drivers append each micro-batch's figures to ``progress.jsonl`` in their state dir
(``HEADRACE_PROGRESS_LOG``, ``headrace/runtime/progress.py``); the server reads what each file
gained since the last scrape. Counters add up every batch id once, across the drivers a
pipeline has had: a batch that a killed driver ran and its successor ran again counts once, with
its last report. Names follow Prometheus's rules: one ``headrace_`` prefix, base units
(seconds), ``_total`` for counters; the one label is ``pipeline``.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from headrace.contract import END_OF_INPUT_MS
from headrace.server.registry import DRAINING, RUNNING, Entry

COUNTED = ("input_rows", "dead_letters", "late_rows_dropped")
RECENT_BATCHES = 1000  # batch ids a replay could still run again; older ones are folded into the sums
CHARTED_BATCHES = 120  # the recent batches ``figures`` gives


@dataclass
class _Totals:
    offset: int = 0  # how far the progress file has been read
    folded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTED, 0))
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

    def total(self, name: str) -> int:
        return self.folded[name] + sum(_count(figures, name) for figures in self.recent.values())

    def history(self, batches: int) -> list[dict[str, Any]]:
        return [self.recent[batch] for batch in sorted(self.recent)[-batches:]]


def _count(figures: dict[str, Any], name: str) -> int:
    return int(figures.get(name) or 0)


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
        """One pipeline's totals (each batch id once), its last batch's figures and its recent
        batches', oldest first (what the web UI charts)."""
        with self._lock:
            totals = self._read(entry)
            return {"pipeline": entry.name, "totals": {name: totals.total(name) for name in COUNTED},
                    "last": totals.last, "recent": totals.history(batches)}

    def exposition(self, entries: list[Entry], errors: dict[str, int]) -> str:
        """Every pipeline's figures; ``errors``: the errors each one's drivers ended with."""
        families: dict[str, tuple[str, str, list[str]]] = {}

        def add(name: str, kind: str, text: str, pipeline: str, value: float | None) -> None:
            if value is not None:
                families.setdefault(name, (kind, text, []))[2].append(f'{name}{{pipeline="{_label(pipeline)}"}} '
                                                                       f"{_number(value)}")

        with self._lock:
            for entry in entries:
                totals = self._read(entry)
                last, name = totals.last, entry.name
                add("headrace_pipeline_running", "gauge", "1 while the pipeline's driver runs", name,
                    int(entry.status in (RUNNING, DRAINING)))
                add("headrace_driver_restarts_total", "counter", "drivers the server restarted after they died",
                    name, entry.restarts)
                add("headrace_exceptions_total", "counter", "errors its drivers ended with", name,
                    errors.get(name, 0))
                add("headrace_batches_total", "counter", "micro-batches committed (the last batch id + 1)", name,
                    last["batch"] + 1 if last else 0)
                add("headrace_input_records_total", "counter", "records read from the sources", name,
                    totals.total("input_rows"))
                add("headrace_dead_letters_total", "counter", "records that went to the dead letters", name,
                    totals.total("dead_letters"))
                add("headrace_late_records_dropped_total", "counter", "records dropped as later than the watermark",
                    name, totals.total("late_rows_dropped"))
                if last:
                    add("headrace_batch_duration_seconds", "gauge", "the last micro-batch's duration", name,
                        last["batch_ms"] / 1000 if last.get("batch_ms") is not None else None)
                    add("headrace_input_records_per_second", "gauge", "the last micro-batch's processing rate", name,
                        last.get("rows_per_second"))
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
