"""What every keyed stateful processor of headrace shares on ``transformWithStateInPandas``.

State lives under its key (DESIGN.md): the processors group by the step's key columns, so
Spark's state store holds one small value per key, a micro-batch loads and writes only the
keys it touches, and Spark's offline state repartition rescales it. A step over a whole
stream (no key) groups by one constant.

* **Input.** ``prepare_input`` adds the event time in ms and the source partition each row
  comes from (read before the shuffle; a replayed batch has the same partitions). Within one
  source partition a key's rows keep their order through Spark's shuffle and its in-memory
  sort by key (both stable); ``group_frame`` orders a key's rows by source partition, so a
  key's records are handed over in the same order when a batch is replayed. Control rows
  stay out, except the test kit's clock rows, which are copied to every key the test
  source's records carry (see ``clock_keys``).
* **Per key.** ``KeyCell`` is a key's pickled state and the Spark event-time timer it has
  registered, read once and written once per call.
* **Output.** ``output_frame`` builds the pandas frame a processor yields.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.contract import CONTROL_COLUMN
from headrace.lazy_modules import LazyModule
from headrace.schema import INTEGER_DTYPES
from headrace.spark.clocks import uses_test_clock

if TYPE_CHECKING:
    import pandas as pd
else:
    pd = LazyModule("pandas")  # imported on first use: building and checking a plan needs no pandas

TIME = "_hr_t"
SEQUENCE = "_hr_part"  # the source partition of a row
GROUP = "_hr_group"  # the one group of a step over a whole stream


def grouping_columns(keys: list[str]) -> list[str]:
    return keys or [GROUP]


def clock_keys(plan: Any, keys: list[str]) -> list[tuple[Any, ...]] | None:
    """Under the test clock: the distinct key values of the test sources' records, the keys a
    clock row must reach (a key no record carries has no state to fire). None otherwise."""
    if not uses_test_clock(plan) or not keys:
        return None
    found: dict[tuple[Any, ...], None] = {}
    for source in plan.sources():
        for step in getattr(source.connector, "steps", ()):
            if isinstance(step, list):
                for record in step:
                    if all(k in record for k in keys):
                        found[tuple(record[k] for k in keys)] = None
    return list(found)


def _not_pushed(condition: Any) -> Any:
    """``condition`` in a form Catalyst cannot push below the watermark operator
    (``spark_partition_id`` is non-deterministic), so the watermark still sees control rows."""
    return condition | (F.spark_partition_id() < 0)


def prepare_input(df: DataFrame, keys: list[str], event_time: str | None,
                  clock_fan_out: list[tuple[Any, ...]] | None) -> DataFrame:
    """The input of a keyed processor: grouping columns, event time in ms, the sequence number;
    the control column only on the test kit's clock rows."""
    if CONTROL_COLUMN not in df.columns:
        df = df.withColumn(CONTROL_COLUMN, F.lit(None).cast("long"))
    df = df.withColumn(SEQUENCE, F.spark_partition_id())
    control = F.col(CONTROL_COLUMN)
    clock_row = control < 0  # see headrace.connectors.base.clock_control
    keep = control.isNull() | clock_row if clock_fan_out is not None or not keys else control.isNull()
    df = df.filter(_not_pushed(keep))
    if event_time:
        df = df.withColumn(TIME, F.unix_millis(F.col(f"`{event_time}`")))
        # a plain copy, not the watermark column: the processor judges lateness itself
        plain = F.when(control.isNull(), F.timestamp_millis(F.col(TIME)))
        df = df.drop(event_time).withColumn(event_time, plain)
    if not keys:
        return df.withColumn(GROUP, F.lit(0))
    if clock_fan_out:
        types = dict(df.dtypes)
        own = F.array(F.struct(*[F.col(f"`{k}`").alias(k) for k in keys]))
        every = F.array(*[F.struct(*[F.lit(v).cast(types[k]).alias(k) for k, v in zip(keys, values)])
                          for values in clock_fan_out])
        df = df.withColumn("_hr_keys", F.explode(F.when(clock_row, every).otherwise(own)))
        df = df.withColumns({k: F.col(f"_hr_keys.`{k}`") for k in keys}).drop("_hr_keys")
    return df


