"""A sink that writes Parquet or JSON-lines files into a directory, exactly once.

Two layouts, both readable with :func:`read_rows`:

* **Spark's streaming file sink**, used when this is a pipeline's only sink:
  part files in ``path`` plus the ``_spark_metadata`` manifest, which lists the
  files of committed batches only. ``spark.read.parquet(path)`` honours it.
* **One directory per batch**, used through ``write_batch`` (a pipeline with
  several sinks): a batch is written into ``path/_tmp-<batch id>-<uuid>`` and
  renamed atomically to ``path/batch-<batch id, 12 digits>``. A batch whose
  directory exists is already committed and is skipped when Spark replays it.
  Read it with ``spark.read.parquet(f"{path}/batch-*")`` or :func:`read_rows`.

A path holds one layout: ``write_batch`` refuses a directory that already has a
``_spark_metadata`` manifest. Paths are local (or a shared file system mounted
at the same place on every machine).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shutil
import uuid
from typing import Any
from urllib.parse import unquote, urlsplit

from headrace.connectors.base import Guarantee, SinkConnector, run_batch
from headrace.errors import PlanError, SinkError

FORMATS = {"parquet": "parquet", "jsonl": "json"}
MANIFEST = "_spark_metadata"
OWNER_FILE = "_headrace_owner"
_BATCH_DIR = re.compile(r"^batch-(\d+)$")
_TMP_DIR = re.compile(r"^_tmp-(\d+)-[0-9a-f]+$")


def _local_path(path: str, where: str) -> str:
    parts = urlsplit(path)
    if parts.scheme == "file":
        return os.path.abspath(unquote(parts.path))
    if parts.scheme and len(parts.scheme) > 1:
        raise PlanError(f"{where}: only local paths are supported, got {path!r}")
    return os.path.abspath(path)


def batch_dir_name(batch_id: int) -> str:
    """The directory a committed batch lives in.

    >>> batch_dir_name(7)
    'batch-000000000007'
    """
    return f"batch-{batch_id:012d}"


class FileSink(SinkConnector):
    """Write every batch as ``format`` files (``"parquet"`` or ``"jsonl"``) under ``path``, exactly once.

    As a pipeline's only sink it runs as Spark's streaming file sink (format
    ``parquet`` or ``json``, option ``path``) with its ``_spark_metadata``
    manifest; through ``write_batch`` each batch goes to its own directory,
    committed by an atomic rename (see the module docstring).

    >>> FileSink("/tmp/out", format="jsonl").native_options()
    {'path': '/tmp/out'}
    """

    guarantee = Guarantee.EXACTLY_ONCE

    def __init__(self, path: str, format: str = "parquet"):
        if not isinstance(path, str) or not path:
            raise PlanError(f"FileSink: path must be a non-empty string, got {path!r}")
        if format not in FORMATS:
            raise PlanError(f"FileSink({path!r}): unknown format {format!r}; use 'parquet' or 'jsonl'")
        _local_path(path, f"FileSink({path!r})")
        self.path = path
        self.format = format
        self.native_format: str | None = FORMATS[format]
        self.owner: str | None = None

    def bind(self, owner: str) -> FileSink:
        """A copy that writes batches for ``owner`` (sink, pipeline and checkpoint identity)."""
        bound = copy.copy(self)
        bound.owner = owner
        return bound

    @property
    def root(self) -> str:
        """The absolute local directory the sink writes into."""
        return _local_path(self.path, f"FileSink({self.path!r})")

    def native_options(self) -> dict[str, str]:
        return {"path": self.path}

    def describe(self) -> dict[str, Any]:
        return {"type": "FileSink", "path": self.path, "format": self.format}

    def __repr__(self) -> str:
        return f"FileSink({self.path!r}, format={self.format!r})"

    def prepare(self, run_dir: str) -> None:
        """Create the directory and remove temporary directories a crashed run left behind."""
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"FileSink({self.path!r}): cannot create the directory: {exc}; "
                            "choose a writable path") from None
        self._clean_temp(None)
        self._claim()

    def _claim(self) -> None:
        """Refuse a directory that holds batches of another run: their batch ids would
        collide with this run's and its batches would be skipped as already written."""
        if self.owner is None:
            return
        marker = os.path.join(self.root, OWNER_FILE)
        if os.path.exists(marker):
            with open(marker) as handle:
                previous = handle.read().strip()
            if previous != self.owner:
                raise SinkError(f"FileSink({self.path!r}): the directory holds the batches of another run "
                                f"({previous}); a fresh start needs an empty directory: remove it or use a new path")
            return
        if any(_BATCH_DIR.match(name) for name in os.listdir(self.root)):
            raise SinkError(f"FileSink({self.path!r}): the directory already holds batches of an earlier run; "
                            "remove it or use a new path")
        with open(marker, "w") as handle:
            handle.write(self.owner + "\n")

    def committed(self, batch_id: int) -> bool:
        return os.path.isdir(os.path.join(self.root, batch_dir_name(batch_id)))

    def write_batch(self, df: Any, batch_id: int) -> None:
        root = self.root
        final = os.path.join(root, batch_dir_name(batch_id))
        if os.path.isdir(final):
            run_batch(df)  # committed before: Spark is replaying this batch and needs it run all the same
            return
        if os.path.isdir(os.path.join(root, MANIFEST)):
            raise SinkError(
                f"FileSink({self.path!r}): the directory holds Spark's streaming file-sink layout "
                f"({MANIFEST}), written when this sink was a pipeline's only sink; batches written "
                "now would be invisible to its readers and could be written twice. Use a new path.")
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"FileSink({self.path!r}): cannot create the directory: {exc}; "
                            "choose a writable path") from None
        self._clean_temp(batch_id)
        temp = os.path.join(root, f"_tmp-{batch_id}-{uuid.uuid4().hex}")
        writer = df.write.mode("errorifexists")
        if self.format == "parquet":
            writer.parquet(temp)
        else:
            writer.json(temp)
        try:
            os.rename(temp, final)
        except OSError as exc:
            shutil.rmtree(temp, ignore_errors=True)
            if os.path.isdir(final):
                return  # another attempt committed the same batch first
            raise SinkError(f"FileSink({self.path!r}): cannot commit batch {batch_id} "
                            f"(rename to {final}): {exc}") from None
        _fsync_dir(root)

    def _clean_temp(self, up_to: int | None) -> None:
        """Remove temporary batch directories (those of batches up to ``up_to``, or all)."""
        root = self.root
        if not os.path.isdir(root):
            return
        for name in os.listdir(root):
            match = _TMP_DIR.match(name)
            if match and (up_to is None or int(match.group(1)) <= up_to):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _is_data_file(name: str) -> bool:
    return not name.startswith(("_", "."))


