"""Fused Python stages: a chain of stateless Python steps run as one Arrow-batched function
(``mapInArrow``), so a record crosses between the JVM and Python once per chain.

Records reach row functions as :class:`Record` views over the Arrow batch: a column is
converted to Python values only when a step reads it. Filters and key functions keep the
batch columnar; a map turns the chain into rows until the stage ends or a batch step needs
a batch again. Control rows (``_hr_ctl`` set) bypass every step and are re-appended.
"""

from __future__ import annotations

import dataclasses
import datetime
import reprlib
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.contract import CONTROL_COLUMN
from headrace.errors import StepFunctionError

_repr = reprlib.Repr()
_repr.maxstring = 120
_repr.maxother = 120


@dataclass(frozen=True)
class StepSpec:
    """What a fused stage needs of one plan step."""

    name: str
    mode: str  # map, flat_map, filter, key, map_batches
    fn: Callable[..., Any]
    label: str
    batch_format: str | None
    output: pa.Schema | None  # None: same columns as the step's input


_EPOCH_US: dict[str, datetime.datetime] = {}  # time zone ("" for none) -> the epoch, for _to_python


def _to_python(array: pa.Array) -> list[Any]:
    """``array.to_pylist()``, faster for timestamps in microseconds (the type Spark hands over).

    pyarrow builds each time-zone-aware datetime through the time zone's rules (about 3 µs a
    value); adding each value to the epoch gives the same datetime, with the same tzinfo, in
    about a sixth of that, for UTC and for naive timestamps.
    """
    kind = array.type
    if pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz in (None, "UTC"):
        zone = kind.tz or ""
        epoch = _EPOCH_US.get(zone)
        if epoch is None:
            epoch = pa.scalar(0, kind).as_py()
            _EPOCH_US[zone] = epoch
        delta = datetime.timedelta
        values = array.cast(pa.int64()).to_pylist()
        return [None if v is None else epoch + delta(microseconds=v) for v in values]
    return array.to_pylist()


class _Columns:
    """An Arrow batch whose columns become Python lists on first use (``cache``)."""

    def __init__(self, batch: pa.RecordBatch) -> None:
        self.batch = batch
        self.names = batch.schema.names
        self.cache: dict[str, list[Any]] = {}

    def column(self, name: str) -> list[Any]:
        values = self.cache.get(name)
        if values is None:
            values = _to_python(self.batch.column(name))
            self.cache[name] = values
        return values


class Record(MutableMapping[str, Any]):
    """One record of a batch, read like a dict; writes go to an overlay."""

    __slots__ = ("_columns", "_index", "_overlay")

    def __init__(self, columns: _Columns, index: int) -> None:
        self._columns, self._index = columns, index
        self._overlay: dict[str, Any] | None = None

    def __getitem__(self, key: str) -> Any:
        if self._overlay is None:  # the common case: a read of a batch column
            values = self._columns.cache.get(key)
            if values is not None:
                return values[self._index]
        elif key in self._overlay:
            value = self._overlay[key]
            if value is _DELETED:
                raise KeyError(key)
            return value
        if key not in self._columns.names:
            raise KeyError(key)
        return self._columns.column(key)[self._index]

    def __setitem__(self, key: str, value: Any) -> None:
        if self._overlay is None:
            self._overlay = {}
        self._overlay[key] = value

    def __delitem__(self, key: str) -> None:
        self[key]  # raises KeyError when absent
        self.__setitem__(key, _DELETED)

    def __iter__(self) -> Iterator[str]:
        overlay = self._overlay or {}
        for name in self._columns.names:
            if overlay.get(name) is not _DELETED:
                yield name
        for name, value in overlay.items():
            if name not in self._columns.names and value is not _DELETED:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return repr(dict(self))


_DELETED = object()


def _as_dict(value: Any, step: StepSpec, record: Any) -> Mapping[str, Any]:
    if type(value) is dict or isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return getattr(value, "__dict__", None) or dataclasses.asdict(value)
    kind = "a flat_map step must yield" if step.mode == "flat_map" else "a map step must return"
    raise StepFunctionError(
        f"step '{step.name}' ({step.label}) returned {_article(value)}; {kind} a dict or a dataclass instance "
        f"(record: {_repr.repr(_plain(record))})")


def _article(value: Any) -> str:
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name} ({_repr.repr(value)})"


def _plain(record: Any) -> Any:
    return dict(record) if isinstance(record, Mapping) else record


def _failed(step: StepSpec, record: Any, exc: Exception) -> StepFunctionError:
    return StepFunctionError(f"step '{step.name}' ({step.label}) raised {type(exc).__name__}: {exc} "
                             f"(record: {_repr.repr(_plain(record))})")


def _call(step: StepSpec, record: Any) -> Any:
    try:
        return step.fn(record)
    except StepFunctionError:
        raise
    except Exception as exc:
        raise _failed(step, record, exc) from exc


def _apply(step: StepSpec, records: Iterable[Any]) -> list[Any]:
    """``[step.fn(r) for r in records]``, with a failure reported like ``_call``'s (one
    ``try`` for the whole loop: the per-record cost is the user's function alone)."""
    fn = step.fn
    results: list[Any] = []
    append = results.append
    record = None
    try:
        for record in records:
            append(fn(record))
    except StepFunctionError:
        raise
    except Exception as exc:
        raise _failed(step, record, exc) from exc
    return results


def _map(step: StepSpec, rows: list[Any]) -> list[Any]:
    """A map step over rows: what it returns, as dicts (``_apply`` with the check inside)."""
    fn = step.fn
    results: list[Any] = []
    append = results.append
    record = None
    try:
        for record in rows:
            value = fn(record)
            append(value if type(value) is dict else _as_dict(value, step, record))
    except StepFunctionError:
        raise
    except Exception as exc:
        raise _failed(step, record, exc) from exc
    return results


