"""Admission control: how much input each micro-batch takes, and how far behind the input is.

**Fixed caps.** Every source takes a maximum per micro-batch, in the unit that fits it:
records (``max_records_per_batch``: Kafka, Redis Streams...; the generator's
``rows_per_batch``), files (``max_files_per_batch``: Files, Delta) or bytes (Delta).

**Adaptive.** ``hr.Pipeline(name, batch_duration="2s")`` sizes the batches of headrace's
Python sources so that each takes about that long, as Apex's and Flink's backpressure keep
a slow sink from being flooded: after each batch the runtime sets the next cap to the
records the last batch would have processed in the target duration at the rate it
achieved, moved at most ``STEP``-fold either way and kept within ``[MIN_RECORDS,
MAX_RECORDS]``. The cap reaches the sources through a file in the run directory
(``ADMISSION_FILE``), which a source reads when Spark asks it for its next offset
(``adaptive_cap``); a source's own fixed cap still applies. Spark's Kafka source takes its
cap once, when the query starts, so it keeps its fixed cap.

**Behind.** A source that knows how much it left for later reports it through Spark's
``reportLatestOffset`` as ``{"backlog": n, "unit": "records" | "files"}`` (``backlog``);
Kafka's lag comes from its offsets. The progress line shows ``behind <n> <unit>``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from headrace.durations import to_millis
from headrace.errors import PlanError

ADMISSION_FILE = "admission.json"  # in the run directory: {"max_records": n}
FIRST_RECORDS = 10_000  # the first batch's cap in adaptive mode
MIN_RECORDS = 100
MAX_RECORDS = 10_000_000
STEP = 2.0  # the cap moves at most this factor per batch


def backlog(count: int, unit: str = "records") -> dict[str, Any]:
    """What a source's ``reportLatestOffset`` returns: what it left for later batches."""
    return {"backlog": int(count), "unit": unit}


def adaptive_cap(options: dict[str, str]) -> int | None:
    """The records the runtime admits into the next batch (adaptive mode), or None. Read by
    a source, in Spark's Python worker, from its ``hr_run_dir`` option."""
    run_dir = options.get("hr_run_dir") or ""
    if not run_dir:
        return None
    try:
        with open(os.path.join(run_dir, ADMISSION_FILE)) as handle:
            return int(json.load(handle)["max_records"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def combined_cap(*caps: int | None) -> int | None:
    """The smallest of the caps that are set.

    >>> combined_cap(None, 500, 2_000), combined_cap(None, None)
    (500, None)
    """
    present = [c for c in caps if c is not None]
    return min(present) if present else None


@dataclass(frozen=True)
class BatchDuration:
    """The target duration of a micro-batch, in milliseconds (adaptive admission)."""

    target_ms: int

    @staticmethod
    def of(value: Any, where: str) -> BatchDuration | None:
        if value is None:
            return None
        millis = to_millis(value, f"{where}: batch_duration")
        if millis < 50:
            raise PlanError(f"{where}: batch_duration must be at least 50ms, got {value!r}")
        return BatchDuration(millis)

    def next_cap(self, cap: int, rows: int, batch_ms: int) -> int:
        """The cap after a batch of ``rows`` records that took ``batch_ms``: the records the
        target duration holds at that rate, at most ``STEP``-fold from ``cap``. A batch that
        took fewer records than its cap (the input ran dry) in time leaves the cap as it is.

        >>> d = BatchDuration(1_000)
        >>> d.next_cap(10_000, 10_000, 250), d.next_cap(10_000, 10_000, 4_000), d.next_cap(10_000, 10_000, 1_000)
        (20000, 5000, 10000)
        >>> d.next_cap(10_000, 300, 100)  # the input ran dry: the cap stays
        10000
        """
        if rows <= 0 or batch_ms <= 0 or (rows < cap and batch_ms <= self.target_ms):
            return cap  # idle, or the input ran dry in time: the batch says nothing about a bigger one
        wanted = rows * self.target_ms / batch_ms
        bounded = min(max(wanted, cap / STEP), cap * STEP)
        return int(min(max(bounded, MIN_RECORDS), MAX_RECORDS))


class AdmissionControl:
    """The runtime's side of adaptive admission: after each batch, the next cap, written for
    the sources to read."""

    def __init__(self, duration: BatchDuration, run_dir: str) -> None:
        self.duration = duration
        self.path = os.path.join(run_dir, ADMISSION_FILE)
        self.cap = FIRST_RECORDS
        self._write()

    def batch_done(self, rows: int, batch_ms: int | None) -> None:
        updated = self.duration.next_cap(self.cap, rows, batch_ms or 0)
        if updated != self.cap:
            self.cap = updated
            self._write()

    def _write(self) -> None:
        temporary = self.path + ".tmp"
        with open(temporary, "w") as handle:
            json.dump({"max_records": self.cap}, handle)
        os.replace(temporary, self.path)  # a source never reads half a file
