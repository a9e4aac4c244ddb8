"""The ``View`` sink: a queryable view of a stream, kept in the pipeline's serving store
(``headrace/connectors/view_store.py``) and served by ``headrace server``.

The view is named after its sink step. It keeps the last row of each key: a keyed
aggregate's current values, a window's results, a process step's last emitted record per key.
Each micro-batch's rows (for an updating step, the keys it changed) are applied in one SQLite
transaction with the batch id and the watermark the batch ran with (read from the query's
offset log), so a replayed batch changes nothing: exactly once.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Self

from headrace.connectors.base import StepSink, check_sink_columns, column_names, missing_columns
from headrace.connectors.view_store import KEY_SEPARATOR, ViewWriter, store_path
from headrace.contract import Guarantee
from headrace.environment import checkpoints
from headrace.errors import PlanError, SinkError


class View(StepSink):
    """Keep the last row of each ``key`` (a column or a list of them) where ``headrace server``
    answers lookups and prefix scans (``headrace query``). After a keyed aggregate, a window or a
    keyed process step, ``key`` defaults to the step's keys (and ``window_start`` for a window).
    ``stream.queryable("name")`` is ``stream.sink("name", hr.sinks.View())``."""

    guarantee = Guarantee.EXACTLY_ONCE
    native_format = None
    keyed_updates = "(key=[...])"  # a row per key, replaced by its last update

    def __init__(self, *, key: str | Sequence[str] | None = None) -> None:
        self.key = column_names(key, "key", "View sink")
        self._store = ""
        self._checkpoint = ""
        self._writer: ViewWriter | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_writer": None}

    def _reset(self) -> None:
        self._writer = None

    @property
    def name(self) -> str:
        return self._name or "view"

    @property
    def view(self) -> str:
        """The view's name: its sink step's."""
        return self._step.name if self._step is not None else self.name

    def for_keys(self, keys: tuple[str, ...]) -> Self:
        """Keyed by ``keys`` (the keys the stream's step groups by) when no key was given."""
        if self.key or not keys:
            return self
        keyed = copy.copy(self)
        keyed.key = keys
        return keyed

    def describe(self) -> dict[str, Any]:
        return {"type": "View", "key": list(self.key)}

    def refuses_columns(self, columns: list[str]) -> str | None:
        if not self.key:
            return ("a view needs the column(s) naming each row: give hr.sinks.View(key=[...]) (only a keyed "
                    "aggregate, a window or a keyed process step gives its keys itself)")
        return missing_columns(columns, self.key, "key")

    # -- running ------------------------------------------------------------------------------
    def prepare(self, run_dir: str) -> None:
        self._store = store_path(run_dir)

    def locate_checkpoint(self, checkpoint: str) -> None:
        self._checkpoint = checkpoint

    def check_schema(self, schema: Any, step: Any) -> None:
        if not self.key:
            raise PlanError(f"{step}: {self.refuses_columns([])}")
        check_sink_columns(str(step), list(schema.fieldNames()), self.key)

    def _open(self) -> ViewWriter:
        if self._writer is None:
            if not self._store:
                raise SinkError(f"{self._where()}: the view has no store (prepare was not called)")
            self._writer = ViewWriter(self._store)
        return self._writer

    def committed(self, batch_id: int) -> bool:
        last = self._open().last_batch(self.view)
        return last is not None and last >= batch_id

    def write_batch(self, df: Any, batch_id: int) -> None:
        from pyspark.sql import functions as F

        key = F.concat_ws(KEY_SEPARATOR, *(F.coalesce(df[k].cast("string"), F.lit("")) for k in self.key))
        value = F.to_json(F.struct(*(df[c] for c in df.columns)), {"ignoreNullFields": "false"})
        table = df.select(key.alias("key"), value.alias("value")).toArrow()
        rows = zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
        self._open().apply(self.view, self.key, batch_id, self._watermark(batch_id), rows)

    def _watermark(self, batch_id: int) -> int | None:
        """The watermark batch ``batch_id`` ran with, from the query's offset log; None when the
        checkpoint is not known."""
        if not self._checkpoint:
            return None
        return int(checkpoints.offsets_entry(self._checkpoint, batch_id)[1].get(checkpoints.WATERMARK_KEY, 0))

    def __repr__(self) -> str:
        return f"View(key={list(self.key)!r})"
