"""How long each sink took to write each micro-batch, for the progress figures (``sink_ms``) and
the server's figures of each sink: measured in ``foreachBatch`` (``headrace/spark/writer.py``),
where the driver hands the batch to each sink in turn, and taken with the batch's progress report
(``headrace/runtime/progress.py``), which Spark sends after the batch. A sink Spark's own writer
writes (a native sink alone in its query) writes inside Spark's batch and is not timed.

Imports nothing of PySpark: the driver's progress code reads it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

KEEP = 1000  # batches whose report never came (a query stopped meanwhile) are forgotten after this many
_lock = threading.Lock()
_timings: OrderedDict[tuple[str, int], dict[str, int]] = OrderedDict()


def record(query: str, batch: int, sink: str, milliseconds: int) -> None:
    with _lock:
        _timings.setdefault((query, batch), {})[sink] = milliseconds
        while len(_timings) > KEEP:
            _timings.popitem(last=False)


def take(query: str, batch: int) -> dict[str, int]:
    """The sinks' write times of the query's batch, in milliseconds, forgotten once taken.

    >>> record("q", 3, "pg", 120); take("q", 3), take("q", 3)
    ({'pg': 120}, {})
    """
    with _lock:
        return _timings.pop((query, batch), {})
