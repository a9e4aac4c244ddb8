"""A server's driver killed by its process id alone (not its process group), for real: its Spark
JVM and Spark's Python workers would go on, and the JVM could still commit a batch beside the
next driver. The server ends every process of the killed driver's session before another driver
takes the checkpoint, and the output is exact."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from test_server import Server, committed, eventually

from headrace.server.driver import end_session, session_processes

# Files in, a Python step (so Spark's Python worker daemon and workers run), Files out.
PIPELINE = """import headrace as hr


def double(record):
    return {{"id": record["id"], "amount": record["amount"] * 2}}


p = hr.Pipeline("orders_doubled")
p.source("orders", hr.sources.Files({inbox!r}, schema="id long, amount long", max_files_per_batch=1)).map(
    double, schema={{"id": "long", "amount": "long"}}).sink("out", hr.sinks.Files({out!r}, format="jsonl"))
"""


def process_group(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])
    except (FileNotFoundError, ProcessLookupError):
        return None


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def test_a_standby_driver_killed_by_its_pid_alone_leaves_no_process_when_the_next_driver_starts(tmp_path: Path):
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    written = {"a.jsonl": [(1, 10), (2, 20)], "b.jsonl": [(3, 30)]}

    def write(name: str) -> None:
        (inbox / name).write_text("".join(json.dumps({"id": i, "amount": a}) + "\n" for i, a in written[name]))

    write("a.jsonl")
    (tmp_path / "orders.py").write_text(PIPELINE.format(inbox=str(inbox), out=str(out)))
    server = Server(tmp_path).start("--standby", HEADRACE_RESTART_BACKOFF="0s")
    sessions: list[int] = []  # each driver's (its process id): ended whatever happens
    try:
        eventually("the standby's session", lambda: list((server.state / "standby").glob("*/session")), 180)
        assert server.cli("submit", "orders.py").returncode == 0
        first = server.status("orders_doubled")
        assert "standby" in first["reason"], first  # the standby's own process runs the pipeline
        eventually("the first file's rows", lambda: len(committed(out)) == 2, 180)
        sessions.append(first["pid"])
        old = session_processes(first["pid"])
        commands = {pid: command_of(pid) for pid in old}
        assert any("java" in command for command in commands.values()), commands  # Spark's JVM
        daemon = [pid for pid in old if "pyspark.daemon" in commands[pid]]
        assert daemon and process_group(daemon[0]) != first["pid"], commands  # its own process group

        os.kill(first["pid"], signal.SIGKILL)  # the driver's process alone
        restarted = eventually("a restarted driver", lambda: (s := server.status("orders_doubled"))["pid"] not in (
            0, first["pid"]) and s, 180)
        sessions.append(restarted["pid"])
        assert [pid for pid in old if pid in session_processes(first["pid"])] == []  # all gone before it started
        assert restarted["restarts"] == 1, restarted
        write("b.jsonl")
        eventually("the second file's rows", lambda: len(committed(out)) == 3, 180)
        assert server.cli("stop", "orders_doubled").returncode == 0
        eventually("the stop", lambda: server.status("orders_doubled")["status"] == "stopped", 180)
    finally:
        server.close()
        for session in sessions:
            end_session(session)
    expected = sorted((i, a * 2) for rows in written.values() for i, a in rows)
    assert sorted((row["id"], row["amount"]) for row in committed(out)) == expected  # each record once