def group_frame(rows: Iterator[pd.DataFrame], columns: pd.Index) -> pd.DataFrame:
    """A key's rows of this micro-batch as one frame, in source order (see the module's docstring).
    ``columns`` are the input's column names, as an index built once (setting it costs less)."""
    frames = list(rows)
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    frame.columns = columns  # the pandas conversion renames columns that start with "_"
    if SEQUENCE not in columns:  # the step only counts its records: their order cannot matter
        return frame
    sequence = frame[SEQUENCE].to_numpy()
    if len(sequence) > 1 and bool((np.diff(sequence) < 0).any()):
        frame = frame.sort_values(SEQUENCE, kind="stable")
    return frame


def python_columns(frame: pd.DataFrame, fields: list[str], integers: frozenset[str] = frozenset()) -> list[list[Any]]:
    """The ``fields`` of the rows as lists of Python scalars, with nulls as None and the
    ``integers`` fields (decimals on the way, see ``exact_integers``) as int."""
    return [_python_values(frame[f], f in integers) for f in fields]


def records_of(frame: pd.DataFrame, fields: list[str], integers: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The rows as dicts of Python scalars (see ``python_columns``), built a column at a time."""
    if not fields:
        return [{} for _ in range(len(frame))]
    return [dict(zip(fields, row)) for row in zip(*python_columns(frame, fields, integers))]


def integer_fields(df: DataFrame, fields: list[str]) -> frozenset[str]:
    """The ``fields`` of ``df`` that hold integers (they travel as decimals, see ``exact_integers``)."""
    types = dict(df.dtypes)
    return frozenset(f for f in fields if types.get(f) in INTEGER_DTYPES)


def exact_integers(df: DataFrame, integers: frozenset[str]) -> DataFrame:
    """Integer fields travel as decimals: pandas would turn an integer column with nulls into
    float64, losing nulls and every integer beyond 2**53."""
    return df.withColumns({f: F.col(f"`{f}`").cast("decimal(20,0)") for f in integers}) if integers else df


def _python_values(column: pd.Series, integer: bool) -> list[Any]:
    values = column.tolist()
    if integer:  # decimals, see exact_integers
        return [None if v is None else int(v) for v in values]
    if column.dtype.kind in "fO" and column.isna().any():
        values = [None if v is None or v != v else v for v in values]
    return values


def data_rows(frame: pd.DataFrame) -> tuple[pd.DataFrame, int | None]:
    """A key's frame without its test-clock rows, and the test clock those rows move to, if any
    (a frame without the control column has no such rows)."""
    if CONTROL_COLUMN not in frame.columns:
        return frame, None
    controls = frame[CONTROL_COLUMN].to_numpy()
    control = ~np.isnan(controls) if controls.dtype.kind == "f" else pd.notna(controls)
    if not control.any():
        return frame, None
    return frame.loc[~control], int(-controls[control].min() - 1)  # see headrace.connectors.base.clock_control


def timed_records(data: pd.DataFrame, value_fields: list[str], integers: frozenset[str], key: Any,
                  untimed: Any) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """A key's data rows as (key, event time in ms or ``untimed``, record)."""
    records = records_of(data, value_fields, integers)
    times = (int(t) for t in data[TIME].tolist()) if TIME in data.columns else repeat(untimed)
    return zip(repeat(key), times, records)


def read_group(frame: pd.DataFrame, value_fields: list[str], integers: frozenset[str], key: Any,
               untimed: Any) -> tuple[Iterator[tuple[Any, Any, dict[str, Any]]], int | None]:
    """A key's frame as ``timed_records`` of its data rows, and the test clock its clock rows
    move to, if any."""
    data, clock = data_rows(frame)
    return timed_records(data, value_fields, integers, key, untimed), clock


def key_value(key: tuple[Any, ...], keys: list[str], integers: frozenset[str] = frozenset()) -> Any:
    """The key as the operator logic sees it: the value for one key field, a tuple for several,
    () for a whole stream; an integer field (``integers``) as an int, not the decimal it travels as."""
    if not keys:
        return ()
    values = tuple(int(v) if name in integers and v is not None else v for name, v in zip(keys, key))
    return values[0] if len(keys) == 1 else values


# Where the classes of operator state lived when older versions pickled them: their state
# still names the old module, so a checkpoint they wrote keeps loading.
_MOVED = {
    ("headrace.window_state", "WindowState"): "headrace.engine.window_panes",
    ("headrace.window_state", "Pane"): "headrace.engine.window_panes",
    ("headrace.process", "ProcessState"): "headrace.engine.process_logic",
}


class _MovedClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(_MOVED.get((module, name), module), name)


def load_state(data: bytes) -> Any:
    """Unpickle a key's stored operator state, also when an older version stored it."""
    try:
        return pickle.loads(data)
    except (ModuleNotFoundError, AttributeError):
        return _MovedClasses(io.BytesIO(data)).load()


class KeyCell:
    """A key's state (pickled) and the Spark event-time timer it registered, in one value state."""

    SCHEMA = "state binary, timer bigint"

    def __init__(self, handle: Any, name: str, ttl_ms: int | None = None) -> None:
        self.handle = handle
        self.value = handle.getValueState(name, self.SCHEMA, ttl_ms) if ttl_ms else handle.getValueState(
            name, self.SCHEMA)
        self.timer: int | None = None

    def load(self, fired_timer: int | None = None) -> Any:
        """The key's state, or None; ``fired_timer`` is the Spark timer that just expired."""
        stored = self.value.get()
        if stored is None:
            self.timer = None
            return None
        self.timer = stored[1]
        if fired_timer is not None and self.timer is not None and self.timer <= fired_timer:
            self.timer = None
        return load_state(stored[0])

    def save(self, state: Any, upcoming: float | None, watermark: int) -> None:
        """Store ``state`` (None: forget the key) and make sure a Spark timer wakes the key at
        ``upcoming`` (a watermark, ms). ``watermark`` is Spark's current one: a stored timer at
        or behind it has fired or fires at the end of this batch, so it wakes the key no more;
        and a timer is registered after it, since one at or behind it (Spark starts at 0, where
        headrace sees no watermark yet) would be dropped as it expires in this batch."""
        if upcoming is not None:
            due = int(max(upcoming, watermark + 1, 0))
            if self.timer is None or self.timer <= watermark or due < self.timer:
                self.timer = due
                self.handle.registerTimer(due)
        if state is None:
            self.value.clear()
            return
        self.value.update((pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL), self.timer))


def output_frame(rows: Sequence[dict[str, Any] | Sequence[Any]], columns: list[str],
                 timestamps: list[str]) -> pd.DataFrame:
    """The pandas frame a stateful processor yields, built as one object block (a frame per key
    and batch: its cost is per call). A row is a dict (a missing field is None) or the values
    in ``columns`` order; the ``timestamps`` columns that hold values become UTC timestamps
    (naive datetimes are read as UTC). Spark turns NaN and None into null alike."""
    values = np.empty((len(rows), len(columns)), dtype=object)
    for i, row in enumerate(rows):
        for j, value in enumerate([row.get(name) for name in columns] if isinstance(row, dict) else row):
            values[i, j] = value
    frame = pd.DataFrame(values, columns=columns)
    for name in timestamps:
        column = values[:, columns.index(name)]
        if any(v is not None for v in column):
            frame[name] = pd.to_datetime(frame[name], utc=True)
    return frame
