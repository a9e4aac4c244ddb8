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

With ``partition_by``, both layouts put each row's file in the directories of its values
(Hive style, as Spark's ``partitionBy``: ``path/country=fr/part-...``, ``path/batch-<id>/country=fr/...``);
the files no longer hold those columns, their directory names do.

A path holds one layout: ``write_batch`` refuses a directory that already has a
``_spark_metadata`` manifest. Paths are local (or a shared file system mounted
at the same place on every machine).

**Lost batches.** A sink bound to a pipeline keeps a record of the directory it writes
and the batches it committed there, in the pipeline's run directory (``<run dir>/sinks/``,
gone with ``--fresh``). Once it has begun writing, the directory must stay: when the
pipeline starts and finds it removed, emptied (no manifest and no batch directory) or
missing batch directories between the first and the last, and, with one directory per
batch, when a batch finds the directory of the last one it committed gone, the sink
stops instead of writing on, unless ``rewrite=True``.

Not every batch id reaches the sink: a rescale adds a batch of its own to the checkpoint that
reads no input and runs no sink (``headrace/runtime/rescale.py``), and a failover group gives
a member only the batches the members before it failed to write. When a batch comes more than
one after the last one the sink committed, the ids between are kept in the record as never
given (``skipped``), so that their missing directories are not taken for lost ones.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from headrace.connectors.base import column_names, missing_columns, run_batch
from headrace.contract import Guarantee, SinkConnector
from headrace.errors import PlanError, SinkError
from headrace.sink_step import SinkStep, step_name

