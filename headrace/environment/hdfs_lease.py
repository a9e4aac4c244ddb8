"""One driver per checkpoint on HDFS: the lease of a run whose state dir is on a Hadoop file
system with leases of its own (``hdfs://``), and the fencing of a driver that lost it.

HDFS lets one client at a time write a file: the run creates ``<state dir>/<pipeline>.lease``
and keeps it open for writing while it runs (and deletes it when it ends). Another driver's
create of it fails while the file is there. The first line of the file names the holder
(as ``lease.py`` does locally); after it, the holder writes a heartbeat line every
``HEARTBEAT_S`` seconds, flushed to the DataNodes (``hflush``), so readers see it.

* A driver whose create fails reads the file (as far as the holder flushed it). If the last
  heartbeat is younger than ``STALE_S``, the holder runs: the run is refused, naming it.
* An older heartbeat means the holder is dead or frozen (SIGKILL, SIGSTOP, a lost machine),
  and HDFS would keep its lease for a minute more. The new driver then takes the lease over:
  it asks the NameNode to recover it (``recoverLease``, which closes the file under the old
  writer), deletes it and creates it anew.
* A driver that lost its lease this way and comes back (a frozen process resumed) fails its next
  heartbeat or check: its writes to the file are refused. It is **fenced**: it checks the lease
  (writing a line, flushed) before each micro-batch's sinks commit, raises ``LeaseLost`` and
  commits nothing more.

The heartbeat's age is read with this machine's clock: drivers on several machines need clocks
within a few seconds of each other (NTP). Other remote file systems (``s3a://``, ``gs://``) have
no leases: a run on them takes none (docs/runtime.md).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from headrace.environment import storage
from headrace.environment.lease import LeaseHeld, describe, holder_record
from headrace.errors import SetupError

HEARTBEAT_S = 1.0
STALE_S = 5.0  # a heartbeat older than this: its driver is gone (or frozen) and its lease is taken over
TAKE_OVER_S = 60.0  # at most this long for the NameNode to close the file under a dead holder
LEASE_SCHEMES = ("hdfs",)
# HDFS's refusals to create a file that is there: written by another client, or closed
EXISTS = ("AlreadyBeingCreatedException", "RecoveryInProgressException", "FileAlreadyExistsException")


class LeaseLost(SetupError):
    """This driver's lease was taken over by another driver: it must commit nothing more."""


def takes_hdfs_lease(state_dir: str) -> bool:
    return storage.scheme(state_dir) in LEASE_SCHEMES


