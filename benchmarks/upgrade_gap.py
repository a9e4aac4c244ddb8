"""The gap an upgrade leaves: a pipeline submitted to ``headrace server`` and upgraded again and again,
each time to a compatible version (a changed stateless step after its window), the time from the
last micro-batch the old driver committed to the first the new one committed.

    .venv/bin/python benchmarks/upgrade_gap.py                 # 10 upgrades, the server as it starts
    .venv/bin/python benchmarks/upgrade_gap.py --no-standby    # headrace server --no-standby

The pipeline reads an unbounded generator (2,000 clicks a second), counts them per user and
1-second window, tags each row with its version and writes them to files. Each upgrade waits for
the server's standby driver to be ready (with a standby) and for a few batches of the running
version, then runs ``headrace upgrade NAME FILE --wait``. The gap is read from Spark's commit log
(``<checkpoint>/commits``, the files' times). After the last upgrade the pipeline is stopped and
its output checked: each user's window written once, by one version or the other. Ends with one
line::

    upgrade upgrades=N median_gap_s=X max_gap_s=Y verify=ok|FAILED
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

NAME = "upgraded"
VERSION = """import headrace as hr

p = hr.Pipeline({name!r})
clicks = p.source("clicks", hr.sources.Generator("clicks", rate=2_000, rows_per_batch=1_000, seed=7),
                  event_time="event_time", max_out_of_orderness="1s")
(clicks.key_by("user_id").window(hr.Tumbling("1s")).count()
 .select("user_id", "window_start", "count", version=hr.lit({version}))
 .sink("counts", hr.sinks.Files({out!r}, format="jsonl")))
"""


def _cli(server_dir: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "headrace.cli", *args, "--state-dir", server_dir],
                          capture_output=True, text=True, timeout=300, check=False)


def _commit_times(checkpoint: Path) -> dict[int, float]:
    try:
        return {int(n): (checkpoint / "commits" / n).stat().st_mtime
                for n in os.listdir(checkpoint / "commits") if n.isdigit()}
    except FileNotFoundError:
        return {}


def _drivers_batches(progress: Path) -> tuple[int | None, int | None]:
    """The last batch the driver before the newest one logged, and the newest driver's first: each
    driver's lines in the server's progress log begin with its query's ``started`` line."""
    lines = [json.loads(line) for line in progress.read_text().splitlines() if line.strip()]
    newest = max(i for i, line in enumerate(lines) if line.get("started"))
    before = [line["batch"] for line in lines[:newest] if "batch" in line]
    after = [line["batch"] for line in lines[newest:] if "batch" in line]
    return (before[-1] if before else None), (after[0] if after else None)


def _wait(what: str, check: Callable[..., object], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            raise SystemExit(f"upgrade_gap: timed out waiting for {what}")
        time.sleep(0.1)


def _ready_standbys(server_dir: str) -> int:
    return len(list(Path(server_dir, "standby").glob("*/ready")))


def run(upgrades: int, standby: bool, work: str) -> tuple[list[float], bool]:
    server_dir, out = os.path.join(work, "server"), os.path.join(work, "out")
    files = []
    for version in range(2):
        path = os.path.join(work, f"v{version}.py")
        Path(path).write_text(VERSION.format(name=NAME, version=version, out=out))
        files.append(path)
    server = subprocess.Popen([sys.executable, "-m", "headrace.cli", "server", "--port", "0", "--state-dir", server_dir,
                               "--allow", work, "--standby" if standby else "--no-standby"], cwd=work,
                              env={**os.environ, "PYSPARK_PYTHON": sys.executable},
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    checkpoint = Path(server_dir, "pipelines", NAME, NAME, "checkpoint")
    progress = Path(server_dir, "pipelines", NAME, "progress.jsonl")
    gaps: list[float] = []
    try:
        _wait("the server", lambda: os.path.exists(os.path.join(server_dir, "server.json")), 60)
        if standby:
            _wait("the standby", lambda: _ready_standbys(server_dir) >= 1)
        submitted = _cli(server_dir, "submit", files[0], "--wait")
        if submitted.returncode != 0:
            raise SystemExit(f"upgrade_gap: submit failed: {submitted.stderr.strip()}")
        for number in range(1, upgrades + 1):
            if standby:
                _wait("a ready standby", lambda n=number: _ready_standbys(server_dir) >= n + 1)
            settled = max(_commit_times(checkpoint), default=-1) + 3
            _wait("three more batches", lambda s=settled: max(_commit_times(checkpoint), default=-1) >= s)
            upgraded = _cli(server_dir, "upgrade", NAME, files[number % 2], "--wait")
            if upgraded.returncode != 0:
                raise SystemExit(f"upgrade_gap: upgrade {number} failed: {upgraded.stderr.strip()}")
            _wait("the new driver's first batch", lambda: _drivers_batches(progress)[1] is not None)
            last_old, first_new = _drivers_batches(progress)
            times = _commit_times(checkpoint)
            gaps.append(times[first_new] - times[last_old])  # type: ignore[index]
            reason = json.loads(_cli(server_dir, "status", NAME, "--json").stdout)["reason"]
            print(f"upgrade {number}: to v{number % 2}, {gaps[-1]:.1f} s from the old driver's last commit to the "
                  f"new one's first ({reason}; load average {os.getloadavg()[0]:.1f})", flush=True)
        stopped = _cli(server_dir, "stop", NAME, "--wait")
        if stopped.returncode != 0:
            raise SystemExit(f"upgrade_gap: stop failed: {stopped.stderr.strip()}")
    finally:
        listed = json.loads(_cli(server_dir, "list", "--json").stdout or "[]")
        server.terminate()
        server.wait(timeout=30)
        standbys = [int(pid.read_text() or 0) for pid in Path(server_dir, "standby").glob("*/pid")]
        for pid in [entry["pid"] for entry in listed if entry.get("pid")] + standbys:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return gaps, verify(out, upgrades)


def verify(out: str, upgrades: int) -> bool:
    """Each user's window written once, by one version or the other."""
    from headrace.connectors.files_sink import read_rows

    rows = list(read_rows(out, "jsonl"))
    windows = Counter((row["user_id"], row["window_start"]) for row in rows)
    repeated = sum(1 for times in windows.values() if times > 1)
    versions = sorted({row["version"] for row in rows})
    print(f"verify: {len(rows):,} rows, {len(windows):,} windows, {repeated} written twice, versions {versions}",
          flush=True)
    return bool(rows) and not repeated and versions == [0, 1][: 1 + min(upgrades, 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upgrades", type=int, default=10, help="upgrades to run (default 10)")
    parser.add_argument("--standby", action=argparse.BooleanOptionalAction, default=True,
                        help="the server keeps a warm standby driver, as it does by default (--no-standby: none)")
    args = parser.parse_args(argv)
    if args.upgrades < 1:
        parser.error("--upgrades must be 1 or more")
    work = tempfile.mkdtemp(prefix="headrace-upgrade-")
    try:
        gaps, ok = run(args.upgrades, args.standby, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"upgrade upgrades={len(gaps)} median_gap_s={statistics.median(gaps):.1f} max_gap_s={max(gaps):.1f} "
          f"verify={'ok' if ok and len(gaps) == args.upgrades else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
