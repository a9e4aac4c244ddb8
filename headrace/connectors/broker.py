"""What the message-system connectors share: Redis Streams, NATS JetStream, RabbitMQ Streams, MQTT
and PostgreSQL change data capture (``redis_streams.py``, ``nats_jetstream.py``,
``rabbitmq_streams.py``, ``mqtt.py``, ``postgres_cdc.py``). Each of those modules keeps its
client calls, its offsets and its own options.

A source is three classes. Its connector (:class:`Source`) is a frozen dataclass whose
fields are checked when the plan is built; its Spark options are those fields as text. Its Spark
data source (:class:`DataSource`) gives Spark the columns (the data's, the source's own
metadata, the control and dead-letter columns) and the reader. Its reader (:class:`Reader`)
reads the options back and plans batches by position: ``latestOffset`` hands out nothing new
once the stop file exists, and otherwise asks the source for the end of a batch of at most the
records the batch may take. How a payload becomes a record or a dead letter is in
``headrace/connectors/payloads.py``.

A sink (:class:`Sink`) publishes each row as its JSON object (Spark's ``to_json``) and names
itself, in its messages and its commits, by the step it is bound to (``headrace/spark/writer.py``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any, ClassVar, cast

from headrace.connectors.base import StepSink
from headrace.connectors.payloads import message_schema
from headrace.contract import Guarantee, SourceConnector
from headrace.errors import PlanError, SetupError, SinkError
from headrace.schema import Schema, schema_of, to_ddl
from headrace.sink_step import SinkStep


def client_library(module: str, needing: str, extra: str, requirement: str) -> Any:
    """The client library ``module``, imported when first used, so that headrace runs without the
    ones it does not use; without it, a SetupError that says how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = requirement.partition(">=")[0]
        raise SetupError(f"{needing} the Python package {package}: pip install 'headrace[{extra}]' "
                         f"(or pip install '{requirement}')") from None


# ----------------------------------------------------------------------------------------
# Options: a connector's fields as text, and back.


def option_text(value: Any) -> str:
    """A connector's field as the text of a Spark option: names and schemas as JSON lists, None as "".

    >>> option_text(("a", "b")), option_text((("id", "long"),)), option_text(None), option_text(3)
    ('["a", "b"]', '[["id", "long"]]', '', '3')
    """
    if isinstance(value, tuple):
        return json.dumps(value)
    return "" if value is None else str(value)


def options_schema(options: Mapping[str, str]) -> Schema:
    """The data columns the option ``schema`` holds (JSON pairs); none when it is empty."""
    pairs = json.loads(options.get("schema") or "[]")
    return schema_of([tuple(pair) for pair in pairs]) if pairs else ()


def name_list(names: str | Sequence[str] | None) -> tuple[str, ...]:
    """The names (topics, subjects, streams, tables) given as one, a comma-separated list or a
    list, stripped, the empty ones dropped (None: none).

    >>> name_list("a, b,"), name_list(["c ", ""]), name_list(None)
    (('a', 'b'), ('c',), ())
    """
    if names is None:
        return ()
    stripped = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
    return tuple(n for n in stripped if n)


def check_reading(where: str, format: str, formats: tuple[str, ...], schema: Any, start: str,
                  starts: tuple[str, ...]) -> None:
    """Refuse an unknown ``format`` or ``start``, and a missing ``schema``."""
    if format not in formats:
        raise PlanError(f"{where}: unknown format {format!r}; use one of {', '.join(formats)}")
    if schema is None:
        raise PlanError(f"{where}: needs schema=, e.g. schema='user string, amount long'")
    if start not in starts:
        raise PlanError(f"{where}: start={start!r} is not one of {', '.join(starts)}")


def check_format(where: str, format: str, formats: tuple[str, ...], schema: Any, json_needs: str,
                 raw_columns: str) -> None:
    """Refuse an unknown ``format``, a "json" one without ``schema`` (``json_needs`` says what to
    give) and a "raw" one with a ``schema`` (its columns are fixed: ``raw_columns`` says which)."""
    if format not in formats:
        raise PlanError(f"{where}: unknown format {format!r}; use one of {', '.join(formats)}")
    if format == "json" and schema is None:
        raise PlanError(f"{where}: {json_needs}")
    if format == "raw" and schema is not None:
        raise PlanError(f"{where}: {raw_columns}; drop schema=")


