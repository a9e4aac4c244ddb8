"""The restart strategy of a pipeline's query: how often a failed query is started again from
its checkpoint, and after how long a wait.

As Flink's failure-rate strategy: a query that failed in a way worth restarting
(``headrace/runtime/failures.py`` decides which; a refusal, ``HeadraceError.refusal``, never
is) is restarted unless ``attempts`` restarts
already happened within the last ``window``; the wait before a restart is ``backoff``,
doubled for each restart still inside the window, at most ``MAX_BACKOFF_S``.

>>> policy = RestartPolicy(attempts=3, window_s=600, backoff_s=1)
>>> [policy.next_delay(now) for now in (0, 10, 20, 30)]
[1.0, 2.0, 4.0, None]
>>> policy.next_delay(615)  # the restarts at 0 and 10 s have left the window; the one at 20 s counts
2.0
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from headrace import config
from headrace.durations import describe_millis, to_millis
from headrace.errors import PlanError

MAX_BACKOFF_S = 60.0


@dataclass
class RestartPolicy:
    attempts: int  # restarts allowed within the window; 0: a failure ends the run
    window_s: float
    backoff_s: float
    restarted_at: list[float] = field(default_factory=list)  # when each restart in the window was decided

    @classmethod
    def of(cls, attempts: int | None = None, window: str | int | datetime.timedelta | None = None,
           backoff: str | int | datetime.timedelta | None = None) -> RestartPolicy:
        """The policy from ``hr.run``'s arguments; an argument left at None takes its setting
        (``HEADRACE_RESTART_ATTEMPTS``, ``..._WINDOW``, ``..._BACKOFF``)."""
        count = _attempts(attempts) if attempts is not None else _attempts(config.RESTART_ATTEMPTS.get(),
                                                                            config.RESTART_ATTEMPTS.env)
        window_ms = _duration(window, "restart_window", config.RESTART_WINDOW)
        backoff_ms = _duration(backoff, "restart_backoff", config.RESTART_BACKOFF)
        if window_ms <= 0:
            raise PlanError(f"restart_window must be a positive duration, got {window!r}")
        return cls(count, window_ms / 1000, backoff_ms / 1000)

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before restarting after a failure at ``now``; None when the attempts
        within the window are used up (the run then ends with the failure)."""
        recent = [moment for moment in self.restarted_at if now - moment < self.window_s]
        if len(recent) >= self.attempts:
            return None
        self.restarted_at = [*recent, now]
        return float(min(self.backoff_s * 2 ** len(recent), MAX_BACKOFF_S))

    def describe(self) -> str:
        """``3 restarts within 10m``."""
        noun = "restart" if self.attempts == 1 else "restarts"
        return f"{self.attempts} {noun} within {describe_millis(int(self.window_s * 1000))}"


def _attempts(value: object, what: str = "restart_attempts") -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PlanError(f"{what}: expected a whole number of restarts, 0 or more, got {value!r}")
    return value


def _duration(value: object, argument: str, setting: config.Setting) -> int:
    ms = to_millis(value, argument) if value is not None else to_millis(setting.get(), setting.env)
    if ms < 0:
        raise PlanError(f"{argument if value is not None else setting.env}: a duration cannot be negative, "
                        f"got {value if value is not None else setting.get()!r}")
    return ms
