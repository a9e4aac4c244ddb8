"""What happens to a test that stalls: past its timeout (pytest-timeout's ``timeout``, pyproject.toml)
the stacks of every Python thread and of the Spark JVM are printed, and the test process exits.
pytest-xdist reports the test as failed ("worker crashed") and starts a fresh worker, with a
fresh Spark, for the tests left. A stall is a defect: it fails, and is never run again; the stacks
(with py-spy, those of Spark's Python workers too) say where it stalled."""

from __future__ import annotations

import faulthandler
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest


def _spark_jvm_pid() -> int | None:
    """The pid of the JVM this process's Spark session runs in, if one was started."""
    context = sys.modules.get("pyspark")
    if context is None:
        return None
    gateway = getattr(context.SparkContext, "_gateway", None)
    process = getattr(gateway, "proc", None)
    return getattr(process, "pid", None)


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Spark's Python daemon and workers below the JVM)."""
    found = [int(c) for thread in Path(f"/proc/{pid}/task").glob("*") for c in _read(thread / "children").split()]
    return [p for c in found for p in (c, *_descendants(c))]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the thread or process has ended
        return ""


def _dump(item: pytest.Item, seconds: float) -> None:
    """Print where everything stands to this process's real stderr (fd 2, outside pytest's capture)."""
    capture = item.config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        capture.suspend_global_capture(in_=True)
    err = sys.__stderr__ or sys.stderr
    err.write(f"\n+++ {item.nodeid} still runs after {seconds:g} s: the stacks of its threads +++\n")
    err.flush()
    faulthandler.dump_traceback(file=err, all_threads=True)
    pid = _spark_jvm_pid()
    jstack = shutil.which("jstack")
    if pid is not None and jstack is not None:
        err.write(f"+++ the Spark JVM (pid {pid}) +++\n")
        err.flush()
        subprocess.run([jstack, str(pid)], stdout=err, stderr=subprocess.STDOUT, timeout=60, check=False)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for worker in _descendants(pid) if pid is not None and Path(py_spy).exists() else []:
        err.write(f"+++ Spark's Python process {worker} +++\n")
        err.flush()
        subprocess.run([py_spy, "dump", "--pid", str(worker)], stdout=err, stderr=subprocess.STDOUT, timeout=60,
                       check=False)
    err.write(f"+++ end of the stacks of {item.nodeid} +++\n")
    err.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool:
    def expire() -> None:
        try:
            _dump(item, settings.timeout)
        finally:
            os._exit(1)

    timer = threading.Timer(settings.timeout, expire)
    timer.name = f"stall watchdog for {item.nodeid}"
    timer.daemon = True
    timer.start()
    item.stall_watchdog = timer  # type: ignore[attr-defined]
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool:
    timer = getattr(item, "stall_watchdog", None)
    if timer is not None:
        timer.cancel()
        del item.stall_watchdog  # type: ignore[attr-defined]
    return True
