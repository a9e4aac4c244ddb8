"""What the benchmarks share: timing from progress reports, CPU seconds, run order, work folders.

Each benchmark runs headrace and a hand-written PySpark pipeline in the same process, on
headrace's Spark session, and measures both the same way with these helpers.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

Print = Callable[[str], None]


def _epoch(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def processing_seconds(progress: list[dict[str, Any]]) -> float:
    """From the start of the first micro-batch to the end of the last one that read input."""
    with_input = [p for p in progress if (p.get("numInputRows") or 0) > 0]
    if not with_input:
        raise RuntimeError("no micro-batch read any input")
    first = min(_epoch(p["timestamp"]) for p in progress)
    last = max(_epoch(p["timestamp"]) + p["durationMs"]["triggerExecution"] / 1000 for p in with_input)
    return last - first


def output_rows(progress: list[dict[str, Any]]) -> int:
    """The rows the sink received, over every micro-batch (Spark's ``sink.numOutputRows``)."""
    counts = [(p.get("sink") or {}).get("numOutputRows", -1) for p in progress]
    if any(count is None or count < 0 for count in counts):
        raise RuntimeError("the sink did not report its output rows")
    return sum(counts)


class CpuClock:
    """CPU seconds used by this process and by Spark's JVM with all its Python workers.

    Other programs on the machine slow a run down without changing how much CPU it needs,
    so events per CPU second is a second, contention-proof view of throughput. Linux only
    (``/proc``); elsewhere it counts this process alone.
    """

    def __init__(self, spark: SparkSession) -> None:
        try:
            self.jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
        except Exception:  # noqa: BLE001 - no JVM handle (e.g. Spark Connect): no CPU figures
            self.jvm_pid = 0
        self.tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def seconds(self) -> float:
        own = os.times()
        total = own.user + own.system
        if not self.jvm_pid or not os.path.isdir("/proc"):
            return total
        return total + tree_ticks(self.jvm_pid) / self.tick


def tree_ticks(root: int) -> int:
    """The CPU ticks of process ``root`` and of every process below it (their reaped children's too)."""
    stats = process_stats()
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    todo, ticks = [root], 0
    while todo:
        pid = todo.pop()
        ticks += stats.get(pid, (0, 0, 0))[1]
        todo.extend(children.get(pid, ()))
    return ticks


def process_stats() -> dict[int, tuple[int, int, int]]:
    """Every process in /proc: pid -> (parent pid, CPU ticks with its reaped children, its own CPU ticks)."""
    stats: dict[int, tuple[int, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        stats[int(entry)] = (int(fields[1]), sum(int(v) for v in fields[11:15]), int(fields[11]) + int(fields[12]))
    return stats


@dataclass
class Throughput:
    events: int
    seconds: float
    batches: int
    cpu_seconds: float = 0.0
    load: float = 0.0  # the machine's 1-minute load average at the end of the run
    output_rows: int = -1  # rows written to the sink, when the benchmark counts them

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_rate(self) -> float:
        return self.events / self.cpu_seconds if self.cpu_seconds else 0.0


def fresh_dir(workdir: str, name: str) -> str:
    """An empty folder ``workdir/name`` (emptied if it was there)."""
    path = os.path.join(workdir, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def alternating(pipelines: Sequence[str], runs: int) -> list[tuple[str, ...]]:
    """The order of the pipelines in each run: as given, then reversed, ...: none always goes first."""
    return [tuple(pipelines) if number % 2 == 0 else tuple(pipelines[::-1]) for number in range(runs)]
