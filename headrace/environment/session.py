"""The Spark session headrace runs on, with the defaults that matter on a small machine."""

from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from headrace import config
from headrace.environment import jars
from headrace.environment.class_archive import finish_archive, jvm_start_options
from headrace.environment.jars import Package
from headrace.environment.local_dirs import claim_scratch_dir
from headrace.environment.state_paths import is_remote, local_path, run_files_dir
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


def submitted_settings() -> dict[str, str]:
    """The Spark settings ``spark-submit`` gave this process, when ``spark-submit`` started it
    (``spark-submit app.py``: the JVM runs first and hands Python its port in
    ``PYSPARK_GATEWAY_PORT``); empty otherwise. Its ``--master``, ``--conf``, ``--jars`` /
    ``--packages`` and spark-defaults.conf are in there."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM; starts none
    return {key: value for key, value in SparkConf().getAll()}


# Settings whose values from spark-submit and from headrace are joined (with this separator).
JOINED_SETTINGS = {"spark.jars": ",", "spark.sql.extensions": ",", "spark.executor.extraJavaOptions": " "}


def session_settings(master: str | None, packages: Iterable[Package]) -> dict[str, str]:
    """The settings of a new session. The master: ``master`` when given, else ``HEADRACE_MASTER``,
    else the one ``spark-submit`` was given, else ``local[*,4]``. Settings given to
    ``spark-submit`` win over headrace's defaults, except the jars, which are joined (a
    connector's jars and the user's ``--jars``), the SQL extensions (Delta's and the user's) and
    the executors' Java options, which too are joined."""
    submitted = submitted_settings()
    chosen = master or os.environ.get(config.MASTER.env) or submitted.get("spark.master") or default_master()
    settings = {**spark_defaults(chosen), **jars.session_settings(packages)}
    for key, value in submitted.items():
        if key == "spark.master":
            continue
        if key in JOINED_SETTINGS and settings.get(key) and settings[key] not in value:
            value = f"{value}{JOINED_SETTINGS[key]}{settings[key]}"
        settings[key] = value
    return settings


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
        # How long a query that found no new data waits before asking its sources again (Spark: 10 ms).
        # Each ask lists a folder or calls a broker: idle drivers took several times the CPU
        # (benchmarks/idle.py); data that comes after a pause waits up to 100 ms more.
        "spark.sql.streaming.pollingDelay": "100ms",
    }


# -- Spark's log ---------------------------------------------------------------------------------
# Spark logs a failed task or query with its whole stack trace; on the terminal that buries the
# one-line error headrace reports (the trace stays in this log, and ``--verbose`` prints it).
LOG_CONFIG = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:headrace.spark.log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
"""


def spark_log_file(state_dir: str | None = None) -> str | None:
    """Where Spark's log goes: ``HEADRACE_SPARK_LOG``, else ``<state dir>/spark.log`` (a log
    file is local: for a state dir on HDFS or S3, ``<run files dir>/spark.log``); None when
    the setting is ``stderr``."""
    setting = config.SPARK_LOG.get().strip()
    if setting.lower() == "stderr":
        return None
    state_dir = state_dir or config.STATE_DIR.get()
    folder = run_files_dir() if is_remote(state_dir) else local_path(state_dir)
    path = setting or os.path.join(folder, "spark.log")
    return os.path.abspath(os.path.expanduser(path))


def log_options(log_file: str | None) -> str:
    """Driver JVM options sending Spark's log to ``log_file`` (none: Spark's console log)."""
    if log_file is None:
        return ""
    config_file = os.path.join(os.path.expanduser(config.CACHE_DIR.get()), "log4j2-file.properties")
    try:
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        os.makedirs(os.path.dirname(config_file), exist_ok=True)
        if not os.path.exists(config_file) or Path(config_file).read_text() != LOG_CONFIG:
            temporary = f"{config_file}.{os.getpid()}.tmp"
            with open(temporary, "w") as handle:
                handle.write(LOG_CONFIG)
            os.replace(temporary, config_file)
    except OSError:
        return ""  # nowhere to write: Spark logs to the console as it does by default
    return f'"-Dlog4j2.configurationFile={config_file}" "-Dheadrace.spark.log={log_file}"'


def _off_the_main_thread(make: Callable[[], Any]) -> Any:
    """``make()`` run on a thread of its own; waiting for it, the main thread still takes signals."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = make()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="headrace-spark-start", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# -- the JVM's stderr ----------------------------------------------------------------------------
# Spark's driver JVM, and the Python processes it starts, write to stderr. Two things they write
# there on every run are noise: the JVM's notice that Spark uses an incubator module, and Spark's
# transformWithStateInPandas runner announcing each step of its work. The JVM headrace starts
# writes its stderr into a pipe; a thread passes every other line on to this process's stderr.
JVM_STDERR_NOISE = re.compile(rb"^WARNING: Using incubator modules: "
                              rb"|Streaming TransformWithStateInPandas Python worker")


