"""SIGTERM (or Ctrl-C) at any moment of ``headrace run``: while Python starts, while Spark
starts, or while batches run, the first stops the pipeline at a batch boundary (or before its
first batch) and a second stops it at once; either way the next run continues from the
checkpoint and the output is exactly that of an uninterrupted run.

Each run is a ``headrace run`` process of its own, in a process group of its own. SIGTERM goes
to that process only, as ``kill PID`` sends it; Ctrl-C goes to the whole group (Spark's JVM
and its Python workers too), as a terminal sends it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from headrace.connectors.files_sink import read_rows

STEPS, ROWS = 10, 20
PIPELINE = f'''
import os
import time

import headrace as hr
from headrace.testing import TestSource

BATCHES = [[{{"n": step * {ROWS} + i}} for i in range({ROWS})] for step in range({STEPS})]
PAUSE = float(os.environ.get("HR_TEST_PAUSE", "0"))


def double(record):
    time.sleep(PAUSE)
    return {{"n": record["n"], "twice": record["n"] * 2}}


p = hr.Pipeline("signals")
(p.source("numbers", TestSource(BATCHES, schema={{"n": "long"}}))
  .map(double, schema={{"n": "long", "twice": "long"}}, name="double")
  .sink("out", hr.sinks.Files(os.environ["HR_TEST_OUT"], format="jsonl")))
'''


class Run:
    """``headrace run FILE --json`` in a process group of its own, its output read as it comes."""

    def __init__(self, folder: Path, pause: float = 0.0, pipeline: str = PIPELINE, **env_vars: str) -> None:
        script = folder / "pipeline.py"
        script.write_text(textwrap.dedent(pipeline))
        env = {**os.environ, "HR_TEST_OUT": str(folder / "out"), "HR_TEST_PAUSE": str(pause), **env_vars}
        env.pop("HEADRACE_MASTER", None)
        self.started = time.time()
        self.command = [sys.executable, "-m", "headrace.cli", "run", str(script), "--state-dir",
                        str(folder / "state"), "--json"]
        self.env = env
        self.proc = subprocess.Popen(self.command, cwd=folder, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self.readers = [threading.Thread(target=lambda into=into, pipe=pipe: into.extend(pipe or ()), daemon=True)
                        for into, pipe in ((self.lines, self.proc.stdout), (self.errors, self.proc.stderr))]
        for reader in self.readers:
            reader.start()

    def handles_signals(self) -> bool:
        """Whether the process has the CLI's handlers in place (``stop_on_signals``), as its SIGTERM
        handler shows (Python catches SIGINT from its start): before them, Python has not got as far
        as headrace, and SIGTERM's default ends the process."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return False
        caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
        return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)

    def signal_after(self, seconds: float, sig: signal.Signals, group: bool = False) -> float:
        """Send ``sig`` ``seconds`` after the start, once the CLI handles it (a loaded machine can
        take longer than that to get there)."""
        time.sleep(max(0.0, self.started + seconds - time.time()))
        deadline = time.time() + 60
        while not self.handles_signals() and self.proc.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        if sig == signal.SIGINT or group:
            os.killpg(self.proc.pid, sig)  # Ctrl-C in a terminal; systemd's stop of a service (KillMode=control-group)
        else:
            self.proc.send_signal(sig)
        return time.time()

    def batches_seen(self) -> int:
        return sum(1 for line in list(self.lines) if line.startswith('{"batch"'))

    def finish(self, timeout: float) -> tuple[int, dict, str]:
        """Exit status, the run's result and its stderr; the whole group is killed if it overstays."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            pytest.fail(f"headrace run did not end within {timeout} s")
        for reader in self.readers:
            reader.join(10)
        results = [json.loads(line)["result"] for line in self.lines if line.startswith('{"result"')]
        return self.proc.returncode, (results[-1] if results else {}), "".join(self.errors)


def exact_output(folder: Path) -> bool:
    rows = read_rows(str(folder / "out"), "jsonl")
    return sorted((r["n"], r["twice"]) for r in rows) == [(n, 2 * n) for n in range(STEPS * ROWS)]


def continue_to_the_end(folder: Path) -> None:
    rc, result, err = Run(folder).finish(timeout=300)
    assert rc == 0, err[-3000:]
    assert result["stopped_by"] == "input exhausted"
    assert exact_output(folder)


def test_a_signal_at_any_moment_stops_cleanly_and_the_next_run_continues(tmp_path):
    """One run after another on the same checkpoint, each stopped by a signal at another moment:
    while Python starts (SIGTERM as soon as the CLI handles it, before it loads the pipeline), while
    Spark starts (SIGTERM at 3 s to the whole process group, the JVM too, as systemd stops a service:
    the JVM starts ignoring it), while batches run (Ctrl-C at 5 s, and SIGTERM to the group); then a
    run to the end gives exactly the uninterrupted output."""
    for sig, seconds, group in [(signal.SIGTERM, 0, False), (signal.SIGTERM, 3, True), (signal.SIGINT, 5, True),
                                (signal.SIGTERM, 5, True)]:
        moment = f"{sig.name} at {seconds} s{' to the group' if group else ''}"
        run = Run(tmp_path)
        run.signal_after(seconds, sig, group)
        rc, result, err = run.finish(timeout=30)
        assert rc == 0, (moment, err[-3000:])
        assert result["stopped_by"] == f"signal {sig.name}", moment
        assert result["batches"] < STEPS, moment
        assert all(not line.startswith(("Traceback", "headrace:")) for line in err.splitlines()), (moment, err[-3000:])
    continue_to_the_end(tmp_path)


def test_a_second_sigterm_stops_at_once(tmp_path):
    run = Run(tmp_path, pause=0.15)  # 3 s a batch: the first signal's stop waits for the batch in flight
    deadline = time.time() + 120
    while run.batches_seen() < 2 and run.proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert run.batches_seen() >= 2, "the run never got going"
    time.sleep(0.5)  # into the next batch
    run.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    run.proc.send_signal(signal.SIGTERM)
    rc, _, err = run.finish(timeout=30)
    assert rc == 130, err[-3000:]
    assert err.strip().splitlines()[-1] == ("headrace: stopped at once by a second signal (SIGTERM); the batch in "
                                            "flight runs again on the next start")
    continue_to_the_end(tmp_path)


STUCK_PIPELINE = f'''
import os

import headrace as hr
from headrace.testing import TestSource

BATCHES = [[{{"n": step * {ROWS} + i}} for i in range({ROWS})] for step in range({STEPS})]

p = hr.Pipeline("stuck")
(p.source("numbers", TestSource(BATCHES, schema={{"n": "long"}}))
  .with_columns(twice=hr.col("n") * 2)
  .sink("out", hr.sinks.Postgres(os.environ["HR_TEST_TABLE"], dsn=os.environ["HR_TEST_DSN"])))
'''


def test_a_second_sigterm_ends_a_run_stuck_in_a_sink(tmp_path, pg):
    """The PostgreSQL sink waits without end on a server behind a frozen network (a proxy that
    keeps the connection open and lets nothing through): the first SIGTERM waits for the batch,
    the second ends the process within a few seconds, and the next run gives the exact output."""
    import psycopg
    from conftest import PG_DSN
    from fault_proxy import FaultProxy

    table = f"stuck_{os.getpid()}_{int(time.time())}"
    params = psycopg.conninfo.conninfo_to_dict(PG_DSN)
    proxy = FaultProxy(str(params.get("host", "127.0.0.1")), int(params.get("port", 5432))).start()
    dsn = psycopg.conninfo.make_conninfo(PG_DSN, host="127.0.0.1", port=str(proxy.port), sslmode="disable")
    try:
        run = Run(tmp_path, pipeline=STUCK_PIPELINE, HR_TEST_TABLE=table, HR_TEST_DSN=dsn)
        deadline = time.time() + 120
        while run.batches_seen() < 2 and run.proc.poll() is None and time.time() < deadline:
            time.sleep(0.1)
        assert run.batches_seen() >= 2, "".join(run.errors)[-3000:]
        proxy.frozen = True
        time.sleep(2.0)  # the next batch's sink call waits on the frozen connection
        run.proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        run.proc.send_signal(signal.SIGTERM)
        rc, _, err = run.finish(timeout=40)
        assert rc == 130, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            "headrace: stopped at once by a second signal (SIGTERM): the query did not stop within 5 s (a "
            "micro-batch is stuck in a call that does not return, e.g. a sink waiting on a server), so the process "
            "exits without it; the batch in flight runs again on the next start"), err[-3000:]

        proxy.stop()  # cut the frozen connections
        proxy.frozen = False
        proxy.start()
        again = subprocess.run(run.command, cwd=tmp_path, env=run.env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        rows = pg.execute(f"SELECT n, twice FROM {table} ORDER BY n").fetchall()
        assert rows == [(n, 2 * n) for n in range(STEPS * ROWS)]
    finally:
        proxy.stop()
        pg.execute(f"DROP TABLE IF EXISTS {table}")
