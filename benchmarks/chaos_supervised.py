"""``benchmarks/chaos.py --supervised``: the chaos check through ``headrace server``.

The pipeline is submitted to a server (``headrace submit``), which runs it in a driver process of
its own; each kill SIGKILLs that driver's whole process group (and the Python worker daemon that
leaves it), and the server's supervisor, not this command, starts a new driver from the
checkpoint. Recovery is the time from the kill to the first batch the new driver commits: the
supervisor noticing the death, its restart backoff, the new driver's start, the batch. The
server runs with ``HEADRACE_RESTART_ATTEMPTS=1000`` and ``HEADRACE_RESTART_BACKOFF=0s`` (the
restart strategy a pipeline that must come back at once would take; the default, 3 restarts
within 10 minutes waiting 1 s then 2 s then 4 s, would give up after the third kill). After the
last kill the driver runs to the end of its input, the server marks the pipeline finished, and
the output is verified as in ``chaos.py``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.chaos import (
    RECOVERY_TIMEOUT_S,
    ChaosFailed,
    Setup,
    SinkCommits,
    kill_group,
    kill_somewhere,
    last_commit,
    verify,
    wait_for,
)
from headrace.server.standby_pool import process_alive

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER_SETTINGS = {"HEADRACE_RESTART_ATTEMPTS": "1000", "HEADRACE_RESTART_BACKOFF": "0s"}


@dataclass(frozen=True)
class SupervisedSetup(Setup):
    """The run's setup with the pipeline's state where the server keeps it; ``standby``: the server keeps a
    warm standby driver, as ``headrace server`` does by default (else ``--no-standby``)."""

    standby: bool = True

    @property
    def server_dir(self) -> str:
        return os.path.join(self.work, "server")

    @property
    def state_dir(self) -> str:
        return os.path.join(self.server_dir, "pipelines", self.name)


class ServerDriver:
    """The server's current driver of the pipeline, as ``chaos.py``'s kill and wait helpers use a driver."""

    def __init__(self, setup: SupervisedSetup, number: int) -> None:
        self.setup, self.number = setup, number
        self.log = Path(setup.state_dir) / "driver.log"
        self.pid = self.status()["pid"]

    def status(self) -> dict[str, Any]:
        """The pipeline as the server's API shows it (an HTTP call: a CLI process per poll would take
        the CPU the starting driver needs)."""
        from headrace.server.client import Client

        client = Client.find(self.setup.server_dir, None, None)
        return dict(client.call("GET", client.pipeline(self.setup.name)))

    def alive(self) -> bool:
        return process_alive(self.pid)

    def kill(self) -> None:
        kill_group(self.pid)

    def failure(self) -> str:
        status = self.status()
        tail = self.log.read_text(errors="replace").strip().splitlines()[-15:] if self.log.exists() else []
        return f"pipeline {status['status']} ({status['reason']}):\n  " + "\n  ".join(tail)


def _cli(setup: SupervisedSetup, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", *args, "--state-dir", setup.server_dir],
                          capture_output=True, text=True, timeout=300, check=False, cwd=setup.work)


def _pipeline_file(setup: SupervisedSetup) -> str:
    path = os.path.join(setup.work, "pipeline.py")
    fields = {k: v for k, v in asdict(setup).items() if k in Setup.__dataclass_fields__}
    with open(path, "w", encoding="utf-8") as out:
        out.write(f"import sys\nsys.path.insert(0, {REPOSITORY!r})\n"
                  "from benchmarks.chaos import Setup, build_pipeline\n"
                  f"pipeline = build_pipeline(Setup(**{fields!r}))\n")
    return path


def _new_driver(setup: SupervisedSetup, old_pid: int, number: int) -> ServerDriver:
    """The driver the server started after ``old_pid`` died."""
    deadline = time.time() + RECOVERY_TIMEOUT_S
    while time.time() < deadline:
        driver = ServerDriver(setup, number)
        if driver.pid not in (0, old_pid):
            return driver
        time.sleep(0.02)
    raise ChaosFailed(f"the server started no new driver within {RECOVERY_TIMEOUT_S:.0f} s")


def supervised_chaos(setup: SupervisedSetup, kills: int, seed: int, say: Callable[[str], None],
                     pause_s: float = 0.0) -> tuple[int, list[float], bool]:
    """``pause_s``: how long the pipeline runs after each recovery before the next kill's moment is
    chosen (0: a pipeline that keeps crashing; longer: crashes apart, a standby ready for each)."""
    rng = random.Random(seed)
    between = set(rng.sample(range(kills), k=max(1, kills // 3))) if kills else set()
    os.makedirs(setup.server_dir, exist_ok=True)
    standby = "--standby" if setup.standby else "--no-standby"
    server = subprocess.Popen([sys.executable, "-m", "headrace.cli", "server", "--port", "0", "--state-dir",
                               setup.server_dir, "--allow", setup.work, standby],
                              cwd=setup.work,
                              env={**os.environ, **SERVER_SETTINGS, "PYSPARK_PYTHON": sys.executable},
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    sink = SinkCommits(setup)
    recoveries: list[float] = []
    killed = 0
    driver: ServerDriver | None = None
    try:
        deadline = time.time() + 60
        while not os.path.exists(os.path.join(setup.server_dir, "server.json")):
            if time.time() > deadline or server.poll() is not None:
                raise ChaosFailed("the server did not start")
            time.sleep(0.05)
        submitted = _cli(setup, "submit", _pipeline_file(setup), "--name", setup.name)
        if submitted.returncode != 0:
            raise ChaosFailed(f"headrace submit failed: {submitted.stderr.strip()}")
        started = time.time()
        driver = ServerDriver(setup, 0)
        wait_for(lambda: last_commit(setup) >= 0, driver, "the first commit")  # type: ignore[arg-type]
        say(f"the server's driver committed its first batch after {time.time() - started:.1f} s")
        for number in range(1, kills + 1):
            time.sleep(pause_s)
            landed = kill_somewhere(driver, rng, sink, (number - 1) in between)  # type: ignore[arg-type]
            if landed.startswith("not killed"):
                say(f"kill {number}: {landed}; stopping the kills")
                break
            killed_at, killed = time.time(), killed + 1
            before = last_commit(setup)
            driver = _new_driver(setup, driver.pid, number)
            wait_for(lambda before=before: last_commit(setup) > before, driver,  # type: ignore[arg-type]
                     f"new commit after batch {before}")
            recoveries.append(time.time() - killed_at)
            say(f"kill {number}: {landed}; the server restarted it, first new commit (batch {last_commit(setup)}) "
                f"{recoveries[-1]:.1f} s after the kill (load average {os.getloadavg()[0]:.1f})")
        deadline = time.time() + 1800
        while (status := driver.status())["status"] != "finished":
            if status["status"] == "failed" or time.time() > deadline:
                raise ChaosFailed(driver.failure())
            time.sleep(0.2)
        say(f"the pipeline finished: {status['restarts']} restarts by the server")
    except ChaosFailed as exc:
        say(f"FAILED: {exc}")
        return killed, recoveries, False
    finally:
        sink.close()
        if driver is not None and driver.alive():
            driver.kill()
        server.terminate()
        server.wait(timeout=30)
    return killed, recoveries, verify(setup, say)
