"""A sink that discards every record: the pipeline runs in full, nothing is written.

Use it to measure a pipeline without the cost of an output system.
"""

from __future__ import annotations

from typing import Any

from headrace.contract import Guarantee, SinkConnector


class Null(SinkConnector):
    """Discard every row, after computing it.

    As a pipeline's only sink it is Spark's ``noop`` writer; through
    ``write_batch`` it runs the batch into the same writer, so the batch is
    computed exactly as it would be for a real sink. Nothing is written, so the
    guarantee is exactly-once (vacuously).

    >>> Null().describe()
    {'type': 'Null'}
    """

    guarantee = Guarantee.EXACTLY_ONCE
    native_format = "noop"
    reads_batch_once = True  # Spark's noop writer, one action

    def write_batch(self, df: Any, batch_id: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    def __repr__(self) -> str:
        return "Null()"
