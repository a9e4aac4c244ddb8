"""A Storm spout as a headrace source: ``next_tuple()`` on the driver, its tuples spooled so a
replayed micro-batch reads the same tuples.

**Filling a batch.** Spark asks the source for its latest offset before each micro-batch
(``latestOffset``, in one long-lived Python process on the driver). The reader calls
``next_tuple()`` on each spout task in turn, round after round, until a round emits nothing or
``max_tuples_per_batch`` tuples are in. It numbers the tuples on and writes them, with every
task's state after them, to a spool file ``<run dir>/spouts/<spout>/<first>-<last>.pickle``
(written, fsynced, renamed); the offset is ``{"seq": <last number>}``. Spark logs that offset
before the batch runs, and ``partitions(start, end)`` reads the numbers after ``start`` up to
``end`` from the spool: a replay reads the same tuples. Tuples spooled before a crash but not
yet in a logged offset go into the next batch, never lost and never emitted twice.

**After a commit.** Spark asks for the next offset only once the batch before has committed,
so ``latestOffset(start)`` (and ``commit(end)``, which Spark calls later, when it plans a batch
with new data) calls ``ack(msg_id)`` for the committed tuples that have a ``msg_id``
(``fail(msg_id)`` for those a bolt failed: the failures of window ``n`` are in
``failed/<n>.json``, written by the operator stage), saves the tasks' state after these calls
(``state.pickle``) and deletes the batch's spool files.

**Restart.** The tasks restart from the newest state: the last spool file's or
``state.pickle``'s, whichever was written later (a version number orders them); ``open`` is not
called again, ``activate`` is. A crash between a commit and its acks calls those acks again
after the restart: ``ack`` is at least once; each tuple reaches the bolts exactly once, as
long as the run dir (beside the checkpoint) survives.
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import re
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from headrace.code_locations import ship_class_by_value
from headrace.connectors.base import mark_exhausted, stop_requested, write_atomically
from headrace.contract import (
    CONTROL_COLUMN,
    FLUSH_TIME_MS,
    FLUSHED,
    Guarantee,
    SourceConnector,
    SourceContext,
    flush_rows,
)
from headrace.environment.admission import adaptive_cap, combined_cap
from headrace.errors import PlanError, SourceError
from headrace.schema import Schema, arrow_schema, schema_of, to_ddl
from headrace.storm import (
    COLLECTOR_ATTRIBUTE,
    SEQ_FIELD,
    TASK_FIELD,
    Spout,
    StreamDeclaration,
    TopologyContext,
    spout_label,
)

TEMPLATE, STATE, FAILED = "spout.pickle", "state.pickle", "failed"
_SPOOLED = re.compile(r"(\d{20})-(\d{20})\.pickle")
SpooledTuple = tuple[int, int, list[Any], Any]  # (number, task, values, msg_id)


def spout_folder(run_dir: str, spout: str) -> str:
    return os.path.join(run_dir or ".", "spouts", spout)


def record_failures(run_dir: str, window: int, roots: set[tuple[str, int]]) -> None:
    """The spout tuples bolts failed in window ``window``, one file per spout (the same again
    when the window is replayed); read by the spout's ``commit``."""
    by_spout: dict[str, list[int]] = {}
    for spout, seq in roots:
        by_spout.setdefault(spout, []).append(int(seq))
    for spout, seqs in by_spout.items():
        path = os.path.join(spout_folder(run_dir, spout), FAILED, f"{window}.json")
        write_atomically(path, json.dumps(sorted(seqs)).encode())


