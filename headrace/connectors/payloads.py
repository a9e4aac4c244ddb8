"""Message payloads into Arrow record batches, for the message-system sources (Redis Streams,
NATS JetStream, RabbitMQ Streams, MQTT): one place for how a payload becomes a record.

``format="json"``: a payload is a JSON object read against the schema as JSON lines are
(``headrace/connectors/file_formats/jsonl.py``), through pyarrow's JSON reader when the
whole block allows it, else value by value. ``format="raw"``: the payload itself, as the one
column of the schema (binary, or text that must be UTF-8). A payload that does not fit is a
dead letter: ``dead`` maps its row to (raw text, error).

``record_batches`` assembles a source's output: the good rows with their metadata columns,
then the dead letters with their positions. Its two halves, ``data_batch`` and
``dead_letter_batch``, also serve PostgreSQL change data capture, whose records are not payloads.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from headrace.connectors.file_formats.jsonl import JSON_CONVERTERS
from headrace.connectors.file_formats.values import convert_values, show
from headrace.contract import DEAD_COLUMNS
from headrace.errors import PlanError
from headrace.schema import Schema, arrow_schema, schema_of

_NULL_LINE = re.compile(rb"^[ \t]*null[ \t]*$", re.MULTILINE)
_JSON_FAST_TYPES = {"string", "long", "int", "double", "float", "boolean", "timestamp"}

Dead = dict[int, tuple[str, str]]  # row -> (raw text, error)


def message_schema(schema: Any, metadata: Schema, where: str) -> Schema:
    """The data columns a source's ``schema=`` describes, refused when one takes the name of one of
    the source's own ``metadata`` columns."""
    data = schema_of(schema, where)
    taken = sorted({n for n, _ in data} & {n for n, _ in metadata})
    if taken:
        raise PlanError(f"{where}: the schema's field(s) {', '.join(taken)} clash with the source's own "
                        f"columns {', '.join(n for n, _ in metadata)}; rename them")
    return data


def text(value: bytes) -> str:
    return value.decode("utf-8", errors="replace")


class PayloadDecoder:
    """The data columns of a list of payloads, in ``format`` ("json" or "raw") against ``schema``."""

    def __init__(self, schema: Schema, format: str) -> None:
        self.schema, self.format = schema, format
        self.names = [name for name, _ in schema]
        self.fast_json = all(type_name in _JSON_FAST_TYPES for _, type_name in schema)

    def columns(self, payloads: list[bytes], dead: Dead) -> list[pa.Array]:
        """One Arrow array per schema column, a value per payload (rows already in ``dead`` are
        left out of the parsing and given nulls); rows that do not fit are added to ``dead``."""
        return self._json(payloads, dead) if self.format == "json" else self._raw(payloads, dead)

    def _raw(self, payloads: list[bytes], dead: Dead) -> list[pa.Array]:
        [(_, type_name)] = self.schema
        if type_name == "binary":
            return [pa.array(payloads, pa.binary())]
        texts: list[str | None] = []
        for row, payload in enumerate(payloads):
            try:
                texts.append(payload.decode("utf-8"))
            except UnicodeDecodeError as exc:
                dead.setdefault(row, (text(payload), f"invalid UTF-8 ({exc.reason})"))
                texts.append(None)
        return [pa.array(texts, pa.string())]

    def _json(self, payloads: list[bytes], dead: Dead) -> list[pa.Array]:
        if self.fast_json and not dead:
            columns = self._json_fast(payloads)
            if columns is not None:
                return columns
        objects: list[dict[str, Any]] = []
        for row, payload in enumerate(payloads):
            obj: Any = {}
            if row not in dead:
                try:
                    obj = json.loads(payload)
                except (ValueError, UnicodeDecodeError) as exc:
                    dead[row] = (text(payload), f"invalid JSON ({exc})")
                if row not in dead and type(obj) is not dict:
                    dead[row] = (text(payload), f"expected a JSON object, got {show(obj)}")
            objects.append(obj if type(obj) is dict else {})
        errors: dict[int, str] = {}
        columns = [convert_values(name, type_name, [o.get(name) for o in objects], JSON_CONVERTERS[type_name], errors)
                   for name, type_name in self.schema]
        for row, error in errors.items():
            dead.setdefault(row, (text(payloads[row]), error))
        return columns

    def _json_fast(self, payloads: list[bytes]) -> list[pa.Array] | None:
        """The columns through pyarrow's JSON reader, or None when it cannot take these payloads as
        the slow path would (a value spanning lines, a null, a bad value, an empty payload...)."""
        import pyarrow.json as pa_json

        block = b"\n".join(payloads)
        if not payloads or block.count(b"\n") != len(payloads) - 1 or b"\r" in block:
            return None
        if b"null" in block and _NULL_LINE.search(block):  # the regex scans byte by byte: only when needed
            return None
        if not all(map(bytes.strip, payloads)):  # (map and all: no Python code per payload)
            return None  # an empty payload: pyarrow would skip its line
        try:
            block.decode("utf-8")
            table = pa_json.read_json(
                io.BytesIO(block),
                read_options=pa_json.ReadOptions(use_threads=False, block_size=len(block) + 1),
                parse_options=pa_json.ParseOptions(explicit_schema=arrow_schema(self.schema),
                                                   unexpected_field_behavior="ignore"))
        except (pa.ArrowException, ValueError):
            return None
        if table.num_rows != len(payloads):
            return None  # several objects in one payload
        return [table.column(name).combine_chunks() for name in self.names]


def record_batches(arrow: pa.Schema, columns: list[pa.Array], metadata: list[pa.Array], dead: Dead,
                   positions: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The source's output of one read: the good rows (data ``columns`` and ``metadata``, one value
    per payload), then the dead letters, each with its ``positions`` entry. ``arrow`` is the
    source's batch schema: data, metadata, the control column and the dead-letter columns."""
    rows = len(positions)
    keep = [row for row in range(rows) if row not in dead]
    if dead:
        index = pa.array(keep, pa.int64())
        columns = [column.take(index) for column in columns]
        metadata = [column.take(index) for column in metadata]
    if keep:
        yield data_batch(arrow, columns, metadata)
    if dead:
        order = sorted(dead)
        yield dead_letter_batch(arrow, [dead[row][0] for row in order], [dead[row][1] for row in order],
                        [positions[row] for row in order])


def data_batch(arrow: pa.Schema, columns: list[pa.Array], metadata: list[pa.Array]) -> pa.RecordBatch:
    """Records of the batch schema ``arrow``: the data ``columns`` and ``metadata``, no control
    value and no dead letter."""
    rows = len(metadata[0])
    nulls = [pa.nulls(rows, pa.int64()), *(pa.nulls(rows, pa.string()) for _ in DEAD_COLUMNS)]
    return pa.RecordBatch.from_arrays([*columns, *metadata, *nulls], schema=arrow)


def dead_letter_batch(arrow: pa.Schema, raws: list[str], errors: list[str], positions: list[str]) -> pa.RecordBatch:
    """Dead letters of the batch schema ``arrow``: every other column null."""
    data = [pa.nulls(len(raws), field.type) for field in arrow][:len(arrow) - len(DEAD_COLUMNS)]
    return pa.RecordBatch.from_arrays([*data, pa.array(raws, pa.string()), pa.array(errors, pa.string()),
                                       pa.array(positions, pa.string())], schema=arrow)
