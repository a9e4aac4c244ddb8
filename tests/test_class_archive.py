"""The JVM class archive: written ahead of a first run by the set-up step, quietly and once, and
half-written archives of writers that died are deleted rather than left in the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from headrace.environment.class_archive import _claim_archive_build


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_half_written_archives_of_writers_that_died_are_deleted(tmp_path: Path) -> None:
    archive = tmp_path / "spark-0123456789abcdef.jsa"
    abandoned = tmp_path / f"spark-fedcba9876543210.jsa.{dead_pid()}.tmp"
    being_written = tmp_path / f"spark-fedcba9876543210.jsa.{os.getppid()}.tmp"
    for path in (abandoned, being_written):
        path.write_bytes(b"\0" * 1024)
    (tmp_path / f"{archive.name}.lock").write_text(str(dead_pid()))  # its writer died too

    temporary = _claim_archive_build(str(archive))

    assert temporary == f"{archive}.{os.getpid()}.tmp"
    assert not abandoned.exists()
    assert being_written.exists()  # its writer is alive
    assert (tmp_path / f"{archive.name}.lock").read_text() == str(os.getpid())


def test_the_set_up_step_writes_the_archive_quietly_and_only_once(tmp_path: Path) -> None:
    env = {**os.environ, "HEADRACE_CACHE_DIR": str(tmp_path / "cache"), "PYSPARK_PYTHON": sys.executable}
    command = [sys.executable, "-m", "headrace.environment.build_class_archive"]

    first = subprocess.run(command, cwd=tmp_path, env={**env, "HEADRACE_SPARK_LOG": str(tmp_path / "first.log")},
                           capture_output=True, text=True, timeout=300)

    assert first.returncode == 0, first.stderr[-3000:]
    assert (first.stdout, first.stderr) == ("", "")
    assert [p.name.endswith(".jsa") for p in (tmp_path / "cache" / "jvm").iterdir()] == [True]  # no lock, no .tmp
    assert (tmp_path / "first.log").exists()  # Spark ran

    again = subprocess.run(command, cwd=tmp_path, env={**env, "HEADRACE_SPARK_LOG": str(tmp_path / "again.log")},
                           capture_output=True, text=True, timeout=300)

    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert not (tmp_path / "again.log").exists()  # the archive was there: Spark never started
