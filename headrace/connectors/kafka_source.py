"""Apache Kafka: a source lowered to Spark's own Kafka source (``spark-sql-kafka-0-10``).

**Source.** ``Kafka(topics, schema=...)`` reads with ``spark.readStream.format("kafka")``:
Spark keeps the offsets (topic, partition, offset) in its offset log, so a replayed batch
reads the same records, and nothing is committed to Kafka's consumer groups. The value is
decoded by Spark, never by Python: ``format="json"`` (``from_json`` against ``schema``;
a value that is not a JSON object, has a field of the wrong type, or is missing (a
tombstone) goes to the dead letters with its topic, partition and offset; a field missing
from the object is null, as a JSON null is), or ``"raw"``
(the key and the value as bytes), or ``"avro"`` (``from_avro`` against ``avro_schema``, an
Avro record schema in JSON whose fields are the columns: ``headrace/connectors/avro_schema.py``;
a value that does not decode goes to the dead letters). ``metadata`` adds Kafka's own fields
as ``kafka_*`` columns, for example ``kafka_timestamp`` to use as event time.

Lag: Spark commits no offsets to Kafka, so the progress reports carry the consumer lag,
the latest offsets Spark saw minus the offsets the batch read (``lag``).

The connector jar comes from ``headrace.environment.jars`` (``spark.jars.packages`` or a local
folder of fetched jars).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.connectors import broker
from headrace.connectors.avro_schema import avro_columns
from headrace.contract import CONTROL_COLUMN, DEAD_COLUMNS, Guarantee, SourceConnector, SourceContext
from headrace.environment import jars
from headrace.errors import PlanError
from headrace.schema import Schema, schema_of, to_ddl

DEFAULT_SERVERS = "127.0.0.1:9092"
FORMATS = ("json", "avro", "raw")
# Kafka's own fields, as the source's kafka_* columns (name -> (Spark column, type)).
METADATA = {
    "key": ("key", "string"),
    "topic": ("topic", "string"),
    "partition": ("partition", "int"),
    "offset": ("offset", "long"),
    "timestamp": ("timestamp", "timestamp"),
    "headers": ("headers", "string"),  # JSON: [{"key": ..., "value": ...}], values as UTF-8
}
RAW_SCHEMA: Schema = (("key", "binary"), ("value", "binary"))
_CORRUPT = "_hr_corrupt"  # from_json's column for a value it could not parse


def _starting(starting: Any, where: str) -> str:
    """Spark's ``startingOffsets`` or ``startingTimestamp`` value for ``starting``: "earliest",
    "latest", a datetime or epoch ms (the first record at or after it, per partition), or
    {topic: {partition: offset}}."""
    if starting in ("earliest", "latest"):
        return str(starting)
    if isinstance(starting, datetime.datetime):
        if starting.tzinfo is None:
            starting = starting.replace(tzinfo=datetime.UTC)
        return str(int(starting.timestamp() * 1000))
    if isinstance(starting, int) and not isinstance(starting, bool):
        return str(starting)
    if isinstance(starting, Mapping):
        return json.dumps({str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in starting.items()},
                          sort_keys=True)
    raise PlanError(f"{where}: starting={starting!r} is not 'earliest', 'latest', a datetime, epoch "
                    "milliseconds or {topic: {partition: offset}}")


@dataclass(frozen=True, init=False)
class Kafka(SourceConnector):
    """Records from Kafka topics, through Spark's Kafka source.

    ``topics`` (a name, a comma-separated list or a list) or ``pattern`` (a regular
    expression of topic names); ``servers``: the bootstrap servers. ``starting``: where a
    new pipeline starts ("earliest", "latest", a datetime or epoch ms, or {topic:
    {partition: offset}}); a restarted one continues from its checkpoint.
    ``max_records_per_batch``: Spark's ``maxOffsetsPerTrigger``. ``options``: more of
    Spark's Kafka source options (``kafka.*`` consumer settings among them).
    """

    topics: tuple[str, ...]
    pattern: str | None
    servers: str
    format: str
    data_schema: Schema | None
    metadata: tuple[str, ...]
    starting: str
    max_records_per_batch: int | None
    extra: tuple[tuple[str, str], ...]
    avro_schema: str | None

    guarantee = Guarantee.EXACTLY_ONCE
    drains_on_stop = False  # Spark's source plans every batch up to the latest offsets
    real_time = True
    lowered_as = "Spark's own Kafka source (spark-sql-kafka-0-10)"

    def __init__(self, topics: str | Sequence[str] | None = None, *, schema: Any = None, format: str = "json",
                 servers: str = DEFAULT_SERVERS, pattern: str | None = None, metadata: Sequence[str] = (),
                 starting: Any = "earliest", max_records_per_batch: int | None = None,
                 options: Mapping[str, Any] | None = None, avro_schema: str | None = None) -> None:
        names = broker.name_list(topics)
        where = f"Kafka({', '.join(names) or pattern!r})"
        if bool(names) == bool(pattern):
            raise PlanError(f"{where}: give topics= or pattern=, not {'both' if names else 'neither'}")
        broker.check_format(where, format, FORMATS, schema,
                            "a json source needs schema=, e.g. schema='user string, amount long'",
                            "a raw source has the columns key and value (bytes)")
        if (format == "avro") != (avro_schema is not None):
            raise PlanError(f"{where}: " + ("an avro source needs avro_schema=, an Avro record schema in JSON"
                                            if format == "avro" else "avro_schema= goes with format='avro'"))
        if format == "avro" and schema is not None:
            raise PlanError(f"{where}: an avro source takes its columns from avro_schema=; drop schema=")
        if format == "avro":
            schema = avro_columns(str(avro_schema), where)
        unknown = [m for m in metadata if m not in METADATA]
        if unknown:
            raise PlanError(f"{where}: unknown metadata {unknown}; choose from {', '.join(METADATA)}")
        broker.check_batch_sizes(where, max_records_per_batch)
        set_field = object.__setattr__
        set_field(self, "topics", names)
        set_field(self, "pattern", pattern)
        set_field(self, "servers", servers)
        set_field(self, "format", format)
        set_field(self, "data_schema", None if schema is None else schema_of(schema, where))
        set_field(self, "metadata", tuple(metadata))
        set_field(self, "starting", _starting(starting, where))
        set_field(self, "max_records_per_batch", max_records_per_batch)
        set_field(self, "extra", tuple(sorted((str(k), str(v)) for k, v in (options or {}).items())))
        set_field(self, "avro_schema", avro_schema)

    # -- what headrace knows about the source ------------------------------------------------

    @property
    def emits_dead_letters(self) -> bool:  # type: ignore[override]
        return self.format != "raw"

    def schema(self) -> Schema:
        data = RAW_SCHEMA if self.format == "raw" else self.data_schema or ()
        return (*data, *((f"kafka_{m}", METADATA[m][1]) for m in self.metadata))

    def spark_packages(self) -> list[jars.Package]:
        return [jars.KAFKA, jars.AVRO] if self.format == "avro" else [jars.KAFKA]

    def spark_options(self) -> dict[str, str]:
        """The options of Spark's Kafka source."""
        options = {"kafka.bootstrap.servers": self.servers, "includeHeaders": str("headers" in self.metadata).lower(),
                   "failOnDataLoss": "true"}
        if self.topics:
            options["subscribe"] = ",".join(self.topics)
        else:
            options["subscribePattern"] = str(self.pattern)
        key = "startingOffsets" if self.starting in ("earliest", "latest") or self.starting.startswith("{") \
            else "startingTimestamp"
        options[key] = self.starting
        if self.max_records_per_batch:
            options["maxOffsetsPerTrigger"] = str(self.max_records_per_batch)
        options.update(dict(self.extra))
        return options

    def options(self) -> dict[str, str]:
        return {**self.spark_options(), "format": self.format, "schema": to_ddl(self.schema())}

    def offset_identity(self) -> dict[str, Any]:
        """An offset is a (topic, partition, offset) position: which topics and how a value
        becomes a record fix what it means; the servers, batch sizes and consumer settings do not."""
        return {"topics": list(self.topics), "pattern": self.pattern, "format": self.format,
                "schema": to_ddl(self.schema()), **({"avro_schema": self.avro_schema} if self.avro_schema else {})}

    def describe(self) -> dict[str, Any]:
        return {"type": "Kafka", "topics": list(self.topics), "pattern": self.pattern, "servers": self.servers,
                "format": self.format, "schema": to_ddl(self.schema()), "starting": self.starting,
                "max_records_per_batch": self.max_records_per_batch, "guarantee": self.guarantee.value,
                "dead_letters": self.emits_dead_letters}

    def prepare(self, context: SourceContext) -> None:
        """Nothing to check on the driver: Spark's source reports unreachable servers itself."""

    # -- the Spark side ---------------------------------------------------------------------

    def read_stream(self, spark: Any, context: SourceContext) -> Any:
        from pyspark.sql import functions as F

        jars.require(spark, self.spark_packages(), f"source '{context.source_name}'")
        raw = spark.readStream.format("kafka").options(**self.spark_options()).load()
        position = F.concat_ws("", F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit("@"),
                               F.col("offset").cast("string"))
        metadata = [_metadata_column(m).alias(f"kafka_{m}") for m in self.metadata]
        control = F.lit(None).cast("long").alias(CONTROL_COLUMN)
        if self.format == "raw":
            return raw.select(F.col("key"), F.col("value"), *metadata, control)
        names = [n for n, _ in self.data_schema or ()]
        if self.format == "avro":
            from pyspark.sql.avro.functions import from_avro

            decoded = raw.select("*", from_avro(F.col("value"), str(self.avro_schema), {"mode": "PERMISSIVE"})
                                 .alias("_hr_value"))
            # from_avro (PERMISSIVE) gives a value it cannot decode as null or a record of nulls; a
            # real record whose every field is null is taken for one too (docs/connectors.md).
            every_field_null = F.lit(True)
            for name in names:
                every_field_null = every_field_null & F.col(f"_hr_value.`{name}`").isNull()
            bad = F.col("value").isNull() | F.col("_hr_value").isNull() | every_field_null
            error = f"the value is not an Avro record of the schema {to_ddl(self.data_schema or ())}"
        else:
            ddl = to_ddl((*(self.data_schema or ()), (_CORRUPT, "string")))
            parsed = F.from_json(F.col("value").cast("string"), ddl,
                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
            decoded = raw.select("*", parsed.alias("_hr_value"))
            bad = F.col("value").isNull() | F.col(f"_hr_value.{_CORRUPT}").isNotNull()
            error = f"the value is not a JSON object of the schema {to_ddl(self.data_schema or ())}"
        dead = [F.when(bad, F.col("value").cast("string")).alias(DEAD_COLUMNS[0]),
                F.when(bad, F.lit(error)).alias(DEAD_COLUMNS[1]),
                F.when(bad, position).alias(DEAD_COLUMNS[2])]
        # A bad row's fields are left as from_json made them: it goes to the dead letters only.
        fields = [F.col(f"_hr_value.`{n}`").alias(n) for n in names]
        return decoded.select(*fields, *metadata, control, *dead)


def _metadata_column(name: str) -> Any:
    from pyspark.sql import functions as F

    column = F.col(METADATA[name][0])
    if name == "key":
        return column.cast("string")
    if name == "headers":
        return F.to_json(F.transform(column, lambda h: F.struct(h["key"].alias("key"),
                                                                 h["value"].cast("string").alias("value"))))
    return column
