"""Delta Lake: a table as a sink, exactly once per batch id, and as a streaming source.

Both run on Delta's own Spark package (``io.delta:delta-spark``, the release built for the
installed pyspark's Spark minor: ``headrace/environment/jars.py``), which also sets the session's
SQL extension and catalog.

**Sink.** Each micro-batch is one Delta commit carrying a transaction marker: the sink's
identity (step, pipeline and checkpoint, ``headrace/sink_step.py``) as
``txnAppId`` and the batch id as ``txnVersion``. Delta records the pair in the commit, so
the records and the batch id become visible together or not at all. A batch Spark replays
after a crash whose commit landed is skipped (``committed`` reads the marker from the
table's snapshot); without a key the batch is appended, with a key it is upserted with
``MERGE`` (the last row of a key in a batch wins, as in the PostgreSQL sink).

**Source.** Spark's streaming reader of Delta (``readStream.format("delta")``): each
micro-batch reads the files of new table versions, and a replay reads the same versions,
so it is exactly-once while those versions are kept (``VACUUM`` and log retention drop
them). Updates and deletes in the table stop the source, as in Spark, unless
``skip_change_commits=True``.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from headrace.connectors.base import StepSink
from headrace.contract import CONTROL_COLUMN, Guarantee, SourceConnector, SourceContext
from headrace.environment import jars
from headrace.errors import PlanError, SinkError
from headrace.schema import Schema, schema_of, to_ddl
from headrace.sink_step import SinkStep

SEQUENCE_COLUMN = "_hr_row_order"  # the order of rows in a batch, so the last row of a key wins
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"  # Delta's session settings for a MERGE's marker
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def _keys(key: str | Sequence[str] | None, where: str) -> tuple[str, ...]:
    keys = (key,) if isinstance(key, str) else tuple(key or ())
    if not all(isinstance(k, str) and k for k in keys):
        raise PlanError(f"{where}: key must be a column name or a list of column names, got {key!r}")
    if len(set(keys)) != len(keys):
        raise PlanError(f"{where}: key {list(keys)} names a column twice")
    return keys


def _path(path: Any, what: str) -> str:
    if not isinstance(path, str) or not path.strip():
        raise PlanError(f"Delta {what}: path must be the table's folder (a path or a Hadoop URI), got {path!r}")
    return path


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class Delta(StepSink):
    """Write each batch into the Delta table at ``path`` (created by the first batch), exactly once.

    ``key``: column(s) identifying a row; with a key each batch is upserted (``MERGE``),
    without one appended. ``partition_by``: the table's partition columns when the sink
    creates it. ``options``: more options of Delta's writer (``mergeSchema``, ...).
    """

    guarantee = Guarantee.EXACTLY_ONCE
    native_format = None
    keyed_updates = "(..., key=[...])"  # a MERGE by key

    def refuses_updates(self) -> str | None:
        return None if self.key else "without key= it appends each update as a new row"

    def __init__(self, path: str, *, key: str | Sequence[str] | None = None,
                 partition_by: str | Sequence[str] | None = None, options: Mapping[str, Any] | None = None,
                 name: str | None = None) -> None:
        self.path = _path(path, "sink")
        where = f"Delta sink for {path!r}"
        self.key = _keys(key, where)
        self.partition_by = _keys(partition_by, where)
        self.writer_options = {str(k): str(v) for k, v in (options or {}).items()}
        self._name = name
        self._step: SinkStep | None = None

    @property
    def name(self) -> str:
        return self._name or self.path

    def spark_packages(self) -> list[jars.Package]:
        return [jars.DELTA]

    def describe(self) -> dict[str, Any]:
        return {"type": "Delta", "path": self.path, "key": list(self.key) or None,
                "mode": "upsert" if self.key else "append", "guarantee": self.guarantee.value}

    def __repr__(self) -> str:
        return f"Delta({self.path!r}, key={list(self.key) or None!r})"

    # -- the batch marker ---------------------------------------------------------------------

    def last_committed(self, spark: Any) -> int | None:
        """The last batch id this sink committed into the table, from the table's latest snapshot."""
        log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, self.path)
        # update()'s Scala default arguments, passed explicitly: py4j cannot leave them out.
        snapshot = log.update(False, getattr(log, "update$default$2")(), getattr(log, "update$default$3")())
        found = snapshot.transactions().get(self.name)
        return int(found.get()) if found.isDefined() else None

    def committed(self, batch_id: int) -> bool:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()  # headrace's one session
        jars.require(spark, self.spark_packages(), self._where())
        last = self.last_committed(spark)
        return last is not None and last >= batch_id

    # -- writing ------------------------------------------------------------------------------

    def write_batch(self, df: Any, batch_id: int) -> None:
        spark = df.sparkSession
        jars.require(spark, self.spark_packages(), self._where())
        missing = [c for c in (*self.key, *self.partition_by) if c not in df.columns]
        if missing:
            raise SinkError(f"{self._where()}: the column(s) {missing} are not among the rows' columns "
                            f"{list(df.columns)}")
        if not self.key or not self._table_exists(spark):
            rows = self._last_of_each_key(df) if self.key else df
            self._append(rows, batch_id)
        else:
            self._merge(df, batch_id)

    def _table_exists(self, spark: Any) -> bool:
        return bool(spark._jvm.io.delta.tables.DeltaTable.isDeltaTable(spark._jsparkSession, self.path))

    def _append(self, df: Any, batch_id: int) -> None:
        writer = (df.write.format("delta").mode("append").options(**self.writer_options)
                  .option("txnAppId", self.name).option("txnVersion", str(batch_id)))
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.save(self.path)

    def _last_of_each_key(self, df: Any) -> Any:
        """One row per key: the last of the batch's rows with that key."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        ordered = df.withColumn(SEQUENCE_COLUMN, F.monotonically_increasing_id())
        last_first = Window.partitionBy(*[F.col(_quoted(k)) for k in self.key]).orderBy(F.col(SEQUENCE_COLUMN).desc())
        return (ordered.withColumn("_hr_rank", F.row_number().over(last_first))
                .filter(F.col("_hr_rank") == 1).drop("_hr_rank", SEQUENCE_COLUMN))

    def _merge(self, df: Any, batch_id: int) -> None:
        """Upsert the batch's last row of each key, with the batch marker in the same commit."""
        spark = df.sparkSession
        rows = self._last_of_each_key(df).persist()
        try:
            rows.count()  # reads the whole batch once, so its stateful operators commit
            view = f"_hr_delta_batch_{id(self)}_{batch_id}"
            rows.createOrReplaceTempView(view)
            matches = " AND ".join(f"t.{_quoted(k)} <=> s.{_quoted(k)}" for k in self.key)
            spark.conf.set(TXN_APP_ID, self.name)
            spark.conf.set(TXN_VERSION, str(batch_id))
            try:
                spark.sql(f"MERGE INTO delta.{_quoted(self.path)} AS t USING {view} AS s ON {matches} "
                          "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *")
            finally:
                spark.conf.unset(TXN_APP_ID)
                spark.conf.unset(TXN_VERSION)
                spark.catalog.dropTempView(view)
        finally:
            rows.unpersist()