FORMATS = {"parquet": "parquet", "jsonl": "json"}
MANIFEST = "_spark_metadata"
OWNER_FILE = "_headrace_owner"
RECORDS_DIR = "sinks"  # under the run directory: one JSON record per bound sink
_BATCH_DIR = re.compile(r"^batch-(\d+)$")
_TMP_DIR = re.compile(r"^_tmp-(\d+)-[0-9a-f]+$")
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Spark's directory name for a null (or empty) value


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

    ``partition_by``: a column or a list of columns; each row is written under the
    directories of its values (``country=fr/``), which hold those columns instead of the files.

    ``rewrite=True``: when the directory lost the batches this sink committed there
    (removed, emptied), write on into it and accept that they are gone, with a
    warning, instead of stopping.

    >>> FileSink("/tmp/out", format="jsonl", partition_by="country")
    FileSink('/tmp/out', format='jsonl', partition_by=('country',), rewrite=False)
    """

    guarantee = Guarantee.EXACTLY_ONCE
    reads_batch_once = True  # one write of the batch's files

    def __init__(self, path: str, format: str = "parquet", *, partition_by: str | Sequence[str] | None = None,
                 rewrite: bool = False):
        if not isinstance(path, str) or not path:
            raise PlanError(f"FileSink: path must be a non-empty string, got {path!r}")
        if format not in FORMATS:
            raise PlanError(f"FileSink({path!r}): unknown format {format!r}; use 'parquet' or 'jsonl'")
        if not isinstance(rewrite, bool):
            raise PlanError(f"FileSink({path!r}): rewrite must be True or False, got {rewrite!r}")
        _local_path(path, f"FileSink({path!r})")
        self.path = path
        self.format = format
        self.partition_by = column_names(partition_by, "partition_by", f"FileSink({path!r})")
        self.rewrite = rewrite
        self.native_format: str | None = FORMATS[format]
        self.owner: str | None = None
        self._step: SinkStep | None = None
        self._reset()

    def refuses_updates(self) -> str | None:
        return "files keep every row they are given, so each group's updates would pile up as rows"

    def refuses_columns(self, columns: list[str]) -> str | None:
        if not self.partition_by:
            return None
        missing = missing_columns(columns, self.partition_by, "partition_by")
        if missing is None and set(columns) <= set(self.partition_by):
            return (f"partition_by {list(self.partition_by)} names every column of the stream {columns}, which "
                    "would leave the files no column (Spark refuses it); leave at least one column out")
        return missing

    def check_schema(self, schema: Any, step: SinkStep) -> None:
        """A stream whose columns were not known when the pipeline was built, checked as it starts."""
        problem = self.refuses_columns([field.name for field in schema.fields])
        if problem:
            raise SinkError(f"{step}: {problem}")

    def _reset(self) -> None:
        self._record_path: str | None = None  # where the run record of a bound sink lives
        self._record: dict[str, Any] | None = None  # {"identity", "path", "first", "last", "skipped"}
        self._last_committed: int | None = None  # the last batch this sink knows is in the directory

    def bind(self, owner: str, defined_at: str = "") -> FileSink:
        """A copy that writes batches for ``owner`` (sink, pipeline and checkpoint identity), for
        the step defined at ``defined_at`` (``file:line``, for messages)."""
        bound = copy.copy(self)
        bound.owner = owner
        bound._step = SinkStep(step_name(owner), defined_at)
        bound._reset()
        return bound

    @property
    def root(self) -> str:
        """The absolute local directory the sink writes into."""
        return _local_path(self.path, f"FileSink({self.path!r})")

    def native_options(self) -> dict[str, str]:
        # the directory prepare() checked, not a relative path the JVM would read from its own directory
        return {"path": self.root}

    def describe(self) -> dict[str, Any]:
        partitions = {"partition_by": list(self.partition_by)} if self.partition_by else {}
        return {"type": "FileSink", "path": self.path, "format": self.format, **partitions, "rewrite": self.rewrite}

    def __repr__(self) -> str:
        partitions = f", partition_by={self.partition_by!r}" if self.partition_by else ""
        return f"FileSink({self.path!r}, format={self.format!r}{partitions}, rewrite={self.rewrite!r})"

    def _where(self) -> str:
        """``sink 'files' (app.py:20)``, or ``FileSink('/out')`` for a sink used on its own."""
        if self.owner is None:
            return f"FileSink({self.path!r})"
        return str(self._step)

    def prepare(self, run_dir: str) -> None:
        """Stop if the batches this sink committed are gone; create the directory; remove
        temporary directories a crashed run left behind; record that the sink writes here."""
        if self._step is not None:
            self._record_path = os.path.join(run_dir, RECORDS_DIR, quote(self._step.name, safe="") + ".json")
            self._record = self._read_record()
        batches = _batch_ids(self.root)
        if self._record is not None:
            self._check_at_start(batches)
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"{self._where()}: cannot create the directory {self.path!r}: {exc}; "
                            "choose a writable path") from None
        self._clean_temp(None)
        self._claim()
        self._last_committed = batches[-1] if batches else None
        if self._record_path is not None:
            if self._record is None:  # a first start here (or a directory written before records were kept)
                self._record = {"first": batches[0] if batches else None, "last": None}
            seen = [self._record.get("last"), self._last_committed, _manifest_last(self.root)]
            self._save_record(self._record.get("first"), max((b for b in seen if b is not None), default=None),
                              _skipped(self._record))

    def _check_at_start(self, batches: list[int]) -> None:
        root = self.root
        record = self._record or {}
        first, manifest = record.get("first"), os.path.isdir(os.path.join(root, MANIFEST))
        if not os.path.isdir(root):
            self._lost_batches("was removed")
        elif not batches and not manifest:
            self._lost_batches("was emptied")
        elif first is not None and batches:
            never_given = {batch for low, high in _skipped(record) for batch in range(low, high + 1)}
            gaps = sorted(set(range(first, batches[-1] + 1)) - set(batches) - never_given)
            if gaps:
                shown = ", ".join(map(str, gaps[:10])) + (", ..." if len(gaps) > 10 else "")
                self._lost_batches(f"lost the directories of batch{'es' if len(gaps) > 1 else ''} {shown}")

    def _lost_batches(self, found: str) -> None:
        """Stop, saying what was found and what to do; with ``rewrite=True``, warn and start the
        record again instead."""
        record = self._record or {}
        span = _span(record.get("first"), record.get("last"))
        before = f"committed {span} into it" if span else "began writing into it"
        if self.rewrite:
            warnings.warn(f"{self._where()}: the directory {self.path!r} {found} after this sink {before}; "
                          "rewrite=True: writing on, and those batches are gone", stacklevel=3)
            if self._record is not None:
                self._record = {**self._record, "first": None, "last": None, "skipped": []}
            return
        detail = f" (run record {self._record_path})" if self._record_path else ""
        raise SinkError(
            f"{self._where()}: the directory {self.path!r} {found} after this sink {before}{detail}; writing on "
            "would leave those batches gone without a word. To go on: restore the directory and restart the "
            "pipeline; or restart it with --fresh (fresh=True) to start over from the beginning of its input, "
            "into an empty directory; or pass rewrite=True to this sink to write on and accept that those "
            "batches are gone")

    def _read_record(self) -> dict[str, Any] | None:
        """This sink's run record, if it is about this identity and this directory."""
        assert self._record_path is not None
        try:
            with open(self._record_path) as handle:
                record = json.load(handle)
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if not isinstance(record, dict) or record.get("identity") != self.owner or record.get("path") != self.root:
            return None
        return record

    def _save_record(self, first: int | None, last: int | None, skipped: list[list[int]]) -> None:
        assert self._record_path is not None
        self._record = {"identity": self.owner, "path": self.root, "first": first, "last": last, "skipped": skipped}
        temporary = f"{self._record_path}.{uuid.uuid4().hex}.tmp"
        try:
            os.makedirs(os.path.dirname(self._record_path), exist_ok=True)
            with open(temporary, "w") as handle:
                json.dump(self._record, handle)
            os.replace(temporary, self._record_path)
        except OSError as exc:
            raise SinkError(f"{self._where()}: cannot write its run record {self._record_path}: {exc}") from None

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
                raise SinkError(f"{self._where()}: the directory {self.path!r} holds the batches of another run "
                                f"({previous}); a fresh start needs an empty directory: remove it or use a new path")
            return
        if any(_BATCH_DIR.match(name) for name in os.listdir(self.root)):
            raise SinkError(f"{self._where()}: the directory {self.path!r} already holds batches of an earlier "
                            "run; remove it or use a new path")
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
                f"{self._where()}: the directory {self.path!r} holds Spark's streaming file-sink layout "
                f"({MANIFEST}), written when this sink was a pipeline's only sink; batches written "
                "now would be invisible to its readers and could be written twice. Use a new path.")
        rewrote = self._check_last_batch()
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as exc:
            raise SinkError(f"{self._where()}: cannot create the directory {self.path!r}: {exc}; "
                            "choose a writable path") from None
        if rewrote:
            self._claim()
        self._clean_temp(batch_id)
        temp = os.path.join(root, f"_tmp-{batch_id}-{uuid.uuid4().hex}")
        writer = df.write.mode("errorifexists")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
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
            raise SinkError(f"{self._where()}: cannot commit batch {batch_id} "
                            f"(rename to {final}): {exc}") from None
        _fsync_dir(root)
        self._last_committed = batch_id
        if self._record_path is not None:
            self._record_batch(batch_id)

    def _record_batch(self, batch_id: int) -> None:
        """Record the batch as committed, and the ids between the last one and it as never given
        to this sink (a rescale's batch; those a failover group gave another member)."""
        record = self._record or {}
        first, last, skipped = record.get("first"), record.get("last"), _skipped(record)
        if first is not None and last is not None and batch_id > last + 1:
            skipped = [*skipped, [last + 1, batch_id - 1]]
        self._save_record(batch_id if first is None else first, batch_id, skipped)

    def _check_last_batch(self) -> bool:
        """Whether the directory still holds the last batch this sink committed; stop when it
        does not, or (``rewrite=True``) return True after the warning."""
        last, root = self._last_committed, self.root
        if last is None or os.path.isdir(os.path.join(root, batch_dir_name(last))):
            return False
        if not os.path.isdir(root):
            self._lost_batches("was removed")
        elif not _batch_ids(root):
            self._lost_batches("was emptied")
        else:
            self._lost_batches(f"lost the directory of batch {last}")
        self._last_committed = None
        return True

    def _clean_temp(self, up_to: int | None) -> None:
        """Remove temporary batch directories (those of batches up to ``up_to``, or all)."""
        root = self.root
        if not os.path.isdir(root):
            return
        for name in os.listdir(root):
            match = _TMP_DIR.match(name)
            if match and (up_to is None or int(match.group(1)) <= up_to):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def _batch_ids(root: str) -> list[int]:
    """The ids of the batch directories under ``root``, in order (none when it is missing)."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(int(m.group(1)) for name in names if (m := _BATCH_DIR.match(name)))


def _skipped(record: dict[str, Any]) -> list[list[int]]:
    """The ranges of batch ids (first and last, both included) a run record says the sink was never
    given; [] in a record written before they were kept.

    >>> _skipped({"skipped": [[123, 123], [150, 152]]}), _skipped({"first": 0, "last": 7})
    ([[123, 123], [150, 152]], [])
    """
    kept = record.get("skipped")
    if not isinstance(kept, list):
        return []
    return [[int(low), int(high)] for low, high in kept]


def _manifest_last(root: str) -> int | None:
    """The last batch id in Spark's file-sink manifest under ``root``, if there is one."""
    try:
        names = os.listdir(os.path.join(root, MANIFEST))
    except (FileNotFoundError, NotADirectoryError):
        return None
    ids = [int(base) for name in names if (base := name.removesuffix(".compact")).isdigit()]
    return max(ids, default=None)


