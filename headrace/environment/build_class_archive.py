"""Write the JVM class archive (``headrace/environment/class_archive.py``) of this installation
ahead of a first run, so that every driver, the first ones too, starts from it.

    python -m headrace.environment.build_class_archive

Does nothing when the archive exists or is switched off (``HEADRACE_JVM_CLASS_ARCHIVE=0``);
otherwise starts Spark, runs a small streaming query to load what a pipeline loads, and exits:
the JVM writes the archive as it exits. Quiet; about 20 s. ``scripts/setup.sh`` runs it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from headrace import config
from headrace.environment.class_archive import class_archive_path
from headrace.environment.session import check_java, get_session


def _load_streaming_classes(spark: Any) -> None:
    """Run what a pipeline runs, briefly, so that the archive holds its classes too: a Python
    step, a keyed window on the RocksDB state store and a foreachBatch sink."""
    from pyspark.sql import functions as F

    with tempfile.TemporaryDirectory(prefix="headrace-archive-") as folder:
        rows = spark.range(200).select((F.col("id") % 7).cast("string").alias("key"),
                                       F.timestamp_seconds(F.col("id")).alias("at"))
        rows.write.json(os.path.join(folder, "in"))
        stream = (spark.readStream.schema(rows.schema).json(os.path.join(folder, "in"))
                  .withWatermark("at", "5 seconds")
                  .select("key", "at", F.udf(lambda key: key.upper(), "string")("key").alias("upper"))
                  .groupBy("upper", F.window("at", "10 seconds")).count())
        query = (stream.writeStream.foreachBatch(lambda batch, _batch_id: batch.count())
                 .option("checkpointLocation", os.path.join(folder, "checkpoint"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()


def main() -> int:
    try:
        java_banner = check_java()
    except Exception as exc:  # noqa: BLE001 - setup reports a missing Java itself
        print(f"no class archive: {exc}", file=sys.stderr)
        return 0
    if not config.JVM_CLASS_ARCHIVE.flag() or os.path.exists(class_archive_path(java_banner)):
        return 0
    _load_streaming_classes(get_session())
    return 0  # the JVM writes the archive as this process exits (class_archive.finish_archive)


if __name__ == "__main__":
    sys.exit(main())
