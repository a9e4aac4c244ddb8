"""Ctrl-C (SIGINT) and SIGTERM while a pipeline starts or runs.

The first signal asks the run to stop at the next batch boundary (before its first batch when
the query has not started yet: a run that has not started Spark does not start it); the second
stops the query at once: the batch in flight is abandoned and runs again from the checkpoint on
the next start. A signal that arrives before the run exists (the CLI installs the handlers
before it loads the pipeline file) is applied to the run when it attaches.

The handlers only set flags and write the stop marker: everything that talks to Spark happens
on the run's own thread, or on a thread of its own for the stop at once, so a signal never
interrupts a call into Spark's JVM halfway.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Stoppable(Protocol):
    def request_stop(self, reason: str) -> None: ...

    def halt(self, reason: str) -> bool: ...


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
        if run is not None and run.halt(f"stopped at once by a second signal ({name}); the batch in flight runs "
                                        "again on the next start"):
            return
        raise KeyboardInterrupt(f"a second signal ({name})")  # nothing runs yet: abandon the start


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
