"""The process the supervisor starts for a pipeline: ``python -m headrace.server.driver EXIT_FILE
ARGS...`` runs ``python -m headrace.cli ARGS...`` as its child, passes Ctrl-C and SIGTERM on to it,
and writes the child's exit status to EXIT_FILE when it ends. A driver killed outright (its
process group SIGKILLed, out of memory) leaves no EXIT_FILE, which tells the supervisor it
crashed. It imports nothing of headrace's, to start at once and hold no memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
