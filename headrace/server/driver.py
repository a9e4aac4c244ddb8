"""The process the supervisor starts for a pipeline: ``python -m headrace.server.driver EXIT_FILE
ARGS...`` runs ``python -m headrace.cli ARGS...`` as its child, passes Ctrl-C and SIGTERM on to it,
and writes the child's exit status to EXIT_FILE when it ends. A driver killed outright (its
process group SIGKILLed, out of memory) leaves no EXIT_FILE, which tells the supervisor it
crashed. It imports nothing of headrace's, to start at once and hold no memory.

The driver is the leader of a session of its own: every process it starts stays in that session
(``headrace run``, Spark's JVM, and Spark's Python worker daemon with its workers, which take a
process group of their own), so ``session_processes`` finds what is left of a driver that died,
and ``end_session`` ends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

PROC = "/proc"


def main(argv: list[str]) -> int:
    exit_file, *command = argv
    child = subprocess.Popen([sys.executable, "-m", "headrace.cli", *command])
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: child.send_signal(number))
    status = child.wait()
    write_exit_status(exit_file, status)
    return status


def write_exit_status(exit_file: str, status: int) -> None:
    """The driver's exit status, written whole (a reader never sees half of it)."""
    with open(f"{exit_file}.tmp", "w", encoding="utf-8") as out:
        out.write(str(status))
    os.replace(f"{exit_file}.tmp", exit_file)


def session_processes(session: int) -> list[int]:
    """The processes of session ``session`` that still run (a zombie, ended but not yet reaped,
    does not): what is left of the driver whose process id is ``session``. The kernel does not
    give a process a session's id while the session has members, so none is another's."""
    found = []
    for name in os.listdir(PROC):
        if name.isdigit():
            try:
                with open(os.path.join(PROC, name, "stat"), encoding="utf-8") as stat:
                    state, _parent, _group, member_of = stat.read().rsplit(")", 1)[1].split()[:4]
            except (OSError, ValueError):  # it ended meanwhile
                continue
            if state != "Z" and int(member_of) == session:
                found.append(int(name))
    return found


def end_session(session: int) -> list[int]:
    """Send SIGKILL to every process of session ``session`` that still runs; the ones it was sent to."""
    left = session_processes(session) if session > 0 else []
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
