"""The Spark session headrace runs on, with the defaults that matter on a small machine."""

from __future__ import annotations

import atexit
import hashlib
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


def check_java() -> str:
    """The ``java -version`` banner; SetupError in one clear line when no usable Java is on this machine."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SetupError(JAVA_HELP)
    try:
        done = subprocess.run([java, "-version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SetupError(f"{JAVA_HELP} ({java} -version failed: {exc})") from None
    return f"{java}\n{done.stderr.decode(errors='replace')}"


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


# -- JVM start-up --------------------------------------------------------------------------------
# Starting a driver (a restart, above all) is CPU-bound on a small machine, and most of that CPU
# is Spark's JVM loading, verifying and compiling classes. Two options cut it by about half:
# * a class-data archive (AppCDS) of the classes an earlier run loaded, which the JVM maps instead
#   of loading them again. A JVM writes it when it exits cleanly (-XX:ArchiveClassesAtExit); it is
#   kept per Java and pyspark installation and only used once complete;
# * higher JIT thresholds: code that runs only while starting is no longer compiled; the hot
#   paths of a running pipeline still are, a few thousand calls later.
JIT_OPTIONS = "-XX:CompileThresholdScaling=4"
JVM_LOG_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr"  # JVM warnings never on stdout (--json)


def class_archive_path(java_banner: str) -> str:
    """The class archive for this Java and this pyspark installation (path, version, jars)."""
    import pyspark

    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    try:
        listing = sorted((entry.name, entry.stat().st_size, entry.stat().st_mtime_ns) for entry in os.scandir(jars))
    except OSError:
        listing = []
    key = hashlib.sha256(repr((java_banner, pyspark.__version__, jars, listing)).encode()).hexdigest()[:16]
    return os.path.join(os.path.expanduser(config.CACHE_DIR.get()), "jvm", f"spark-{key}.jsa")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _claim_archive_build(archive: str) -> str | None:
    """A temporary path for this process to write the archive to, or None when another live
    process is writing it already."""
    folder = os.path.dirname(archive)
    try:
        os.makedirs(folder, exist_ok=True)
        lock = archive + ".lock"
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            with open(lock) as handle:
                owner = handle.read().strip()
            if owner.isdigit() and _alive(int(owner)):
                return None
            os.unlink(lock)  # left by a process that died: take it over
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(str(os.getpid()))
    except OSError:
        return None  # no writable cache: run without an archive
    return f"{archive}.{os.getpid()}.tmp"


def _finish_archive(session: Any, temporary: str, archive: str) -> None:
    """At exit: stop Spark, let the JVM exit (it writes the archive then) and keep the archive
    only if the JVM exited cleanly; a JVM killed while writing leaves nothing behind."""
    try:
        proc = getattr(session.sparkContext._gateway, "proc", None)
        session.stop()
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()  # the gateway JVM exits on end of input
            if proc.wait(timeout=180) == 0 and os.path.getsize(temporary) > 0:
                os.replace(temporary, archive)
    except Exception:  # noqa: BLE001 - the archive is an optimisation: never fail an exit for it
        pass
    finally:
        for leftover in (temporary, archive + ".lock"):
            try:
                os.unlink(leftover)
            except OSError:
                pass


def jvm_start_options(java_banner: str) -> tuple[str, str | None, str]:
    """Driver JVM options for a fast start, the temporary archive this JVM writes at exit
    (None when it uses one or another process is writing it) and the archive's final path."""
    options = f"{JIT_OPTIONS} {JVM_LOG_TO_STDERR}"
    archive = class_archive_path(java_banner)
    if not config.JVM_CLASS_ARCHIVE.flag():
        return options, None, archive
    if os.path.exists(archive):
        return f"{options} -XX:SharedArchiveFile={archive}", None, archive
    temporary = _claim_archive_build(archive)
    if temporary is not None:
        options += f" -XX:ArchiveClassesAtExit={temporary}"
    return options, temporary, archive


_session: Any = None


def get_session(master: str | None = None) -> Any:
    """The process's Spark session, created on first use with headrace's defaults."""
    global _session
    if _session is not None:
        return _session
    java_banner = check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    settings = spark_defaults(master or default_master())
    jvm_options, temporary, archive = jvm_start_options(java_banner)
    settings["spark.driver.extraJavaOptions"] += " " + jvm_options
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(config.SPARK_LOG_LEVEL.get())
    if temporary is not None:
        atexit.register(_finish_archive, session, temporary, archive)
    _session = session
    return session
