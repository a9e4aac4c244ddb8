"""Each driver's scratch folder for Spark, and those of drivers that died removed.

Spark keeps a driver's scratch files under ``spark.local.dir`` (``/tmp`` by default): the
connector jars copied for its tasks, the working copies of the RocksDB state stores, pyspark's
files; up to 150 MB a driver. It deletes them as it exits, but a driver that is killed (SIGKILL,
out of memory, a lost container) leaves them for good: a pipeline supervised through a hundred
restarts filled a disk so. headrace gives each driver it starts a folder of its own,
``<temp dir>/headrace-spark-<uid>/<pid>-<start>`` (the process's id and start time), and each
new driver first removes the folders of drivers that no longer run.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

_FOLDER = re.compile(r"^(\d+)-(\d+)$")  # <pid>-<start time in clock ticks since boot>


def scratch_root() -> str:
    """The folder of every driver's scratch folder, for this user."""
    return os.path.join(tempfile.gettempdir(), f"headrace-spark-{os.getuid()}")


def started_at(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None when it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None


def remove_dead(root: str) -> list[str]:
    """Delete the scratch folders in ``root`` whose driver no longer runs; the names deleted."""
    removed: list[str] = []
    try:
        entries = os.listdir(root)
    except OSError:
        return removed
    for name in entries:
        owner = _FOLDER.match(name)
        if owner is None or started_at(int(owner.group(1))) == int(owner.group(2)):
            continue
        shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        removed.append(name)
    return removed


def claim_scratch_dir() -> str | None:
    """This driver's scratch folder (made), once the dead drivers' are removed; None where the
    process's start time cannot be read (no ``/proc``): Spark's default then stands."""
    start = started_at(os.getpid())
    if start is None:
        return None
    root = scratch_root()
    os.makedirs(root, mode=0o700, exist_ok=True)
    remove_dead(root)
    folder = os.path.join(root, f"{os.getpid()}-{start}")
    os.makedirs(folder, exist_ok=True)
    return folder