def check_batch_sizes(where: str, max_records_per_batch: int | None, partition_records: int | None = None) -> None:
    """Refuse a cap of records per batch, or of positions per Spark partition, below 1 (None: no cap)."""
    if max_records_per_batch is not None and max_records_per_batch < 1:
        raise PlanError(f"{where}: max_records_per_batch must be at least 1, got {max_records_per_batch}")
    if partition_records is not None and partition_records < 1:
        raise PlanError(f"{where}: partition_records must be at least 1, got {partition_records}")


def payload_schema(where: str, schema: Any, metadata: Schema, format: str, raw_wanted: str) -> Schema:
    """The data columns ``schema`` gives (``message_schema``). With ``format="raw"`` they must be
    one string or binary column; ``raw_wanted`` ends the error otherwise, with ``{schema}`` standing
    for the schema given."""
    data = message_schema(schema, metadata, where)
    if format == "raw" and (len(data) != 1 or data[0][1] not in ("string", "binary")):
        raise PlanError(f"{where}: format='raw' puts the payload in one column: the schema must be one "
                        + raw_wanted.replace("{schema}", repr(to_ddl(data))))
    return data


# ----------------------------------------------------------------------------------------
# Sources.

class Source(SourceConnector):
    """A message-system source's connector: a frozen dataclass (``init=False``) whose ``__init__``
    checks its arguments, then sets its fields (``_assign``). Its Spark options are its fields as
    text (``data_schema`` as ``schema``). A subclass names the columns it adds to each record and
    its Spark data source in ``headrace/connectors/spark_readers/``:
    ``class Nats(broker.Source, metadata=METADATA, spark_reader="nats_jetstream:NatsDataSource")``."""

    guarantee = Guarantee.EXACTLY_ONCE
    emits_dead_letters = True
    metadata: ClassVar[Schema]  # the columns the source adds to each record
    data_schema: Schema

    def __init_subclass__(cls, *, metadata: Schema | None = None, spark_reader: str | None = None,
                          **more: Any) -> None:
        super().__init_subclass__(**more)
        if metadata is not None:
            cls.metadata = metadata
        if spark_reader is not None:
            cls.spark_data_source = f"headrace.connectors.spark_readers.{spark_reader}"

    def _assign(self, **values: Any) -> None:
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def schema(self) -> Schema:
        return (*self.data_schema, *self.metadata)

    def options(self) -> dict[str, str]:
        return {("schema" if field.name == "data_schema" else field.name): option_text(getattr(self, field.name))
                for field in fields(cast(Any, self))}


# ----------------------------------------------------------------------------------------
# Sinks.

def check_key(where: str, key: Any) -> None:
    """Refuse a ``key=`` that is neither None nor a column name."""
    if key is not None and (not isinstance(key, str) or not key):
        raise PlanError(f"{where}: key must be a column name, got {key!r}")


def json_value(df: Any) -> Any:
    """A column holding each row of ``df`` as its JSON object (Spark's ``to_json``)."""
    from pyspark.sql import functions as F

    return F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]))


def keyed_json(df: Any, key: str | None, where: str) -> Any:
    """The rows of ``df`` as ``value``, their JSON object, and ``key``, the text of the column
    ``key`` (when there is one)."""
    from pyspark.sql import functions as F

    value = json_value(df).alias("value")
    if key is None:
        return df.select(value)
    if key not in df.columns:
        raise SinkError(f"{where}: the key column {key!r} is not among the rows' columns {list(df.columns)}")
    return df.select(value, F.col(f"`{key}`").cast("string").alias("key"))


class Sink(StepSink):
    """A message-system sink. ``bind`` gives a copy named after its step, which is what it
    publishes (and commits) under; its connection (``_connection``, the driver's) is not copied
    nor pickled."""

    native_format = None

    def __init__(self, name: str | None) -> None:
        self._name = name
        self._step: SinkStep | None = None
        self._connection: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_connection": None}

    def _reset(self) -> None:
        self._connection = None
