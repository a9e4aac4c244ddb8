"""Every setting headrace reads from the environment: its type, default and meaning, in one place."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    env: str
    default: str
    doc: str

    def get(self) -> str:
        return os.environ.get(self.env, self.default)

    def flag(self) -> bool:
        return self.get().strip().lower() not in ("", "0", "false", "no", "off")


MASTER = Setting("HEADRACE_MASTER", "local[*,4]",
                 "Spark master URL: local[*,4] (every core, 4 attempts per task), spark://host:7077, yarn, k8s://...")
STATE_DIR = Setting("HEADRACE_STATE_DIR", ".headrace",
                    "directory holding each pipeline's checkpoint and run files: a local path, or a Hadoop URI "
                    "(hdfs://namenode:8020/state, s3a://bucket/state)")
SPARK_UI = Setting("HEADRACE_SPARK_UI", "0", "1 to start Spark's web UI (off by default)")
SPARK_LOG_LEVEL = Setting("HEADRACE_SPARK_LOG_LEVEL", "ERROR", "Spark's log level (ERROR, WARN, INFO, DEBUG)")
CACHE_DIR = Setting("HEADRACE_CACHE_DIR", "~/.cache/headrace",
                    "where headrace keeps files it can rebuild (the JVM class archive, Spark's log configuration)")
RUN_FILES_DIR = Setting("HEADRACE_RUN_FILES_DIR", "",
                        "local folder for the run files (stop and exhausted markers, sources' run-time files) of "
                        "pipelines whose state dir is a Hadoop URI: <folder>/<pipeline>/<query id>; default "
                        "<HEADRACE_CACHE_DIR>/run")
JVM_CLASS_ARCHIVE = Setting("HEADRACE_JVM_CLASS_ARCHIVE", "1",
                            "1 to start Spark's JVM from a class archive written at the first clean exit "
                            "(a driver starts about twice as fast)")
SPARK_LOG = Setting("HEADRACE_SPARK_LOG", "",
                    "file Spark's own log goes to (default <state dir>/spark.log, or <run files dir>/spark.log "
                    "when the state dir is a Hadoop URI); stderr to print it")
JARS_DIR = Setting("HEADRACE_JARS_DIR", "~/.cache/headrace/jars",
                   "connector jars fetched by scripts/fetch_jars.sh; used when they hold what a pipeline needs, "
                   "otherwise Spark fetches the packages itself (spark.jars.packages)")
SPARK_PACKAGE_VERSION = Setting("HEADRACE_SPARK_PACKAGE_VERSION", "",
                                "the version of Spark's connector packages (Kafka), for Spark's resolver and "
                                "scripts/fetch_jars.sh; default the installed pyspark's, or the newest earlier "
                                "one on Maven Central")
DELTA_VERSION = Setting("HEADRACE_DELTA_VERSION", "",
                        "the version of Delta Lake's package (io.delta:delta-spark), for Spark's resolver and "
                        "scripts/fetch_jars.sh; default the newest release built for the installed pyspark's "
                        "Spark minor version")
RESTART_ATTEMPTS = Setting("HEADRACE_RESTART_ATTEMPTS", "3",
                           "restarts of a failed query allowed within the restart window (0: never restart)")
RESTART_WINDOW = Setting("HEADRACE_RESTART_WINDOW", "10min",
                         "the window the restart attempts are counted in: more failures within it end the run")
RESTART_BACKOFF = Setting("HEADRACE_RESTART_BACKOFF", "1s",
                          "wait before the first restart; doubled for each further restart in the window")
PROGRESS_LOG = Setting("HEADRACE_PROGRESS_LOG", "",
                       "file each batch's figures (and the run's totals) are appended to as JSON lines, whatever "
                       "the display; headrace server sets it for its drivers, and serves the figures at /metrics")

ALL = (MASTER, STATE_DIR, SPARK_UI, SPARK_LOG_LEVEL, SPARK_LOG, CACHE_DIR, RUN_FILES_DIR, JVM_CLASS_ARCHIVE,
       JARS_DIR, SPARK_PACKAGE_VERSION, DELTA_VERSION, RESTART_ATTEMPTS, RESTART_WINDOW, RESTART_BACKOFF,
       PROGRESS_LOG)


def describe() -> str:
    """A table of the settings, for docs and ``--help``.

    >>> print(describe().splitlines()[0])
    HEADRACE_MASTER (default local[*,4]): Spark master URL: local[*,4] (every core, 4 attempts per task), ...
    """
    return "\n".join(f"{s.env} (default {s.default}): {s.doc}" for s in ALL)
