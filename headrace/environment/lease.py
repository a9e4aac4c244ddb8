"""One driver per checkpoint: the lease a run holds on its pipeline's state while it runs.

Two drivers on one checkpoint would both plan and commit micro-batches: their sinks' commits
collide (a staging table dropped under the other, a batch written twice), and each corrupts
the other's state. So a run takes the lease before it touches the checkpoint (before
``fresh`` deletes it, too) and keeps it until it ends: an exclusive lock (``flock``) on
``<state dir>/<pipeline>.lease``, which the kernel releases when the driver's process ends,
however it ends (SIGKILL included), so a lease is never left behind. The file names the
holder (process id, host, start time, the command), for the refusal of a second run to name
it.

The lease is the Python driver's: Spark's JVM, which the driver starts, does not hold it, and a
SIGKILL of the driver's process alone leaves that JVM running for seconds, able to commit a
batch. ``headrace server`` ends every process of a dead driver's session before another driver
takes the checkpoint (``headrace/server/supervisor.py``); by hand, a driver is stopped with
Ctrl-C or SIGTERM, or killed with its process group (docs/guarantees.md).

The lock is the local file system's: on one machine, or on a shared file system whose locks
span machines. A state dir on HDFS takes HDFS's own lease (``hdfs_lease.py``); one on an object
store (``s3a://``, ``gs://``) takes none.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import sys
from typing import Any

from headrace.errors import SetupError


class LeaseHeld(SetupError):
    """Another driver runs the pipeline on this checkpoint; the message names it."""


class Lease:
    """The lease of one run (``acquire``, then ``release``; a released lease may be taken again)."""

    def __init__(self, state_dir: str, pipeline: str) -> None:
        self.path = os.path.join(state_dir, f"{pipeline}.lease")
        self.pipeline = pipeline
        self._descriptor: int | None = None

    @property
    def held(self) -> bool:
        return self._descriptor is not None

    def acquire(self) -> None:
        """Take the lease, or raise ``LeaseHeld`` naming the driver that holds it."""
        if self.held:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(descriptor)
            os.close(descriptor)
            raise LeaseHeld(f"pipeline {self.pipeline!r} is running already, on the same state ({self.path} is "
                            f"held by {describe(holder)}): one driver runs a checkpoint at a time; stop that run "
                            "(Ctrl-C or SIGTERM), or give this one another state dir") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, json.dumps(holder_record()).encode(), 0)
        self._descriptor = descriptor

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)  # the lock goes with the last descriptor
            self._descriptor = None


def holder_record() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv)[:200],
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}


def _read(descriptor: int) -> dict[str, Any]:
    try:
        found = json.loads(os.pread(descriptor, 4096, 0) or b"{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def describe(holder: dict[str, Any]) -> str:
    """The driver a lease names, in a few words.

    >>> describe({"pid": 42, "host": "box", "started": "2026-11-26T17:00:00+00:00", "command": "headrace run p.py"})
    "process 42 on box, started 2026-11-26T17:00:00+00:00: 'headrace run p.py'"
    >>> describe({})
    'a driver that has not written its name yet'
    """
    if not holder.get("pid"):
        return "a driver that has not written its name yet"
    return (f"process {holder['pid']} on {holder.get('host', '?')}, started {holder.get('started', '?')}: "
            f"{holder.get('command', '')!r}")