class HdfsLease:
    """The lease of one run on HDFS (``acquire`` once the Spark session runs, ``check`` before
    each commit, then ``release``)."""

    def __init__(self, state_dir: str, pipeline: str) -> None:
        self.path = storage.join(state_dir, f"{pipeline}.lease")
        self.pipeline = pipeline
        self._out: Any = None
        self._lock = threading.Lock()
        self._lost: str | None = None  # why the lease was lost, once it is
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def held(self) -> bool:
        return self._out is not None

    @property
    def lost(self) -> str | None:
        return self._lost

    def acquire(self) -> None:
        """Take the lease, taking it over from a holder whose heartbeat stopped, or raise
        ``LeaseHeld`` naming the driver that holds it."""
        if self.held:
            return
        fs, target, _ = storage.hadoop_file_system(self.path)
        try:
            out = self._create(fs, target)
        except _Exists:
            holder, beat = self._read(fs, target)
            age = time.time() - beat if beat else None
            if age is not None and age < STALE_S:
                raise LeaseHeld(f"pipeline {self.pipeline!r} is running already, on the same state ({self.path} is "
                                f"held by {describe(holder)}, alive {age:.1f} s ago): one driver runs a checkpoint "
                                "at a time; stop that run (Ctrl-C or SIGTERM), or give this one another state "
                                "dir") from None
            self._take_over(fs, target, holder)
            fs.delete(target, False)
            try:
                out = self._create(fs, target)
            except _Exists:
                raise LeaseHeld(f"pipeline {self.pipeline!r}: another driver took {self.path} over at the same "
                                "time as this one; one driver runs a checkpoint at a time") from None
        self._out = out
        self._write({**holder_record(), "alive": time.time()})
        self._beat = threading.Thread(target=self._heartbeat, name="headrace-lease", daemon=True)
        self._beat.start()

    def check(self, batch_id: int) -> None:
        """Before batch ``batch_id``'s sinks commit: raise ``LeaseLost`` unless this driver still
        holds the lease (a line written and flushed to the DataNodes proves it)."""
        if self._lost is None:
            self._write({"alive": time.time(), "batch": batch_id})
        if self._lost is not None:
            raise LeaseLost(self._lost)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(5)
            self._beat = None
        with self._lock:
            out, self._out = self._out, None
        if out is not None and self._lost is None:
            try:
                out.close()
                fs, target, _ = storage.hadoop_file_system(self.path)
                fs.delete(target, False)  # the next run creates it at once
            except Exception:  # noqa: BLE001 - lost on the way out: nothing more to give up
                pass

    # -- inside -------------------------------------------------------------------------------------
    def _create(self, fs: Any, target: Any) -> Any:
        """The lease file, created for writing; ``_Exists`` when it is there (HDFS creates over a
        file another client writes if told to overwrite, so it is not)."""
        from py4j.protocol import Py4JJavaError

        try:
            return fs.create(target, False)
        except Py4JJavaError as exc:
            text = str(exc.java_exception.toString())
            if any(kind in text for kind in EXISTS):
                raise _Exists() from None
            raise SetupError(f"cannot take the lease {self.path}: {text.splitlines()[0]}",
                             refusal=False) from None  # HDFS's error: it may pass

    def _read(self, fs: Any, target: Any) -> tuple[dict[str, Any], float | None]:
        """The holder the lease file names and its last heartbeat (epoch seconds), as far as the
        holder flushed them; (``{}``, the file's creation time) when it wrote nothing yet."""
        stream = fs.open(target)
        try:
            data = bytes(stream.readAllBytes())
        finally:
            stream.close()
        lines = []
        for line in data.decode(errors="replace").splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a crash
        if not lines:
            return {}, fs.getFileStatus(target).getModificationTime() / 1000
        beats = [line["alive"] for line in lines if isinstance(line.get("alive"), (int, float))]
        return lines[0], max(beats) if beats else None

    def _take_over(self, fs: Any, target: Any, holder: dict[str, Any]) -> None:
        """Have the NameNode close the lease file under its silent holder."""
        deadline = time.time() + TAKE_OVER_S
        while not fs.recoverLease(target):
            if time.time() > deadline:
                raise LeaseHeld(f"pipeline {self.pipeline!r}: {self.path} is held by {describe(holder)}, silent for "
                                f"more than {STALE_S:.0f} s, and HDFS did not hand its lease over within "
                                f"{TAKE_OVER_S:.0f} s") from None
            time.sleep(0.5)

    def _write(self, record: dict[str, Any]) -> None:
        with self._lock:
            if self._out is None or self._lost is not None:
                return
            try:
                self._out.write(bytearray((json.dumps(record) + "\n").encode()))
                self._out.hflush()
            except Exception as exc:  # noqa: BLE001 - any refusal of the write: the lease is gone
                java = getattr(exc, "java_exception", None)
                first = (str(java.toString()) if java is not None else str(exc)).splitlines()
                self._lost = (f"pipeline {self.pipeline!r}: this driver lost its lease {self.path} to another driver, "
                              f"and was fenced: it commits nothing more ({first[0] if first else type(exc).__name__})")

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S) and self._lost is None:
            self._write({"alive": time.time()})


class _Exists(Exception):
    """HDFS refused to create the lease file: it is there, open for another client or closed."""