def table_schema(path: str) -> Schema | None:
    """The schema of the local Delta table at ``path`` from its transaction log (the newest
    ``metaData`` action in the JSON commits), or None when there is no such log."""
    from pyspark.sql.types import StructType

    commits = sorted(glob.glob(os.path.join(path, "_delta_log", "[0-9]*.json")), reverse=True)
    for commit in commits:
        with open(commit) as actions:
            for line in actions:
                action = json.loads(line)
                if "metaData" in action:
                    fields = StructType.fromJson(json.loads(action["metaData"]["schemaString"])).fields
                    return tuple((f.name, f.dataType.simpleString()) for f in fields)
    return None


class DeltaSource(SourceConnector):
    """Read the Delta table at ``path`` as a stream: its rows as of the start, then each new version's.

    ``schema``: the table's columns (default: read from a local table's log when the pipeline
    is built; a table on a Hadoop URI needs it). ``starting_version``: read the changes from
    that table version on, not the table's rows as of the start. ``max_files_per_batch``,
    ``max_bytes_per_batch``: admission control, Delta's ``maxFilesPerTrigger`` (default 1,000)
    and ``maxBytesPerTrigger``. ``skip_change_commits``: skip the versions that update or
    delete rows instead of stopping. ``options``: more options of Delta's reader.
    """

    guarantee = Guarantee.EXACTLY_ONCE
    drains_on_stop = False  # Spark's source plans every batch up to the latest version
    lowered_as = "Spark's own Delta Lake source (delta-spark)"

    def __init__(self, path: str, *, schema: Any = None, starting_version: int | None = None,
                 max_files_per_batch: int | None = None, max_bytes_per_batch: int | None = None,
                 skip_change_commits: bool = False, options: Mapping[str, Any] | None = None) -> None:
        self.path = _path(path, "source")
        where = f"Delta source {path!r}"
        if schema is None:
            if "://" in path:
                raise PlanError(f"{where}: give schema= for a table on a Hadoop URI (headrace reads the schema of "
                                "local tables only)")
            found = table_schema(path)
            if found is None:
                raise PlanError(f"{where}: no Delta table there (no _delta_log with a schema); create it first, "
                                "or give schema=")
            schema = found
        self.data_schema = schema_of(schema, where)
        for value, what in ((starting_version, "starting_version"), (max_files_per_batch, "max_files_per_batch"),
                            (max_bytes_per_batch, "max_bytes_per_batch")):
            if value is not None and (not isinstance(value, int) or value < (0 if what == "starting_version" else 1)):
                raise PlanError(f"{where}: {what} must be a whole number of at least "
                                f"{0 if what == 'starting_version' else 1}, got {value!r}")
        self.starting_version = starting_version
        self.max_files_per_batch = max_files_per_batch
        self.max_bytes_per_batch = max_bytes_per_batch
        self.skip_change_commits = bool(skip_change_commits)
        self.extra = {str(k): str(v) for k, v in (options or {}).items()}

    def schema(self) -> Schema:
        return self.data_schema

    def spark_packages(self) -> list[jars.Package]:
        return [jars.DELTA]

    def spark_options(self) -> dict[str, str]:
        options: dict[str, str] = {}
        if self.starting_version is not None:
            options["startingVersion"] = str(self.starting_version)
        if self.max_files_per_batch is not None:
            options["maxFilesPerTrigger"] = str(self.max_files_per_batch)
        if self.max_bytes_per_batch is not None:
            options["maxBytesPerTrigger"] = f"{self.max_bytes_per_batch}b"
        if self.skip_change_commits:
            options["skipChangeCommits"] = "true"
        return {**options, **self.extra}

    def options(self) -> dict[str, str]:
        return {"path": self.path, **self.spark_options(), "schema": to_ddl(self.data_schema)}

    def offset_identity(self) -> dict[str, Any]:
        """An offset is a table version and file index: the table and where reading starts fix
        what it means; batch sizes do not."""
        return {"path": self.path, "starting_version": self.starting_version, "schema": to_ddl(self.data_schema)}

    def describe(self) -> dict[str, Any]:
        return {"type": "Delta", "path": self.path, "schema": to_ddl(self.data_schema),
                "starting_version": self.starting_version, "max_files_per_batch": self.max_files_per_batch,
                "max_bytes_per_batch": self.max_bytes_per_batch, "guarantee": self.guarantee.value}

    def prepare(self, context: SourceContext) -> None:
        """Nothing to check on the driver: Spark's source reports a missing table itself."""

    def read_stream(self, spark: Any, context: SourceContext) -> Any:
        from pyspark.sql import functions as F

        jars.require(spark, self.spark_packages(), f"source '{context.source_name}'")
        table = spark.readStream.format("delta").options(**self.spark_options()).load(self.path)
        missing = [n for n, _ in self.data_schema if n not in table.columns]
        if missing:
            raise PlanError(f"source '{context.source_name}': the Delta table {self.path!r} has no column(s) "
                            f"{missing}; its columns are {table.columns}")
        columns = [F.col(_quoted(n)).cast(t).alias(n) for n, t in self.data_schema]
        return table.select(*columns, F.lit(None).cast("long").alias(CONTROL_COLUMN))