def _span(first: int | None, last: int | None) -> str:
    """
    >>> _span(0, 7), _span(3, 3), _span(None, 7), _span(None, None)
    ('batches 0-7', 'batch 3', 'batches up to 7', '')
    """
    if last is None:
        return ""
    if first is None:
        return f"batches up to {last}"
    return f"batch {first}" if first == last else f"batches {first}-{last}"


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


def _data_files(folder: str) -> list[str]:
    """The data files in a batch's directory and its partition directories (``col=value``), by path."""
    found: list[str] = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            if "=" in name:
                found.extend(_data_files(path))
        elif _is_data_file(name):
            found.append(path)
    return found


def _partition_values(file: str, base: str) -> dict[str, str | None]:
    """The partition columns of ``file`` from its directories below ``base`` (``col=value``), as
    text, unescaped as Spark escaped them.

    >>> _partition_values("/out/country=fr/day=2026-01-01 10%3A00%3A00/part-0.json", "/out")
    {'country': 'fr', 'day': '2026-01-01 10:00:00'}
    >>> _partition_values("/out/batch-000000000003/country=__HIVE_DEFAULT_PARTITION__/part-0.json",
    ...                   "/out/batch-000000000003")
    {'country': None}
    """
    relative = os.path.relpath(os.path.realpath(file), os.path.realpath(base))
    values: dict[str, str | None] = {}
    for folder in relative.split(os.sep)[:-1]:
        column, equals, value = folder.partition("=")
        if equals:
            values[unquote(column)] = None if value == NULL_PARTITION else unquote(value)
    return values