def _mask(flags: list[Any]) -> pa.Array:
    """A filter's results as an Arrow boolean mask, by truth value (None: dropped)."""
    try:
        return pa.array(flags, pa.bool_())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        return pa.array([bool(f) for f in flags], pa.bool_())


class FusedStage:
    """The function given to ``mapInArrow`` for one chain of steps."""

    def __init__(self, steps: list[StepSpec], output: pa.Schema, has_control: bool) -> None:
        self.steps, self.output, self.has_control = steps, output, has_control

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            control = None
            if self.has_control:
                is_control = batch.column(CONTROL_COLUMN).is_valid()
                control = batch.column(CONTROL_COLUMN).filter(is_control)
                batch = batch.filter(pa.compute.invert(is_control)).drop_columns([CONTROL_COLUMN])
            result = self.run(batch)
            if self.has_control:
                result = result.append_column(CONTROL_COLUMN, pa.nulls(result.num_rows, pa.int64()))
                if control is not None and len(control):
                    yield self._control_batch(control)
            if result.num_rows:
                yield result

    def _control_batch(self, control: pa.Array) -> pa.RecordBatch:
        columns = [pa.nulls(len(control), field.type) for field in self.output]
        return pa.RecordBatch.from_arrays([*columns, control.cast(pa.int64())],
                                          names=[*self.output.names, CONTROL_COLUMN])

    def run(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        rows: list[Any] | None = None  # None while the data is in columnar form (``batch``)
        schema = batch.schema
        last_row_step: StepSpec | None = None
        for step in self.steps:
            if step.mode == "map_batches":
                if rows is not None:
                    batch = _to_batch(rows, schema, last_row_step)
                    rows = None
                batch = _call_batch(step, batch)
                schema = batch.schema
            elif rows is None and step.mode in ("filter", "key"):
                columns = _Columns(batch)
                records = [Record(columns, i) for i in range(batch.num_rows)]
                if step.mode == "filter":
                    batch = batch.filter(_mask(_apply(step, records)))
                else:
                    keys = [_key(k) for k in _apply(step, records)]
                    batch = batch.append_column("key", pa.array(keys, pa.string()))
                schema = batch.schema
            else:
                if rows is None:
                    columns = _Columns(batch)
                    rows = [Record(columns, i) for i in range(batch.num_rows)]
                rows = self._row_step(step, rows)
                if step.output is not None:
                    schema, last_row_step = step.output, step
                elif step.mode == "key":
                    schema = schema.append(pa.field("key", pa.string()))
        if rows is not None:
            batch = _to_batch(rows, self.output, last_row_step)
        return batch.select(self.output.names).cast(self.output) if batch.schema != self.output else batch

    @staticmethod
    def _row_step(step: StepSpec, rows: list[Any]) -> list[Any]:
        if step.mode == "filter":
            return [r for r, keep in zip(rows, _apply(step, rows)) if keep]
        if step.mode == "key":
            for r, key in zip(rows, _apply(step, rows)):
                r["key"] = _key(key)
            return rows
        if step.mode == "map":
            return _map(step, rows)
        out: list[Any] = []
        for r in rows:
            produced = _call(step, r)
            if produced is None:
                continue
            try:
                iterator = iter(produced)
            except TypeError:
                raise StepFunctionError(
                    f"step '{step.name}' ({step.label}) returned {_article(produced)}; a flat_map step must return "
                    f"an iterable of dicts (record: {_repr.repr(_plain(r))})") from None
            out.extend(_as_dict(item, step, r) for item in iterator)
        return out


def _key(value: Any) -> str | None:
    return None if value is None else str(value)


def _to_batch(rows: list[Any], schema: pa.Schema, step: StepSpec | None) -> pa.RecordBatch:
    plain = [r if isinstance(r, dict) else dict(r) for r in rows]
    try:
        return pa.RecordBatch.from_pylist(plain, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        pass
    for row in plain:  # find the record that does not fit, to name it
        for field in schema:
            try:
                pa.array([row.get(field.name)], field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                where = f"step '{step.name}' ({step.label})" if step else "a step"
                value = row.get(field.name)
                raise StepFunctionError(
                    f"{where} returned field {field.name!r} = {_repr.repr(value)} ({type(value).__name__}), which "
                    f"does not fit its declared type {field.type} (record: {_repr.repr(row)})") from None
    raise StepFunctionError(f"could not build the output of step '{step.name if step else '?'}'")


def _call_batch(step: StepSpec, batch: pa.RecordBatch) -> pa.RecordBatch:
    argument: Any = batch.to_pandas() if step.batch_format == "pandas" else batch
    result = _call(step, argument)
    if step.batch_format == "pandas":
        import pandas as pd
        if not isinstance(result, pd.DataFrame):
            raise StepFunctionError(f"step '{step.name}' ({step.label}) returned {_article(result)}; a map_batches "
                                    "step with format='pandas' must return a pandas DataFrame")
        schema = step.output or batch.schema
        try:
            return pa.RecordBatch.from_pandas(result, schema=schema, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
            raise StepFunctionError(f"step '{step.name}' ({step.label}) returned a DataFrame that does not fit the "
                                    f"schema {schema}: {exc}") from None
    if isinstance(result, pa.Table):
        result = result.combine_chunks().to_batches()[0] if result.num_rows else pa.RecordBatch.from_pylist(
            [], schema=result.schema)
    if not isinstance(result, pa.RecordBatch):
        raise StepFunctionError(f"step '{step.name}' ({step.label}) returned {_article(result)}; a map_batches step "
                                "with format='arrow' must return a pyarrow.RecordBatch")
    return result
