"""Socket: a TCP client that reads lines of text (like ``nc -lk 9999`` on the other end).

Records are ``line string`` plus ``received_at timestamp``, the ingestion time
at which the line's bytes arrived (one stamp per network read). Lines are split
on ``\\n`` (a trailing ``\\r`` is dropped; bytes that are not UTF-8 become U+FFFD).

How it works: Spark calls ``latestOffset`` on the driver, in one long-lived
Python process per query; the first call starts a background thread there that
connects to ``host:port`` (retrying for ``connect_timeout`` seconds) and
buffers the lines it receives in memory. Each ``latestOffset`` call spills the
buffered lines to an Arrow file under ``<hr_run_dir>/socket/<hr_source>/`` and
returns the count of lines received so far, ``{"lines": n}``; ``read`` (in an
executor's Python worker, another process) reads lines ``[start, end)`` back
from those files, and ``commit`` deletes the files Spark no longer needs.
Re-reading an offset range that was spilled returns the same lines.

Guarantee: **at-most-once**. Lines received but not yet spilled are lost when
the driver process dies or the pipeline stops, and a socket cannot be asked to
send them again.

End of input: the source is unbounded, but when the peer closes (or resets)
the connection the source treats it as the end of its input: it emits a flush
control row and writes the exhausted marker, so ``nc``-style demos and tests
terminate and every open window fires. It does not reconnect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headrace.contract import Guarantee, SourceConnector
from headrace.errors import PlanError
from headrace.schema import Schema

SOCKET_SCHEMA: Schema = (("line", "string"), ("received_at", "timestamp"))


@dataclass(frozen=True)
class Socket(SourceConnector):
    """Lines of text from a TCP server at ``host:port``, as ``line`` and ``received_at``.

    At-most-once: lines buffered in memory when the driver stops or dies are lost.
    When the peer closes the connection the input ends (flush row, exhausted marker).
    ``connect_timeout``: how long to keep retrying the first connection, in seconds.
    """

    host: str
    port: int
    connect_timeout: float = 30.0

    guarantee = Guarantee.AT_MOST_ONCE
    emits_dead_letters = False
    spark_data_source = "headrace.connectors.spark_readers.socket:SocketDataSource"

    def __post_init__(self) -> None:
        if not self.host:
            raise PlanError("Socket: host must not be empty")
        if not 0 < int(self.port) < 65536:
            raise PlanError(f"Socket: port must be between 1 and 65535, got {self.port!r}")
        if not self.connect_timeout >= 0:
            raise PlanError(f"Socket: connect_timeout must be zero or more seconds, got {self.connect_timeout!r}")

    def schema(self) -> Schema:
        return SOCKET_SCHEMA

    def options(self) -> dict[str, str]:
        return {"host": self.host, "port": str(self.port), "connect_timeout": str(self.connect_timeout)}

    def offset_identity(self) -> dict[str, Any]:
        """The peer whose lines the offsets count; ``connect_timeout`` does not change them."""
        return {"host": self.host, "port": self.port}

    def describe(self) -> dict[str, Any]:
        return {"type": "Socket", "host": self.host, "port": self.port,
                "connect_timeout": self.connect_timeout, "guarantee": self.guarantee.value}