def _read_file(path: str, format: str, base: str) -> list[dict[str, Any]]:
    """The rows of one data file, with the partition columns of its directories below ``base``."""
    if format == "parquet":
        import pyarrow.parquet as pq

        rows = list(pq.read_table(path).to_pylist())
    else:
        opener: Any = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
    partitions = _partition_values(path, base)
    return [{**row, **partitions} for row in rows] if partitions else rows


def read_rows(path: str, format: str = "parquet") -> list[dict[str, Any]]:
    """Every row committed under ``path`` by a :class:`FileSink`, in commit order, without Spark.

    Reads the files listed in Spark's ``_spark_metadata`` manifest, if there is
    one, then the ``batch-*`` directories in batch order; temporary and
    uncommitted files are ignored. JSON-lines rows come back as parsed JSON
    (timestamps as strings); Parquet rows with their Python types. Partition columns
    (``partition_by``) come last, as the text of their directory names (None for null):
    Spark's reader infers their types again.
    """
    if format not in FORMATS:
        raise PlanError(f"read_rows({path!r}): unknown format {format!r}; use 'parquet' or 'jsonl'")
    root = _local_path(path, f"read_rows({path!r})")
    if not os.path.isdir(root):
        raise SinkError(f"read_rows: {path!r} is not a directory a FileSink wrote")
    files: list[tuple[str, str]] = []  # (a data file, the directory its partition directories are below)
    meta = os.path.join(root, MANIFEST)
    if os.path.isdir(meta):
        files.extend((file, root) for file in _manifest_files(meta))
    batches = sorted((int(m.group(1)), name) for name in os.listdir(root) if (m := _BATCH_DIR.match(name)))
    for _, name in batches:
        folder = os.path.join(root, name)
        files.extend((file, folder) for file in _data_files(folder))
    rows: list[dict[str, Any]] = []
    for file, base in files:
        rows.extend(_read_file(file, format, base))
    return rows
