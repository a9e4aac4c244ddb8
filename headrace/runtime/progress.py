"""The live progress display: one line, JSON lines, or nothing."""

from __future__ import annotations

import json
import sys
from typing import Any, TextIO

DEAD_LETTER_METRIC_PREFIX = "hr_dead_letters_"  # + source: records a source sent to its dead letters
LATE_METRIC_PREFIX = "hr_late_"  # + step: late records a window processor dropped


def _observed(progress: dict[str, Any], prefix: str, field: str) -> int:
    observed = progress.get("observedMetrics") or {}
    return sum(int(row[field] or 0) for name, row in observed.items() if name.startswith(prefix) and row is not None)


def summarise(progress: dict[str, Any]) -> dict[str, Any]:
    """The figures headrace shows, read from one Spark progress report. Late records dropped
    are Spark's (native windows) plus those the window processors report."""
    state_rows = sum(op.get("numRowsTotal", 0) for op in progress.get("stateOperators", []))
    dropped = sum(op.get("numRowsDroppedByWatermark", 0) for op in progress.get("stateOperators", []))
    dropped += _observed(progress, LATE_METRIC_PREFIX, "late_dropped")
    dead = _observed(progress, DEAD_LETTER_METRIC_PREFIX, "dead_letters")
    return {
        "batch": progress.get("batchId"),
        "input_rows": progress.get("numInputRows", 0),
        "rows_per_second": round(progress.get("processedRowsPerSecond") or 0.0, 1),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "state_rows": state_rows,
        "late_rows_dropped": dropped,
        "dead_letters": dead,
        "batch_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
    }


class ProgressDisplay:
    """Prints each new batch's figures; ``mode`` is ``line``, ``json`` or ``quiet``."""

    def __init__(self, mode: str = "line", stream: TextIO | None = None) -> None:
        self.mode = mode
        self.stream = stream or (sys.stdout if mode == "json" else sys.stderr)
        self.last_batch: int | None = None
        self.totals = {"dead_letters": 0, "late_rows_dropped": 0, "input_rows": 0}
        self.interactive = self.stream.isatty()

    def update(self, progress: dict[str, Any] | None) -> None:
        if not progress or progress.get("batchId") == self.last_batch:
            return
        self.last_batch = progress.get("batchId")
        figures = summarise(progress)
        for name in self.totals:
            self.totals[name] += figures[name] or 0
        if self.mode == "quiet":
            return
        if self.mode == "json":
            self.stream.write(json.dumps({**figures, "total_dead_letters": self.totals["dead_letters"]}) + "\n")
        else:
            line = (f"batch {figures['batch']} | {figures['rows_per_second']:,.0f} rows/s | "
                    f"watermark {figures['watermark'] or '-'} | state rows {figures['state_rows']} | "
                    f"dead letters {self.totals['dead_letters']} | late dropped {self.totals['late_rows_dropped']}")
            self.stream.write(("\r" + line.ljust(110)) if self.interactive else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.mode == "line" and self.interactive:
            self.stream.write("\n")
            self.stream.flush()