def pass_on_stderr(lines: Iterable[bytes], write: Callable[[bytes], Any]) -> None:
    r"""``write`` each of ``lines`` but the noise (and the blank line a noisy ``print`` adds). A
    Python worker's traceback is held until it ends: one that only says the JVM closed the
    worker's connection (``EOFError`` in pyspark's own code, as a run stops) is noise too.

    >>> shown = []
    >>> pass_on_stderr([b"WARNING: Using incubator modules: jdk.incubator.vector\n",
    ...                 b"Starting Streaming TransformWithStateInPandas Python worker.\n", b"\n",
    ...                 b"Traceback (most recent call last):\n",
    ...                 b'  File "/x/pyspark.zip/pyspark/serializers.py", line 602, in read_int\n',
    ...                 b"    raise EOFError\n", b"EOFError\n",
    ...                 b"[warning][gc] real\n", b"\n"], shown.append)
    >>> shown
    [b'[warning][gc] real\n', b'\n']
    """
    after_noise = False
    traceback: list[bytes] = []
    for line in lines:
        if traceback or line.startswith(b"Traceback (most recent call last):"):
            traceback.append(line)
            if len(traceback) == 1 or line[:1] in (b" ", b"\t"):
                continue  # the traceback goes on until its exception's line
            shown, after_noise = ([], True) if _worker_lost_its_jvm(traceback) else (traceback, False)
            traceback = []
            for held in shown:
                _write_stderr(write, held)
            continue
        noise = bool(JVM_STDERR_NOISE.search(line)) or (after_noise and not line.strip())
        after_noise = noise
        if not noise:
            _write_stderr(write, line)
    for held in traceback:
        _write_stderr(write, held)


def _worker_lost_its_jvm(traceback: list[bytes]) -> bool:
    files = [line for line in traceback if line.lstrip().startswith(b'File "')]
    return traceback[-1].strip() == b"EOFError" and all(b"pyspark" in line for line in files)


def _write_stderr(write: Callable[[bytes], Any], line: bytes) -> None:
    try:
        write(line)
    except OSError:
        pass  # stderr closed: keep draining the pipe, or the JVM would block writing to it


def _launch_jvm(conf: Any) -> Any:
    """Spark's gateway to a driver JVM started here, its stderr passed on without the noise."""
    from pyspark import java_gateway

    # SIGTERM is this Python process's to handle, as Ctrl-C is (pyspark starts the JVM ignoring
    # SIGINT): one sent to the whole process group (systemd stops a service so) would otherwise end
    # the JVM under the batch in flight, and the stop at a batch boundary with it. The JVM is
    # started ignoring it (a JVM leaves a shutdown signal ignored at its start alone), so a SIGTERM
    # while the JVM starts cannot end it either. It still ends with this process: when its stdin
    # closes, or with a SIGKILL of the group.
    spawn = java_gateway.Popen

    def spawn_ignoring_sigterm(*args: Any, **kwargs: Any) -> Any:
        pyspark_preexec = kwargs.get("preexec_fn")

        def preexec() -> None:
            if pyspark_preexec is not None:
                pyspark_preexec()
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return spawn(*args, **{**kwargs, "preexec_fn": preexec})

    java_gateway.Popen = spawn_ignoring_sigterm  # type: ignore[assignment,misc]
    try:
        gateway = java_gateway.launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    finally:
        java_gateway.Popen = spawn  # type: ignore[misc]
    stderr = gateway.proc.stderr
    threading.Thread(target=pass_on_stderr, args=(iter(stderr.readline, b""), lambda line: os.write(2, line)),
                     name="headrace-jvm-stderr", daemon=True).start()
    return gateway


def _spark_context(settings: dict[str, str]) -> Any:
    """The SparkContext with ``settings``: a new one on a JVM started here, or the one that exists
    (Spark's own when ``spark-submit`` started this process)."""
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAll(list(settings.items()))
    if SparkContext._active_spark_context is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return SparkContext.getOrCreate(conf)
    return SparkContext(conf=conf, gateway=_launch_jvm(conf))


_session: Any = None
_started_in: str | None = None  # the directory the session's JVM started in


def jvm_directory() -> str:
    """The directory Spark's driver JVM started in, where a local master starts its Python
    workers (their ``sys.path`` has it); this process's directory before a session exists."""
    return _started_in or os.getcwd()


def get_session(master: str | None = None, log_file: str | None = None, packages: Iterable[Package] = ()) -> Any:
    """The process's Spark session, created on first use with headrace's defaults and the
    connector ``packages`` a pipeline needs (``headrace/environment/jars.py``); Spark logs to
    ``log_file`` (default: ``spark_log_file()``)."""
    global _session, _started_in
    if _session is not None:
        return _session
    java_banner = check_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    settings = session_settings(master, packages)
    if not ({"spark.local.dir"} & settings.keys() or {"SPARK_LOCAL_DIRS", "PYSPARK_GATEWAY_PORT"} & os.environ.keys()):
        scratch = claim_scratch_dir()  # the scratch files of drivers that were killed are removed here
        if scratch is not None:
            settings["spark.local.dir"] = scratch
    jvm_options, temporary, archive = jvm_start_options(java_banner)
    log = log_options(log_file or spark_log_file())
    settings["spark.driver.extraJavaOptions"] += " " + jvm_options + (" " + log if log else "")
    # The SparkContext (Spark's JVM) starts on a thread of its own: pyspark takes Ctrl-C over when
    # it creates a context on the main thread, and a signal that arrives while Spark starts must
    # reach headrace's handlers (``headrace/runtime/signals.py``), which may abandon the start.
    _started_in = os.getcwd()
    try:
        _off_the_main_thread(lambda: _spark_context(settings))
    except Exception as exc:
        failure = jars.start_failure(exc, settings)
        if failure is None:
            raise
        raise failure from None
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(config.SPARK_LOG_LEVEL.get())
    if temporary is not None:
        atexit.register(finish_archive, session, temporary, archive)
    _session = session
    return session
