"""Options for a fast start of Spark's driver JVM, and its class archive.

Starting a driver (a restart, above all) is CPU-bound on a small machine, and most of that CPU
is Spark's JVM loading, verifying and compiling classes. Two options cut it by about half:

* a class-data archive (AppCDS) of the classes an earlier run loaded, which the JVM maps instead
  of loading them again. A JVM writes it when it exits cleanly (-XX:ArchiveClassesAtExit); it is
  kept per Java and pyspark installation, written by one process at a time and only used once
  complete. ``scripts/setup.sh`` writes it before a first run (``python -m
  headrace.environment.build_class_archive``); otherwise the first driver that exits cleanly does;
* higher JIT thresholds: code that runs only while starting is no longer compiled; the hot
  paths of a running pipeline still are, a few thousand calls later.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
from typing import Any

from headrace import config

JIT_OPTIONS = "-XX:CompileThresholdScaling=4"
# JVM warnings go to stderr, never to stdout (--json), except the class archive's: writing it, the
# JVM warns of each class it cannot archive (hundreds of lines, none of them the user's concern).
JVM_LOG_TO_STDERR = "-Xlog:disable -Xlog:all=warning:stderr -Xlog:cds*=off:stderr"
_TEMPORARY = re.compile(r"\.(\d+)\.tmp$")  # <archive>.<pid of the writer>.tmp


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


def _remove_abandoned(folder: str) -> None:
    """Delete the half-written archives (a few hundred MB each) of writers that died."""
    for temporary in glob.glob(os.path.join(folder, "*.jsa.*.tmp")):
        writer = _TEMPORARY.search(temporary)
        if writer is not None and not _alive(int(writer.group(1))):
            try:
                os.unlink(temporary)
            except OSError:
                pass


def _claim_archive_build(archive: str) -> str | None:
    """A temporary path for this process to write the archive to, or None when another live
    process is writing it already."""
    folder = os.path.dirname(archive)
    try:
        os.makedirs(folder, exist_ok=True)
        _remove_abandoned(folder)
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


def finish_archive(session: Any, temporary: str, archive: str) -> None:
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
