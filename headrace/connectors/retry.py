"""Retrying a sink's step with exponential backoff while its failures are transient.

A step is retried after each transient failure, waiting ``first_s``, then twice as long
each time, at most ``max_s``: with the defaults (5 retries, 0.5 s, 8 s) the waits are
0.5, 1, 2, 4 and 8 s, six attempts over about 15.5 s. Any other failure is raised at once.

>>> list(Backoff(retries=6, first_s=0.5).delays())
[0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
>>> Backoff(retries=0).attempts
1
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from headrace.errors import PlanError

T = TypeVar("T")

DEFAULT_RETRIES = 5
DEFAULT_FIRST_S = 0.5
DEFAULT_MAX_S = 8.0


@dataclass(frozen=True)
class Backoff:
    """How often and how patiently a step is tried again."""

    retries: int = DEFAULT_RETRIES
    first_s: float = DEFAULT_FIRST_S
    max_s: float = DEFAULT_MAX_S

    @staticmethod
    def checked(retries: object, first_s: object, where: str) -> Backoff:
        """A backoff from a connector's ``retries=`` and ``retry_backoff=`` arguments, or a PlanError."""
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise PlanError(f"{where}: retries must be a whole number of retries, 0 or more, got {retries!r}")
        if isinstance(first_s, bool) or not isinstance(first_s, (int, float)) or not 0 < first_s <= DEFAULT_MAX_S:
            raise PlanError(f"{where}: retry_backoff must be the first wait in seconds, more than 0 and at most "
                            f"{DEFAULT_MAX_S:g}, got {first_s!r}")
        return Backoff(retries, float(first_s))

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def delays(self) -> Iterator[float]:
        """The wait before each retry."""
        for number in range(self.retries):
            yield min(self.first_s * 2 ** number, self.max_s)


# How a connector says that a server stayed out of reach through all its retries: the restart
# strategy (headrace/runtime/failures.py) restarts the query on an error that says so.
UNREACHABLE = "unreachable after"


def unreachable(service: str, attempts: int, elapsed_s: float) -> str:
    """``PostgreSQL unreachable after 6 attempts over 15.5 s``: the words a connector's error
    uses when the server stayed out of reach (the run restarts the query on them).

    >>> unreachable("Kafka", 1, 0.04)
    'Kafka unreachable after 1 attempt over 0.0 s'
    """
    return f"{service} {UNREACHABLE} {attempts} attempt{'s' if attempts != 1 else ''} over {elapsed_s:.1f} s"


class RetriesExhausted(Exception):
    """Every attempt failed with a transient error; ``last`` is the last one."""

    def __init__(self, attempts: int, elapsed_s: float, last: BaseException) -> None:
        super().__init__(f"{attempts} attempts over {elapsed_s:.1f} s: {last}")
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.last = last


def retry(action: Callable[[], T], backoff: Backoff, transient: Callable[[BaseException], bool],
          on_retry: Callable[[BaseException], None] = lambda _exc: None,
          sleep: Callable[[float], None] = time.sleep, deadline_s: float | None = None) -> T:
    """``action()``, tried again after each transient failure (``on_retry(error)`` runs first,
    e.g. to drop a broken connection), until it succeeds, fails otherwise (raised as is) or
    runs out of attempts or of time (``deadline_s`` after the first attempt began):
    :class:`RetriesExhausted`.

    >>> calls = []
    >>> def down() -> None:
    ...     calls.append(1)
    ...     raise TimeoutError("no answer")
    >>> retry(down, Backoff(retries=5), lambda e: True, sleep=lambda s: None, deadline_s=0.0)
    Traceback (most recent call last):
    headrace.connectors.retry.RetriesExhausted: 1 attempts over 0.0 s: no answer
    >>> len(calls)
    1
    """
    started = time.monotonic()
    delays = backoff.delays()
    attempts = 0
    while True:
        attempts += 1
        try:
            return action()
        except Exception as exc:
            if not transient(exc):
                raise
            delay = next(delays, None)
            elapsed = time.monotonic() - started
            if delay is None or (deadline_s is not None and elapsed + delay > deadline_s):
                raise RetriesExhausted(attempts, elapsed, exc) from exc
            on_retry(exc)
            sleep(delay)