class TupleSpool:
    """The spool of one spout: ``<first>-<last>.pickle`` per ``latestOffset`` that emitted,
    ``state.pickle`` after each commit, ``failed/<window>.json``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def files(self) -> list[tuple[int, int, str]]:
        if not os.path.isdir(self.folder):
            return []
        return sorted((int(m.group(1)), int(m.group(2)), name) for name in os.listdir(self.folder)
                      if (m := _SPOOLED.fullmatch(name)))

    def _load(self, name: str) -> dict[str, Any]:
        with open(os.path.join(self.folder, name), "rb") as handle:
            loaded: dict[str, Any] = pickle.load(handle)
        return loaded

    def write(self, tuples: list[SpooledTuple], version: int, states: list[bytes]) -> None:
        name = f"{tuples[0][0]:020d}-{tuples[-1][0]:020d}.pickle"
        write_atomically(os.path.join(self.folder, name),
                          cloudpickle.dumps({"version": version, "tuples": tuples, "states": states}))

    def read(self, after: int, upto: int) -> list[SpooledTuple]:
        """The tuples numbered after ``after`` up to ``upto``, in order."""
        out: list[SpooledTuple] = []
        for first, last, name in self.files():
            if last > after and first <= upto:
                out.extend(t for t in self._load(name)["tuples"] if after < t[0] <= upto)
        return out

    def newest(self) -> tuple[int, int, list[bytes] | None]:
        """(version, last number spooled, the tasks' newest states or None)."""
        version, last, states = 0, 0, None
        if os.path.exists(os.path.join(self.folder, STATE)):
            saved = self._load(STATE)
            version, last, states = saved["version"], saved["last"], saved["states"]
        for _first, end, name in self.files():
            last = max(last, end)
            spooled = self._load(name)
            if spooled["version"] > version:
                version, states = spooled["version"], spooled["states"]
        return version, last, states

    def failed(self, upto: int) -> set[int]:
        folder = os.path.join(self.folder, FAILED)
        seqs: set[int] = set()
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if name.endswith(".json"):
                with open(os.path.join(folder, name)) as handle:
                    seqs.update(s for s in json.load(handle) if s <= upto)
        return seqs

    def commit(self, upto: int, version: int, last: int, states: list[bytes]) -> None:
        """Save the tasks' state after the acks of the tuples up to ``upto``, then drop them."""
        write_atomically(os.path.join(self.folder, STATE),
                          cloudpickle.dumps({"version": version, "last": last, "states": states}))
        for _first, end, name in self.files():
            if end <= upto:
                os.unlink(os.path.join(self.folder, name))
        folder = os.path.join(self.folder, FAILED)
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            path = os.path.join(folder, name)
            with open(path) as handle:
                if all(s <= upto for s in json.load(handle)):
                    os.unlink(path)


# ---------------------------------------------------------------------------------------------
# The connector

class SpoutSource(SourceConnector):
    """An ``hr.Spout`` as a source: ``parallelism`` tasks on the driver, at most about
    ``max_tuples_per_batch`` tuples per micro-batch (see the module's docstring)."""

    guarantee = Guarantee.EXACTLY_ONCE
    lowered_as = "Python data source: the spout's next_tuple on the driver, tuples spooled before each batch"

    def __init__(self, component_id: str, spout: Spout, parallelism: int, max_tuples_per_batch: int,
                 declaration: StreamDeclaration) -> None:
        where = f"step '{component_id}'"
        if not isinstance(max_tuples_per_batch, int) or isinstance(max_tuples_per_batch, bool) or \
                max_tuples_per_batch < 1:
            raise PlanError(f"{where}: max_tuples_per_batch must be a whole number, at least 1, got "
                            f"{max_tuples_per_batch!r}")
        if not isinstance(type(spout).bounded, bool):
            raise PlanError(f"{where}: {type(spout).__name__}.bounded must be True or False, got "
                            f"{type(spout).bounded!r}")
        assert declaration.schema is not None
        self.component_id, self.spout, self.parallelism = component_id, spout, parallelism
        self.max_tuples_per_batch, self.declaration = max_tuples_per_batch, declaration

    @property
    def bounded(self) -> bool:
        return type(self.spout).bounded

    def schema(self) -> Schema:
        assert self.declaration.schema is not None
        return (*self.declaration.schema, (SEQ_FIELD, "long"), (TASK_FIELD, "int"))

    def data_source(self) -> type:
        return SpoutDataSource

    def options(self) -> dict[str, str]:
        return {"schema": json.dumps([list(p) for p in self.schema()]), "parallelism": str(self.parallelism),
                "max_tuples_per_batch": str(self.max_tuples_per_batch), "stream": self.declaration.name,
                "bounded": "true" if self.bounded else "false", "component": self.component_id}

    def describe(self) -> dict[str, Any]:
        assert self.declaration.schema is not None
        return {"type": "Spout", "spout": type(self.spout).__name__, "fields": to_ddl(self.declaration.schema),
                "parallelism": self.parallelism, "bounded": self.bounded,
                "max_tuples_per_batch": self.max_tuples_per_batch}

    def offset_identity(self) -> dict[str, Any]:
        """An offset numbers the tuples this spout's tasks emitted: its class, tasks and fields."""
        kind = type(self.spout)
        return {"spout": f"{kind.__module__}.{kind.__qualname__}", "parallelism": self.parallelism,
                "fields": [list(p) for p in self.declaration.schema or ()]}

    def prepare(self, context: SourceContext) -> None:
        """Before Spark starts: the spout as the user built it, for the reader to start from."""
        ship_class_by_value(type(self.spout))
        write_atomically(os.path.join(spout_folder(context.run_dir, context.source_name), TEMPLATE),
                          cloudpickle.dumps(self.spout))


# ---------------------------------------------------------------------------------------------
# Spark's side

class SpoutTuples(InputPartition):
    """A batch's tuples, carried to the executor that reads them, and whether the input ends."""

    def __init__(self, tuples: list[SpooledTuple], flush: bool) -> None:
        super().__init__(len(tuples))
        self.tuples, self.flush = tuples, flush


def _schema(options: dict[str, str]) -> Schema:
    return schema_of([tuple(p) for p in json.loads(options["schema"])], "spout schema")


class SpoutDataSource(DataSource):
    """Spark data source ``headrace_spout``; options as produced by ``SpoutSource.options()``."""

    @classmethod
    def name(cls) -> str:
        return "headrace_spout"

    def schema(self) -> str:
        return f"{to_ddl(_schema(dict(self.options)))}, `{CONTROL_COLUMN}` long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return SpoutReader(dict(self.options))


def _arrow_rows(schema: Schema, tuples: list[SpooledTuple]) -> list[dict[str, Any]]:
    names = [n for n, _ in schema][:-2]
    stamps = {n for n, t in schema if t == "timestamp"}
    rows = []
    for seq, task, values, _msg_id in tuples:
        row = dict(zip(names, values, strict=True))
        for name in stamps:
            value = row.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[name] = datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
        rows.append({**row, SEQ_FIELD: seq, TASK_FIELD: task})
    return rows


class SpoutReader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.source = options.get("hr_source", "spout")
        self.schema = _schema(options)
        self.fields = [n for n, _ in self.schema][:-2]
        self.stream = options.get("stream", "default")
        self.parallelism = int(options.get("parallelism", "1"))
        self.cap = int(options.get("max_tuples_per_batch", "1000"))
        self.bounded = options.get("bounded") == "true"
        self.spool = TupleSpool(spout_folder(options.get("hr_run_dir") or "", self.source))
        self._started = False

    def __getstate__(self) -> dict[str, Any]:  # executors get the reader without the spout tasks
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")} | {"_started": False}

    # -- the spout tasks, on the driver ----------------------------------------------------------------
    def _start(self) -> None:
        if self._started:
            return
        with open(os.path.join(self.spool.folder, TEMPLATE), "rb") as handle:
            template = handle.read()
        self._version, self._last, states = self.spool.newest()
        if states is not None and len(states) != self.parallelism:
            raise SourceError(f"spout '{self.source}' has {self.parallelism} task(s), but its state in the run "
                              f"directory was saved by {len(states)}: each task owns its state, so the parallelism "
                              "cannot change on restart; keep it, or start afresh with a new state directory")
        self._tasks: list[Spout] = []
        for task in range(self.parallelism):
            spout = pickle.loads(template)
            if states is not None:  # saved after open: open runs once in the spout's life
                spout.__dict__.update(pickle.loads(states[task]))
            else:
                self._call(spout, task, "open", TopologyContext(self.source, task, self.parallelism))
            self._call(spout, task, "activate")
            self._tasks.append(spout)
        self._started = True

    def _call(self, spout: Spout, task: int, method: str, *args: Any) -> None:
        try:
            getattr(spout, method)(*args)
        except SourceError:
            raise
        except Exception as exc:
            raise SourceError(f"spout '{self.source}' ({spout_label(spout, method)}), task {task}: {method} raised "
                              f"{type(exc).__name__}: {exc}") from exc

    def _finished(self, spout: Spout, task: int) -> bool:
        try:
            return bool(spout.finished())
        except Exception as exc:
            raise SourceError(f"spout '{self.source}' ({spout_label(spout, 'finished')}), task {task}: finished "
                              f"raised {type(exc).__name__}: {exc}") from exc

    def _states(self) -> list[bytes]:
        out = []
        for spout in self._tasks:
            skip = {COLLECTOR_ATTRIBUTE, *getattr(spout, "transient", ())}
            out.append(cloudpickle.dumps({k: v for k, v in spout.__dict__.items() if k not in skip}))
        return out

    def _next(self, spout: Spout, task: int) -> list[tuple[list[Any], Any]]:
        got: list[tuple[list[Any], Any]] = []

        def collect(values: Any, msg_id: Any, stream: str) -> None:
            label = f"spout '{self.source}' ({spout_label(spout, 'next_tuple')}), task {task}"
            if stream != self.stream:
                raise SourceError(f"{label}: emit on stream {stream!r}, which the spout does not declare (it declares "
                                  f"{self.stream!r})")
            if isinstance(values, dict) and set(values) == set(self.fields):
                values = [values[f] for f in self.fields]
            if not isinstance(values, (list, tuple)) or len(values) != len(self.fields):
                raise SourceError(f"{label}: emitted {values!r:.200}; emit a list of {len(self.fields)} value(s) for "
                                  f"its fields ({', '.join(self.fields)})")
            got.append((list(values), msg_id))

        spout.__dict__[COLLECTOR_ATTRIBUTE] = collect
        try:
            self._call(spout, task, "next_tuple")
        finally:
            del spout.__dict__[COLLECTOR_ATTRIBUTE]
        return got

    def _check(self, tuples: list[SpooledTuple]) -> None:
        """Fail here, naming the tuple, when a value does not fit the declared types."""
        arrow = arrow_schema(self.schema)
        try:
            pa.RecordBatch.from_pylist(_arrow_rows(self.schema, tuples), schema=arrow)
            return
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            pass
        for one in tuples:
            try:
                pa.RecordBatch.from_pylist(_arrow_rows(self.schema, [one]), schema=arrow)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
                spout = self._tasks[one[1]]
                raise SourceError(f"spout '{self.source}' ({spout_label(spout, 'next_tuple')}), task {one[1]}: "
                                  f"emitted {one[2]!r:.200}, which does not fit its fields "
                                  f"({to_ddl(self.schema[:-2])}): {exc}") from None

    # -- Spark's calls -----------------------------------------------------------------------------------
    def initialOffset(self) -> dict:
        return {"seq": 0}

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        self._start()
        self._acknowledge(int(start.get("seq", 0)))  # Spark asks only once the batch up to start committed
        if start.get(FLUSHED):
            mark_exhausted(self.options)
            return start
        if stop_requested(self.options):
            return start
        last = max(int(start.get("seq", 0)), self._last)  # tuples spooled before a crash are covered too
        max_rows = getattr(limit, "max_rows", None)
        cap = combined_cap(self.cap, adaptive_cap(self.options), None if max_rows is None else int(max_rows)) or 1
        tuples: list[SpooledTuple] = []
        ended = False
        while len(tuples) < cap:
            emitted = 0
            for task, spout in enumerate(self._tasks):
                for values, msg_id in self._next(spout, task):
                    tuples.append((last + len(tuples) + 1, task, values, msg_id))
                    emitted += 1
                if len(tuples) >= cap:
                    break
            if not emitted:
                ended = self.bounded and all(self._finished(spout, task) for task, spout in enumerate(self._tasks))
                break
        if tuples:
            self._check(tuples)
            self._version += 1
            self.spool.write(tuples, self._version, self._states())
            self._last = tuples[-1][0]
        offset: dict[str, Any] = {"seq": self._last if tuples else last}
        if ended:
            offset[FLUSHED] = True
            mark_exhausted(self.options)
        return offset

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        tuples = self.spool.read(int(start.get("seq", 0)), int(end.get("seq", 0)))
        flush = bool(flush_rows(start, end))
        return [SpoutTuples(tuples, flush)] if tuples or flush else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SpoutTuples)
        arrow = arrow_schema(self.schema).append(pa.field(CONTROL_COLUMN, pa.int64()))
        rows: list[dict[str, Any]] = _arrow_rows(self.schema, partition.tuples)
        if partition.flush:
            rows.append({CONTROL_COLUMN: FLUSH_TIME_MS})
        yield pa.RecordBatch.from_pylist(rows, schema=arrow)

    def commit(self, end: dict) -> None:
        self._start()
        self._acknowledge(int(end.get("seq", 0)))

    def _acknowledge(self, upto: int) -> None:
        """The tuples up to ``upto`` are in committed batches: ack (or fail) them, save the tasks'
        state, drop them from the spool."""
        done = self.spool.read(0, upto)
        if not done:
            return
        failed = self.spool.failed(upto)
        for seq, task, _values, msg_id in done:
            if msg_id is not None:
                self._call(self._tasks[task], task, "fail" if seq in failed else "ack", msg_id)
        self._version += 1
        self.spool.commit(upto, self._version, self._last, self._states())

    def stop(self) -> None:
        if self._started:
            for task, spout in enumerate(self._tasks):
                self._call(spout, task, "deactivate")
            self._started = False
