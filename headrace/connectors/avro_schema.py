"""The columns of an Avro record schema (for Kafka values in Avro, decoded by Spark's ``from_avro``).

Plain Avro binary values (no Confluent Schema Registry framing: strip its 5-byte prefix, or
read ``format="raw"``). Fields of the primitive types and the logical timestamp and date
types map to headrace's column types; a union with ``null`` is that type, nullable.

>>> avro_columns('{"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}, '
...              '{"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}}, '
...              '{"name": "note", "type": ["null", "string"]}]}', "Kafka('t')")
(('id', 'long'), ('at', 'timestamp'), ('note', 'string'))
"""

from __future__ import annotations

import json
from typing import Any

from headrace.errors import PlanError
from headrace.schema import Schema

PRIMITIVES = {"long": "long", "int": "int", "string": "string", "double": "double", "float": "float",
              "boolean": "boolean", "bytes": "binary"}
LOGICAL = {"timestamp-millis": "timestamp", "timestamp-micros": "timestamp", "date": "date"}


def _column_type(field_type: Any, name: str, where: str) -> str:
    if isinstance(field_type, list):  # a union: only [null, T] (either order) maps to a column
        others = [t for t in field_type if t != "null"]
        if len(others) == 1:
            return _column_type(others[0], name, where)
    elif isinstance(field_type, dict) and field_type.get("logicalType") in LOGICAL:
        return LOGICAL[field_type["logicalType"]]
    elif isinstance(field_type, dict) and field_type.get("type") in PRIMITIVES:
        return PRIMITIVES[field_type["type"]]
    elif isinstance(field_type, str) and field_type in PRIMITIVES:
        return PRIMITIVES[field_type]
    raise PlanError(f"{where}: the Avro field {name!r} has the type {json.dumps(field_type)}, which has no "
                    f"column type here; use {', '.join(PRIMITIVES)}, a timestamp or date logical type, or a "
                    "union of one of them with null")


def avro_columns(avro_schema: str, where: str) -> Schema:
    """The columns of an Avro record schema given as JSON text, or a PlanError naming ``where``."""
    try:
        parsed = json.loads(avro_schema)
    except (TypeError, ValueError) as exc:
        raise PlanError(f"{where}: avro_schema must be an Avro record schema in JSON: {exc}") from None
    if not isinstance(parsed, dict) or parsed.get("type") != "record" or not isinstance(parsed.get("fields"), list):
        raise PlanError(f"{where}: avro_schema must be an Avro record schema ({{\"type\": \"record\", \"name\": ..., "
                        f"\"fields\": [...]}}), got {avro_schema!r}")
    return tuple((str(f["name"]), _column_type(f.get("type"), str(f.get("name")), where)) for f in parsed["fields"])
