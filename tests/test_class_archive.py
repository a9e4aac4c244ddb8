"""The JVM class archive: written ahead of a first run by the set-up step, quietly and once, and
half-written archives of writers that died are deleted rather than left in the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headrace.environment.class_archive import _claim_archive_build, class_archive_path
from headrace.environment.session import check_java


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.fast
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


def test_the_set_up_step_leaves_this_installations_archive_quietly_and_a_second_call_never_starts_spark(
        tmp_path: Path) -> None:
    """On this installation's own cache, as scripts/setup.sh runs it before the tests: the first
    call writes the archive if there is none yet (a run on its own, about 50 s), the second finds it."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    command = [sys.executable, "-m", "headrace.environment.build_class_archive"]

    first = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    assert (first.returncode, first.stdout, first.stderr) == (0, "", ""), first.stderr[-3000:]
    archive = Path(class_archive_path(check_java()))
    assert archive.is_file()
    assert not Path(f"{archive}.lock").exists()
    assert not [p for p in archive.parent.iterdir() if p.name.endswith(".tmp") and not _writer_alive(p)]

    again = subprocess.run(command, cwd=tmp_path, env={**env, "HEADRACE_SPARK_LOG": str(tmp_path / "again.log")},
                           capture_output=True, text=True, timeout=300)

    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert not (tmp_path / "again.log").exists()  # the archive was there: Spark never started


def _writer_alive(temporary: Path) -> bool:
    pid = int(temporary.name.rsplit(".", 2)[-2])
    return Path(f"/proc/{pid}").exists()