def _manifest_files(meta_dir: str) -> list[str]:
    """The files Spark's streaming file sink committed, in commit order, from its manifest."""
    logs: dict[int, str] = {}
    for name in os.listdir(meta_dir):
        base = name.removesuffix(".compact")
        if base.isdigit():
            logs[int(base)] = name
    if not logs:
        return []
    compacts = [batch for batch, name in logs.items() if name.endswith(".compact")]
    start = max(compacts) if compacts else min(logs)
    files: dict[str, None] = {}
    for batch in range(start, max(logs) + 1):
        if batch not in logs:
            continue
        with open(os.path.join(meta_dir, logs[batch]), encoding="utf-8") as log:
            lines = log.read().splitlines()
        for line in lines[1:]:  # the first line is the log version, "v1"
            if not line.strip():
                continue
            entry = json.loads(line)
            parts = urlsplit(entry["path"])
            local = unquote(parts.path) if parts.scheme in ("", "file") else entry["path"]
            if entry.get("action", "add") == "delete":
                files.pop(local, None)
            else:
                files[local] = None
    return list(files)


def _read_file(path: str, format: str) -> list[dict[str, Any]]:
    if format == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_table(path).to_pylist())
    opener: Any = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def read_rows(path: str, format: str = "parquet") -> list[dict[str, Any]]:
    """Every row committed under ``path`` by a :class:`FileSink`, in commit order, without Spark.

    Reads the files listed in Spark's ``_spark_metadata`` manifest, if there is
    one, then the ``batch-*`` directories in batch order; temporary and
    uncommitted files are ignored. JSON-lines rows come back as parsed JSON
    (timestamps as strings); Parquet rows with their Python types.
    """
    if format not in FORMATS:
        raise PlanError(f"read_rows({path!r}): unknown format {format!r}; use 'parquet' or 'jsonl'")
    root = _local_path(path, f"read_rows({path!r})")
    if not os.path.isdir(root):
        raise SinkError(f"read_rows: {path!r} is not a directory a FileSink wrote")
    files: list[str] = []
    meta = os.path.join(root, MANIFEST)
    if os.path.isdir(meta):
        files.extend(_manifest_files(meta))
    batches = sorted((int(m.group(1)), name) for name in os.listdir(root) if (m := _BATCH_DIR.match(name)))
    for _, name in batches:
        folder = os.path.join(root, name)
        files.extend(os.path.join(folder, part) for part in sorted(os.listdir(folder)) if _is_data_file(part))
    rows: list[dict[str, Any]] = []
    for file in files:
        rows.extend(_read_file(file, format))
    return rows
