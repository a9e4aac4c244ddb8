"""The Spark session headrace runs on, with the defaults that matter on a small machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from headrace import config
from headrace.errors import SetupError

JAVA_HELP = ("Java 17 or newer is needed to run Spark and was not found; install it "
             "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17) "
             "or set JAVA_HOME")


def check_java() -> None:
    """Raise SetupError in one clear line when no usable Java is on this machine."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SetupError(JAVA_HELP)
    try:
        subprocess.run([java, "-version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupError(f"{JAVA_HELP} ({java} -version failed: {exc})") from None


def default_master() -> str:
    return config.MASTER.get()


def spark_defaults(master: str) -> dict[str, str]:
    """The settings headrace applies to every session it creates."""
    cores = os.cpu_count() or 2
    ui = config.SPARK_UI.flag()
    return {
        "spark.master": master,
        "spark.app.name": "headrace",
        "spark.ui.enabled": "true" if ui else "false",
        "spark.sql.shuffle.partitions": str(max(1, cores if master.startswith("local") else 2 * cores)),
        "spark.sql.adaptive.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.streaming.checkpointFileManagerClass":
            "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
        "spark.python.worker.reuse": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    }


_session: Any = None


def get_session(master: str | None = None) -> Any:
    """The process's Spark session, created on first use with headrace's defaults."""
    global _session
    if _session is not None:
        return _session
    check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in spark_defaults(master or default_master()).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(config.SPARK_LOG_LEVEL.get())
    _session = session
    return session
