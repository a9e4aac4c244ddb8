"""Record schemas: an ordered tuple of (field name, type name), free of Spark.

Type names are Spark SQL's (``string``, ``long``, ``int``, ``double``, ``float``,
``boolean``, ``timestamp``, ``date``, ``binary``). A schema is given as a dict,
a DDL string (``"word string, n long"``), a dataclass or TypedDict class, or a
sequence of pairs.
"""

from __future__ import annotations

import dataclasses
import datetime
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from headrace.errors import PlanError

Schema = tuple[tuple[str, str], ...]

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

PYTHON_TYPES: dict[Any, str] = {
    str: "string", int: "long", float: "double", bool: "boolean",
    datetime.datetime: "timestamp", datetime.date: "date", bytes: "binary",
}


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
