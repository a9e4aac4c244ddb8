"""The windows of a Storm-style windowed bolt: which tuples each activation holds. Free of Spark.

A ``WindowBuffer`` is part of one bolt task's state (it is pickled with the bolt after every
streaming window). Two kinds of windows:

* **Count windows** (length ``L`` tuples, sliding every ``S`` tuples): every ``S``-th tuple the
  task receives activates the window of the last ``L`` tuples, in arrival order. Tumbling:
  ``S = L``.
* **Duration windows** (length ``D`` ms, sliding every ``S`` ms): windows are ``[e - D, e)`` for
  every ``e`` that is a multiple of ``S`` (aligned to the epoch, like headrace's sliding
  windows); the window ending at ``e`` activates once the watermark reaches ``e``, if it holds
  a tuple. On **event time** a tuple's time is its timestamp field, the watermark is the
  smallest of the input streams' largest timestamps minus the lag, advanced after each
  streaming window, and a tuple older than the watermark when it arrives is late: it joins no
  window. On **processing time** a tuple's time is its streaming window's processing time and
  the watermark is that time, so no tuple is late.

Each activation lists the window's tuples, those new since the previous activation, and those
evicted since then (Storm's ``get``, ``get_new`` and ``get_expired``).

>>> buffer = WindowBuffer(WindowConfig(length=3, length_counts=True, interval=2, interval_counts=True))
>>> [a.tuples for n in range(1, 6) for a in buffer.add(n, now=0)]
[[1, 2], [2, 3, 4]]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LATE = None  # what ``WindowBuffer.add`` returns for a late tuple


@dataclass(frozen=True)
class WindowConfig:
    """A windowed bolt's window: lengths in tuples (``*_counts``) or milliseconds."""

    length: int
    length_counts: bool
    interval: int
    interval_counts: bool
    timestamp_field: str | None = None
    lag_ms: int = 0
    late_stream: str | None = None

    @property
    def event_time(self) -> bool:
        return self.timestamp_field is not None


@dataclass
class Activation:
    """One window handed to ``execute``: its tuples, those new and those expired since the
    previous activation; ``start``/``end`` (ms) for duration windows."""

    tuples: list[Any]
    new: list[Any]
    expired: list[Any]
    start: int | None = None
    end: int | None = None


@dataclass
class WindowBuffer:
    config: WindowConfig
    entries: list[tuple[int, int, Any]] = field(default_factory=list)  # (arrival number, time ms, tuple)
    arrivals: int = 0
    since_activation: int = 0  # tuples since the last count activation
    expired: list[Any] = field(default_factory=list)  # evicted since the last activation
    previous: set[int] = field(default_factory=set)  # arrival numbers in the last activated window
    latest: dict[str, int] = field(default_factory=dict)  # input stream -> largest event time seen
    watermark: int | None = None
    fired_end: int | None = None  # the end of the last duration window activated
    late: int = 0  # late tuples so far

    def add(self, item: Any, *, now: int, time: int | None = None, stream: str = "") -> list[Activation] | None:
        """Take one tuple; the activations it causes (count windows), or ``LATE``."""
        config = self.config
        if config.length_counts:
            self.entries.append((self.arrivals, now, item))
            self.arrivals += 1
            while len(self.entries) > config.length:
                self.expired.append(self.entries.pop(0)[2])
            self.since_activation += 1
            if self.since_activation < config.interval:
                return []
            self.since_activation = 0
            activation = self._activate([e for e in self.entries], None, None)
            return [activation] if activation is not None else []
        moment = now if time is None else time
        if config.event_time:
            if self.watermark is not None and moment < self.watermark:
                self.late += 1
                return LATE
            self.latest[stream] = max(self.latest.get(stream, moment), moment)
        self.entries.append((self.arrivals, moment, item))
        self.arrivals += 1
        return []

    def advance(self, now: int) -> list[Activation]:
        """The end of a streaming window at processing time ``now``: move the watermark and
        activate every duration window it passed."""
        if self.config.length_counts:
            return []
        if self.config.event_time:
            if not self.latest:
                return []
            mark = min(self.latest.values()) - self.config.lag_ms
        else:
            mark = now
        self.watermark = mark if self.watermark is None else max(self.watermark, mark)
        return self._fire(self.watermark)

    def flush(self) -> list[Activation]:
        """The input ended: activate every duration window still holding tuples."""
        if self.config.length_counts or not self.entries:
            return []
        return self._fire(max(moment for _, moment, _ in self.entries) + self.config.length)

    def _fire(self, limit: int) -> list[Activation]:
        length, every = self.config.length, self.config.interval
        ends: set[int] = set()
        for _, moment, _ in self.entries:
            end = (moment // every + 1) * every  # the first window end after the tuple
            while end <= moment + length and end <= limit:
                if self.fired_end is None or end > self.fired_end:
                    ends.add(end)
                end += every
        activations = []
        for end in sorted(ends):
            start = end - length
            self.expired.extend(item for _, moment, item in self.entries if moment < start)
            self.entries = [entry for entry in self.entries if entry[1] >= start]
            activation = self._activate([entry for entry in self.entries if entry[1] < end], start, end)
            if activation is not None:
                activations.append(activation)
            self.fired_end = end
        return activations

    def _activate(self, window: list[tuple[int, int, Any]], start: int | None, end: int | None) -> Activation | None:
        expired, self.expired = self.expired, []
        previous, self.previous = self.previous, {number for number, _, _ in window}
        if not window:
            return None
        return Activation([e[2] for e in window], [e[2] for e in window if e[0] not in previous], expired, start, end)
