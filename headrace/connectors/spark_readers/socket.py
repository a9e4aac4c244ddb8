"""The Socket source's Spark data source (``headrace_socket``): the receiving thread on the driver,
the spilled segment files, and reading them back (how it works: ``headrace/connectors/socket.py``)."""

from __future__ import annotations

import os
import shutil
import socket as _socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.connectors.base import ExhaustedMark, stop_requested
from headrace.connectors.socket import SOCKET_SCHEMA
from headrace.contract import CONTROL_COLUMN, FLUSH_TIME_MS, FLUSHED
from headrace.errors import SourceError
from headrace.schema import arrow_schema, to_ddl

_SEGMENT_SCHEMA = arrow_schema(SOCKET_SCHEMA)  # the received lines, as the segment files hold them
ARROW_SCHEMA = _SEGMENT_SCHEMA.append(pa.field(CONTROL_COLUMN, pa.int64()))
_SUFFIX = ".arrow"


class _Receiver(threading.Thread):
    """Connects, reads, and buffers complete lines as (bytes, line count, received_at µs) blocks."""

    def __init__(self, host: str, port: int, connect_timeout: float) -> None:
        super().__init__(name=f"headrace-socket-{host}:{port}", daemon=True)
        self.host, self.port, self.connect_timeout = host, port, connect_timeout
        self.lock = threading.Lock()
        self.blocks: list[tuple[bytes, int, int]] = []
        self.closed = False  # the peer closed the connection: end of input
        self.error: str | None = None  # could not connect
        self.stopping = threading.Event()

    def run(self) -> None:
        sock = self._connect()
        if sock is None:
            return
        pending = b""
        try:
            with sock:
                sock.settimeout(0.2)
                while not self.stopping.is_set():
                    try:
                        data = sock.recv(1 << 16)
                    except TimeoutError:
                        continue
                    except OSError:
                        break  # reset by the peer: end of input too
                    if not data:
                        break
                    stamp = time.time_ns() // 1000
                    pending += data
                    cut = pending.rfind(b"\n") + 1
                    if cut:
                        block, pending = pending[:cut], pending[cut:]
                        with self.lock:
                            self.blocks.append((block, block.count(b"\n"), stamp))
        finally:
            with self.lock:
                if pending and not self.stopping.is_set():
                    self.blocks.append((pending + b"\n", 1, time.time_ns() // 1000))
                self.closed = True

    def _connect(self) -> _socket.socket | None:
        deadline = time.monotonic() + self.connect_timeout
        while not self.stopping.is_set():
            try:
                return _socket.create_connection((self.host, self.port), timeout=5)
            except OSError as exc:
                if time.monotonic() >= deadline:
                    with self.lock:
                        self.error = (f"cannot connect to {self.host}:{self.port} within "
                                      f"{self.connect_timeout:g} s: {exc}")
                    return None
                time.sleep(0.2)
        return None

    def take(self) -> tuple[list[tuple[bytes, int, int]], bool, str | None]:
        with self.lock:
            blocks, self.blocks = self.blocks, []
            return blocks, self.closed, self.error


def _segments(folder: str) -> list[tuple[int, int, str]]:
    """(first line, end line, path) of the spilled segment files, in order."""
    out = []
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    for name in names:
        if name.endswith(_SUFFIX) and not name.startswith("."):
            first, end = name[: -len(_SUFFIX)].split("-")
            out.append((int(first), int(end), os.path.join(folder, name)))
    return sorted(out)


def _lines_table(blocks: list[tuple[bytes, int, int]]) -> pa.Table:
    text = b"".join(block for block, _, _ in blocks).decode("utf-8", errors="replace")
    lines = pc.split_pattern(pa.array([text[:-1]], pa.large_string()), "\n").flatten()
    lines = pc.replace_substring_regex(lines, r"\r$", "").cast(pa.string())
    counts = np.array([count for _, count, _ in blocks], dtype=np.int64)
    stamps = np.repeat(np.array([stamp for _, _, stamp in blocks], dtype=np.int64), counts)
    return pa.Table.from_arrays([lines, pa.array(stamps, ARROW_SCHEMA.field("received_at").type)],
                                schema=_SEGMENT_SCHEMA)


class SocketRange(InputPartition):
    """Lines [start, end) spilled under ``folder``, plus the flush row when ``flush``."""

    def __init__(self, folder: str, start: int, end: int, flush: bool) -> None:
        super().__init__((start, end))
        self.folder, self.start, self.end, self.flush = folder, start, end, flush


class SocketStreamReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.host = options.get("host", "localhost")
        self.port = int(options.get("port", "0"))
        self.connect_timeout = float(options.get("connect_timeout", "30"))
        self.source = options.get("hr_source", "socket")
        self._receiver: _Receiver | None = None
        self._received = 0  # lines spilled so far (this process)
        self._folder: str | None = None
        self._cleared = False
        self._exhausted = ExhaustedMark(options)

    @property
    def folder(self) -> str:
        if self._folder is None:
            run_dir = self.options.get("hr_run_dir")
            if run_dir:
                self._folder = os.path.join(os.path.abspath(run_dir), "socket", self.source)
            else:
                self._folder = tempfile.mkdtemp(prefix=f"headrace-socket-{self.source}-")
            os.makedirs(self._folder, exist_ok=True)
        return self._folder

    def _start(self, received: int) -> None:
        spilled = _segments(self.folder)
        self._received = max([received, *(end for _, end, _ in spilled)])
        self._receiver = _Receiver(self.host, self.port, self.connect_timeout)
        self._receiver.start()

    def initialOffset(self) -> dict:
        # Only a new query calls this (a restarted one starts from its checkpoint), but it
        # calls it twice: clear what an earlier query of this name spilled, once.
        if not self._cleared:
            shutil.rmtree(self.folder, ignore_errors=True)
            os.makedirs(self.folder, exist_ok=True)
            self._cleared = True
        return {"lines": 0}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        if self._exhausted.past_flush(start):
            return start
        if self._receiver is None:
            self._start(int(start["lines"]))
        if stop_requested(self.options):
            return start
        assert self._receiver is not None
        blocks, closed, error = self._receiver.take()
        if error:
            raise SourceError(f"source {self.source!r}: {error}")
        if blocks:
            table = _lines_table(blocks)
            first, end = self._received, self._received + table.num_rows
            name = f"{first:020d}-{end:020d}{_SUFFIX}"
            temporary = os.path.join(self.folder, "." + name)
            with pa.OSFile(temporary, "wb") as sink, pa.ipc.new_file(sink, _SEGMENT_SCHEMA) as writer:
                writer.write_table(table)
            os.replace(temporary, os.path.join(self.folder, name))
            self._received = end
        offset: dict[str, Any] = {"lines": self._received}
        if closed:
            offset[FLUSHED] = True
            self._exhausted()
        return offset

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        flush = bool(end.get(FLUSHED)) and not start.get(FLUSHED)
        first, last = int(start["lines"]), int(end["lines"])
        if last <= first and not flush:
            return []
        return [SocketRange(self.folder, first, last, flush)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SocketRange)
        for first, end, path in _segments(partition.folder):
            if end <= partition.start or first >= partition.end:
                continue
            with pa.OSFile(path, "rb") as source:  # not memory-mapped: the batches outlive the file
                table = pa.ipc.open_file(source).read_all()
            lo = max(partition.start, first) - first
            hi = min(partition.end, end) - first
            for batch in table.slice(lo, hi - lo).to_batches():
                yield pa.RecordBatch.from_arrays(
                    [*batch.columns, pa.nulls(batch.num_rows, pa.int64())], schema=ARROW_SCHEMA)
        if partition.flush:
            yield pa.RecordBatch.from_arrays(
                [pa.nulls(1, pa.string()), pa.nulls(1, ARROW_SCHEMA.field("received_at").type),
                 pa.array([FLUSH_TIME_MS], pa.int64())], schema=ARROW_SCHEMA)

    def commit(self, end: dict) -> None:
        for _, last, path in _segments(self.folder):
            if last <= int(end["lines"]):
                try:
                    os.remove(path)
                except FileNotFoundError:
                    pass

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.stopping.set()
            self._receiver.join(timeout=2)


class SocketDataSource(DataSource):
    """Spark data source ``headrace_socket``; options as produced by ``Socket.options()``."""

    @classmethod
    def name(cls) -> str:
        return "headrace_socket"

    def schema(self) -> str:
        return to_ddl((*SOCKET_SCHEMA, (CONTROL_COLUMN, "long")))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return SocketStreamReader(dict(self.options))
