"""A Python worker killed with SIGKILL in the middle of a task fails that task, and Spark's
retry (the default master, ``local[*,4]``) runs it again: the output is exactly that of an
uninterrupted run. The pipeline runs in a driver process of its own, with headrace's
default master, as a user would run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

DRIVER = textwrap.dedent('''
    import json, os, signal, sys
    import headrace as hr
    from headrace.testing import TestSink, TestSource

    marker = sys.argv[1]

    def crash_once(record):
        """Kills its own Python worker the first time it sees record 1234."""
        if record["n"] == 1234 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return {"n": record["n"], "square": record["n"] * record["n"]}

    p = hr.Pipeline("worker_crash")
    out = TestSink()
    batches = [[{"n": n} for n in range(start, start + 1_000)] for start in range(0, 5_000, 1_000)]
    (p.source("numbers", TestSource(batches, schema={"n": "long"}))
     .map(crash_once, schema={"n": "long", "square": "long"}).sink("out", out))
    result = hr.run(p, state_dir=sys.argv[2], progress="quiet")
    print(json.dumps({"rows": sorted(r["n"] for r in out.rows())}))
''')


def test_a_killed_python_worker_is_retried_and_nothing_is_lost_or_doubled(tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    marker = tmp_path / "crashed"
    env = {k: v for k, v in os.environ.items() if k != "HEADRACE_MASTER"}  # headrace's default master
    done = subprocess.run([sys.executable, str(script), str(marker), str(tmp_path / "state")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert marker.exists()  # the worker was killed
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["rows"] == list(range(5_000))
