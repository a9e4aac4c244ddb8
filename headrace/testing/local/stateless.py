"""The local runner's stateless steps: sources, event time, Python functions, column
expressions, key_by, joins with a static table, union and sinks."""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Mapping
from typing import Any

from headrace.code_locations import function_label
from headrace.connectors.scripted import TestSink
from headrace.errors import StepFunctionError
from headrace.plan.nodes import (
    EventTimeNode,
    JoinNode,
    KeyByNode,
    NativeStep,
    PythonStep,
    SinkNode,
    SourceNode,
    TableNode,
    UnionNode,
)
from headrace.schema import arrow_schema
from headrace.testing.local.expressions import evaluate
from headrace.testing.local.operators import Operator, Tick, registered
from headrace.testing.local.values import Row, conform, conform_row, event_millis, visible

_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother = 80, 80


@registered(SourceNode)
class SourceStep(Operator):
    """Hands on the records the runner put in ``pending`` for this micro-batch."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.pending: list[Row] = []

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        rows, self.pending = self.pending, []
        return [dict(r) for r in rows]


@registered(TableNode)
class TableStep(Operator):
    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        return [conform_row(r, self.node.schema) for r in self.node.rows or ()]


@registered(EventTimeNode)
class EventTimeStep(Operator):
    """Makes the field a timestamp and follows the largest event time it sees (its control rows'
    included): the watermark it proposes is that minus the max out-of-orderness."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.max_seen: int | None = None
        self.sources = {s.name for s in self.plan.sources() if s.name in self.plan.upstream(self.node.name)}

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        field = self.node.event_time
        times = [max(t, 0) + self.node.delay_ms for s in self.sources for t in tick.controls.get(s, ())]
        rows = []
        for row in inputs[0]:
            row = {**row, field: conform(row[field], "timestamp")}
            if row[field] is not None:
                times.append(event_millis(row[field]) or 0)
            rows.append(row)
        if times:
            self.max_seen = max(times) if self.max_seen is None else max(self.max_seen, *times)
        return rows

    def proposed_watermark(self) -> int:
        """Spark's: 0 until the step has seen a row."""
        return 0 if self.max_seen is None else self.max_seen - self.node.delay_ms


@registered(PythonStep)
class PythonFunctionStep(Operator):
    """map, flat_map, filter, a key function and map_batches, with Spark's error messages."""

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        mode = self.node.mode
        rows = [visible(r) for r in inputs[0]]
        if mode == "map_batches":
            return self._batches(rows) if rows else []
        out: list[Row] = []
        for row in rows:
            result = self._call(row)
            if mode == "filter":
                if result:
                    out.append(row)
            elif mode == "key":
                out.append({**row, "key": None if result is None else str(result)})
            elif mode == "map":
                out.append(conform_row(self._as_dict(result, row), self.node.schema))
            else:
                out.extend(conform_row(self._as_dict(item, row), self.node.schema) for item in self._items(result, row))
        return out

    def _label(self) -> str:
        return function_label(self.node.fn)

    def _call(self, row: Row) -> Any:
        try:
            return self.node.fn(dict(row))
        except StepFunctionError:
            raise
        except Exception as exc:
            raise StepFunctionError(f"step '{self.node.name}' ({self._label()}) raised {type(exc).__name__}: {exc} "
                                    f"(record: {_repr.repr(row)})") from exc

    def _items(self, result: Any, row: Row) -> list[Any]:
        try:
            return list(result)
        except Exception as exc:
            raise StepFunctionError(f"step '{self.node.name}' ({self._label()}) raised {type(exc).__name__}: {exc} "
                                    f"(record: {_repr.repr(row)})") from exc

    def _as_dict(self, value: Any, row: Row) -> Mapping[str, Any]:
        if isinstance(value, Mapping):
            return value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.asdict(value)
        kind = "a flat_map step must yield" if self.node.mode == "flat_map" else "a map step must return"
        name = type(value).__name__
        article = "an" if name[0] in "aeiou" else "a"
        raise StepFunctionError(f"step '{self.node.name}' ({self._label()}) returned {article} {name} "
                                f"({_repr.repr(value)}); {kind} a dict or a dataclass instance "
                                f"(record: {_repr.repr(row)})")

    def _batches(self, rows: list[Row]) -> list[Row]:
        import pyarrow as pa

        schema_in = self.plan.nodes[self.node.inputs[0]].schema
        batch = pa.RecordBatch.from_pylist(rows, schema=arrow_schema(schema_in or ()))
        given: Any = batch.to_pandas() if self.node.batch_format == "pandas" else batch
        try:
            result = self.node.fn(given)
        except Exception as exc:
            raise StepFunctionError(f"step '{self.node.name}' ({self._label()}) raised {type(exc).__name__}: "
                                    f"{exc}") from exc
        schema_out = arrow_schema(self.node.schema or ())
        if self.node.batch_format == "pandas":
            result = pa.RecordBatch.from_pandas(result, schema=schema_out, preserve_index=False)
        elif not isinstance(result, (pa.RecordBatch, pa.Table)):
            raise StepFunctionError(f"step '{self.node.name}' ({self._label()}) returned a "
                                    f"{type(result).__name__}; a map_batches step with format='arrow' must "
                                    "return a pyarrow.RecordBatch")
        return [conform_row(r, self.node.schema) for r in result.to_pylist()]


@registered(NativeStep)
class ExpressionStep(Operator):
    """filter, select and with_columns of column expressions."""

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        exprs = self.node.exprs
        if self.node.mode == "filter":
            return [r for r in inputs[0] if evaluate(exprs[0][1], r) is True]
        out = []
        for row in inputs[0]:
            values = {name: evaluate(e, row) for name, e in exprs}
            shaped = values if self.node.mode == "select" else {**row, **values}
            out.append(conform_row(shaped, self.node.schema) if self.node.schema else shaped)
            if self.node.mode == "select" and "_hr_event_time" in row:
                out[-1]["_hr_event_time"] = row["_hr_event_time"]
        return out


@registered(KeyByNode)
class KeyByStep(Operator):
    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        return inputs[0]


@registered(UnionNode)
class UnionStep(Operator):
    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        return [row for rows in inputs for row in rows]


@registered(JoinNode)
class TableJoinStep(Operator):
    """A stream joined with a static table: each record with every table row of its keys (a
    null key matches nothing); with how="left", an unmatched record with the table's fields null."""

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        on = self.node.on
        index: dict[tuple[Any, ...], list[Row]] = {}
        for row in inputs[1]:
            index.setdefault(tuple(row[k] for k in on), []).append(row)
        table_schema = self.plan.nodes[self.node.inputs[1]].schema or ()
        extra = [n for n, _ in table_schema if n not in on]
        out = []
        for row in inputs[0]:
            key = tuple(row[k] for k in on)
            matches = [] if None in key else index.get(key, [])
            for match in matches:
                out.append({**row, **{n: match.get(n) for n in extra}})
            if not matches and self.node.how == "left":
                out.append({**row, **{n: None for n in extra}})
        return out


@registered(SinkNode)
class SinkStep(Operator):
    """Hands a TestSink each micro-batch's rows under the batch's id, as on Spark (a null sink
    drops them)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.connector = self.node.connector if isinstance(self.node.connector, TestSink) else None
        if self.connector is not None:
            self.connector.batches.clear()  # a new run, as a fresh run on Spark

    def run(self, inputs: list[list[Row]], tick: Tick) -> list[Row]:
        if self.connector is not None and inputs[0]:
            self.connector.batches[tick.batch_id] = [conform_row(visible(r), self.node.schema) for r in inputs[0]]
        return []
