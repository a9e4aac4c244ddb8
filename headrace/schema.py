"""Record schemas and column types: an ordered tuple of (field name, type name), free of Spark.

Type names are Spark SQL's (``string``, ``long``, ``int``, ``double``, ``float``,
``boolean``, ``timestamp``, ``date``, ``binary``). A schema is given as a dict,
a DDL string (``"word string, n long"``), a dataclass or TypedDict class, or a
sequence of pairs.

``COLUMN_TYPES`` is the one map of what each type name means elsewhere: the Arrow type
its column travels as between the JVM and Python, and the Python type of its values.
``arrow_type``, ``arrow_schema`` and ``type_name_of_arrow`` read it both ways.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from headrace.errors import PlanError

Schema = tuple[tuple[str, str], ...]
UNKNOWN = "unknown"  # a field whose type the plan cannot tell without Spark

TYPE_ALIASES = {
    "string": "string", "str": "string",
    "long": "long", "bigint": "long", "int64": "long",
    "int": "int", "integer": "int", "int32": "int",
    "double": "double", "float64": "double",
    "float": "float", "float32": "float",
    "boolean": "boolean", "bool": "boolean",
    "timestamp": "timestamp",
    "date": "date",
    "binary": "binary", "bytes": "binary",
}



@dataclasses.dataclass(frozen=True)
class ColumnType:
    """One column type: its canonical name, the Arrow type of its column, the Python type of its values."""

    name: str
    arrow: pa.DataType
    python: type


COLUMN_TYPES: dict[str, ColumnType] = {t.name: t for t in (
    ColumnType("string", pa.string(), str),
    ColumnType("long", pa.int64(), int),
    ColumnType("int", pa.int32(), int),
    ColumnType("double", pa.float64(), float),
    ColumnType("float", pa.float32(), float),
    ColumnType("boolean", pa.bool_(), bool),
    ColumnType("timestamp", pa.timestamp("us", tz="UTC"), datetime.datetime),
    ColumnType("date", pa.date32(), datetime.date),
    ColumnType("binary", pa.binary(), bytes),
)}

# The type name of a Python type: the first in COLUMN_TYPES, so int -> long and float -> double.
PYTHON_TYPES: dict[Any, str] = {}
for _type in COLUMN_TYPES.values():
    PYTHON_TYPES.setdefault(_type.python, _type.name)
del _type

# Spark's names (``DataFrame.dtypes``) of integer columns: long is "bigint", int is "int".
INTEGER_DTYPES = frozenset({"bigint", "int", "smallint", "tinyint"})


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type of a column of the canonical type ``name``.

    >>> arrow_type("timestamp")
    TimestampType(timestamp[us, tz=UTC])
    """
    column_type = COLUMN_TYPES.get(name)
    if column_type is None:
        raise TypeError(f"no Arrow type for the column type {name!r}; use one of {', '.join(COLUMN_TYPES)}")
    return column_type.arrow


def arrow_schema(schema: Iterable[tuple[str, str]]) -> pa.Schema:
    """The Arrow schema of a record schema's columns."""
    return pa.schema([pa.field(name, arrow_type(type_name)) for name, type_name in schema])


def type_name_of_arrow(arrow_type: pa.DataType, *, widen: bool = False, where: str | None = None) -> str:
    """The canonical type name of a column of ``arrow_type``: the reverse of :func:`arrow_type`,
    also taking large_string as string and a timestamp of any unit or zone as timestamp.

    ``widen`` also takes the other types a Parquet file may hold, as the type they are read as:
    narrower or unsigned integers (int8, int16, uint8, uint16 as int; uint32, uint64 as long),
    float16 as float, date64 as date, large_binary as binary. Any other type raises a TypeError
    naming it, prefixed by ``where``.

    >>> type_name_of_arrow(pa.large_string()), type_name_of_arrow(pa.timestamp("ms"))
    ('string', 'timestamp')
    >>> type_name_of_arrow(pa.int16())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: unsupported Arrow type int16; a column's type must be one of string (string), long (int64), ...
    >>> type_name_of_arrow(pa.int16(), widen=True)
    'int'
    """
    for column_type in COLUMN_TYPES.values():
        if arrow_type == column_type.arrow:
            return column_type.name
    if pa.types.is_timestamp(arrow_type):
        return "timestamp"
    if pa.types.is_large_string(arrow_type):
        return "string"
    if widen:
        if pa.types.is_integer(arrow_type):
            unsigned32 = pa.types.is_unsigned_integer(arrow_type) and arrow_type.bit_width == 32
            return "int" if arrow_type.bit_width <= 32 and not unsigned32 else "long"
        if pa.types.is_float16(arrow_type):
            return "float"
        if pa.types.is_date(arrow_type):
            return "date"
        if pa.types.is_large_binary(arrow_type):
            return "binary"
    prefix = f"{where}: " if where else ""
    raise TypeError(f"{prefix}unsupported Arrow type {arrow_type}; a column's type must be one of "
                    f"{', '.join(f'{t.name} ({t.arrow})' for t in COLUMN_TYPES.values())}")


def normalise_type(name: str, where: str = "schema") -> str:
    """The canonical Spark type name for ``name``, or a PlanError naming ``where``."""
    canonical = TYPE_ALIASES.get(name.strip().lower())
    if canonical is None:
        known = ", ".join(sorted(set(TYPE_ALIASES.values())))
        raise PlanError(f"{where}: unknown type {name!r}; use one of {known}")
    return canonical


def _python_type_name(annotation: Any, where: str) -> str:
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _python_type_name(args[0], where)
    if annotation in PYTHON_TYPES:
        return PYTHON_TYPES[annotation]
    raise PlanError(f"{where}: cannot map the Python type {annotation!r} to a column type; "
                    "use str, int, float, bool, datetime, date or bytes")


def is_record_class(obj: Any) -> bool:
    """True for a dataclass or TypedDict class, which can describe a schema."""
    return isinstance(obj, type) and (dataclasses.is_dataclass(obj) or typing.is_typeddict(obj))


def schema_of(spec: Any, where: str = "schema") -> Schema:
    """Turn any accepted schema description into a Schema."""
    if isinstance(spec, str):
        pairs = []
        for part in spec.split(","):
            bits = part.split()
            if len(bits) != 2:
                raise PlanError(f"{where}: cannot read {part.strip()!r} in {spec!r}; write 'name type, name type'")
            pairs.append((bits[0].strip("`"), bits[1]))
        spec = pairs
    elif is_record_class(spec):
        hints = typing.get_type_hints(spec)
        return tuple((name, _python_type_name(t, where)) for name, t in hints.items())
    elif isinstance(spec, Mapping):
        spec = list(spec.items())
    if not isinstance(spec, Sequence) or not spec:
        raise PlanError(f"{where}: expected a dict, a DDL string, a dataclass or TypedDict, got {spec!r}")
    out = []
    for pair in spec:
        name, type_name = pair
        out.append((str(name), normalise_type(str(type_name), where)))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise PlanError(f"{where}: a field name appears twice in {names}")
    return tuple(out)


def field_names(schema: Schema | None) -> tuple[str, ...] | None:
    return None if schema is None else tuple(n for n, _ in schema)


def to_ddl(schema: Schema) -> str:
    return ", ".join(f"`{name}` {type_name}" for name, type_name in schema)
