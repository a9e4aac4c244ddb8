"""Ctrl-C (SIGINT) and SIGTERM while a pipeline starts or runs.

The first signal asks the run to stop at the next batch boundary (before its first batch when
the query has not started yet: a run that has not started Spark does not start it); the second
stops the query at once: the batch in flight is abandoned and runs again from the checkpoint on
the next start. A signal that arrives before the run exists (the CLI installs the handlers
before it loads the pipeline file) is applied to the run when it attaches.

The handlers only set flags and write the stop marker: everything that talks to Spark happens
on the run's own thread, or on a thread of its own for the stop at once, so a signal never
interrupts a call into Spark's JVM halfway.

A second signal always ends the process: when the query has not stopped ``HALT_GRACE_S``
after it (Spark waits for a micro-batch stuck in a sink's or a user function's call that never
returns), or at a third signal, the process says so on stderr and exits with status 130 at
once (``os._exit``); the batch in flight was not committed and runs again on the next start.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

HANDLED = (signal.SIGINT, signal.SIGTERM)
HALT_GRACE_S = 5.0  # how long a stop at once may take before the process exits without it
EXIT_STATUS = 130


class Stoppable(Protocol):
    def request_stop(self, reason: str) -> None: ...

    def halt(self, reason: str) -> bool: ...

    def halted(self) -> bool: ...


class _Signals:
    def __init__(self) -> None:
        self.received: list[str] = []
        self.run: Stoppable | None = None
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def install(self) -> bool:
        """Take over SIGINT and SIGTERM (main thread only); False when they are taken already or
        this is not the main thread."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return False
        self.received = []
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self.run = None

    def attach(self, run: Stoppable) -> None:
        """Send the signals to ``run`` from now on, and the one that came already, if any."""
        self.run = run
        if self.received:
            run.request_stop(f"signal {self.received[0]}")

    def detach(self, run: Stoppable) -> None:
        if self.run is run:
            self.run = None

    def _handle(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        run = self.run
        if len(self.received) == 1:
            if run is not None:
                run.request_stop(f"signal {name}")
            return
        if len(self.received) > 2:
            _exit_now(f"stopped at once by a third signal ({name}), without waiting for the query to stop; the "
                      "batch in flight runs again on the next start")
        if run is not None and run.halt(f"stopped at once by a second signal ({name}); the batch in flight runs "
                                        "again on the next start"):
            threading.Thread(target=_exit_unless_halted, args=(run, name), name="headrace-halt-watch",
                             daemon=True).start()
            return
        raise KeyboardInterrupt(f"a second signal ({name})")  # nothing runs yet: abandon the start


def _exit_unless_halted(run: Stoppable, name: str) -> None:
    """After a second signal: end the process if the query has not stopped within HALT_GRACE_S."""
    until = time.monotonic() + HALT_GRACE_S
    while not run.halted() and time.monotonic() < until:
        time.sleep(0.1)
    if not run.halted():
        _exit_now(f"stopped at once by a second signal ({name}): the query did not stop within {HALT_GRACE_S:g} s "
                  "(a micro-batch is stuck in a call that does not return, e.g. a sink waiting on a server), so "
                  "the process exits without it; the batch in flight runs again on the next start")


def _exit_now(message: str) -> None:
    try:
        sys.stderr.write(f"headrace: {message}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_STATUS)


SIGNALS = _Signals()


@contextmanager
def stop_on_signals(enabled: bool = True) -> Iterator[_Signals]:
    """Handle Ctrl-C and SIGTERM as described above for the duration of the block (when
    ``enabled``, in the main thread, and not handled by an enclosing block already)."""
    installed = enabled and SIGNALS.install()
    try:
        yield SIGNALS
    finally:
        if installed:
            SIGNALS.uninstall()
