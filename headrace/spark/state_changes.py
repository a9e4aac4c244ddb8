"""What a restart compares of a stateful step's state, one function per kind, named by the
kind's spec (``compare_state`` in ``headrace/spark/specs.py``). They read the JSON of the step in
the plan stored beside the checkpoint and in the new plan (``headrace/runtime/compatibility.py``),
with the texts a refusal shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from headrace.durations import describe_millis
from headrace.triggers import Trigger
from headrace.windows import WindowShape


@dataclass(frozen=True)
class Change:
    what: str
    old: str
    new: str

    def __str__(self) -> str:
        return f"{self.what} {self.old} → {self.new}"


class StateDiff:
    """One stateful step in the old and the new plan record: the changes its saved state cannot
    follow (``refused``) and those it can (``allowed``: its code)."""

    def __init__(self, old: dict[str, Any], new: dict[str, Any], old_input: dict[str, Any],
                 new_input: dict[str, Any], old_late: list[str], new_late: list[str]) -> None:
        self.old, self.new = old, new
        self.old_input, self.new_input = old_input, new_input  # the nodes they read
        self.old_late, self.new_late = old_late, new_late  # their late side outputs
        self.refused: list[Change] = []
        self.allowed: list[Change] = []

    def check(self, what: str, before: Any, after: Any) -> None:
        if before != after:
            self.refused.append(Change(what, text(before), text(after)))

    def check_key(self, what: str, key: str, show: Any = None) -> None:
        """``check`` of the setting ``key`` of both records, as ``show`` renders it."""
        before, after = self.old.get(key), self.new.get(key)
        self.check(what, show(before) if show else before, show(after) if show else after)

    def check_fields(self, what: str, before: Any, after: Any) -> None:
        """Only the fields that differ, when both schemas are known."""
        if before is not None and after is not None and before != after:
            old_only = [f"{n} {t}" for n, t in before if [n, t] not in after]
            new_only = [f"{n} {t}" for n, t in after if [n, t] not in before]
            self.refused.append(Change(what, ", ".join(old_only) or "none", ", ".join(new_only) or "none"))

    def allow(self, *keys: str) -> None:
        """Changes of the settings ``keys`` that the state follows (the step's code)."""
        self.allowed += differences(self.old, self.new, only=keys)


def compare_window(diff: StateDiff) -> None:
    old, new = diff.old, diff.new
    diff.check_key("window", "window", window_text)
    diff.check("event time field", diff.old_input.get("event_time"), diff.new_input.get("event_time"))
    diff.check_key("emit", "emit")
    old_emission, new_emission = old.get("emission") or {}, new.get("emission") or {}
    diff.check("trigger", trigger_text(old_emission.get("trigger")), trigger_text(new_emission.get("trigger")))
    diff.check("allowed lateness", millis_text(old_emission.get("allowed_lateness_ms")),
               millis_text(new_emission.get("allowed_lateness_ms")))
    diff.check("accumulation", old_emission.get("accumulation"), new_emission.get("accumulation"))
    diff.check_key("window function", "function")
    diff.check_key("aggregates", "aggs", aggs_text)
    diff.check("late side output", late_text(diff.old_late), late_text(diff.new_late))
    if old.get("operator") and new.get("operator"):  # records of earlier versions lack it
        diff.check_key("operator", "operator")
    if new.get("function") in ("aggregates", "reduce") and not diff.refused:  # e.g. sum over long → double
        diff.check_fields("output fields", old.get("schema"), new.get("schema"))
    if new.get("function") in ("reduce", "process"):  # the state keeps input records
        diff.check_fields("input fields", diff.old_input.get("schema"), diff.new_input.get("schema"))
    diff.allow("fn")


def compare_rolling(diff: StateDiff) -> None:
    diff.check_key("aggregates", "aggs", aggs_text)
    diff.check_key("reduce", "reduce", lambda reduce: "yes" if reduce else "no")
    # a ttl moves built-in aggregates from Spark's groupBy to a Python fold with a timeout;
    # a different ttl is only a different timeout
    diff.check_key("ttl", "ttl_ms", lambda ttl: "set" if ttl is not None else "none")
    if not diff.refused:  # a reduce keeps whole records; aggregates keep values of their fields' types
        diff.check_fields("output fields", diff.old.get("schema"), diff.new.get("schema"))
    diff.allow("reduce", "ttl_ms")


def compare_sql(diff: StateDiff) -> None:
    diff.check_key("query shape", "shape")
    diff.allow("query")


def compare_process(diff: StateDiff) -> None:
    diff.check_key("declared state", "state", state_text)
    diff.allow("fn")


def compare_stream_join(diff: StateDiff) -> None:
    # Spark keeps each side's records by the join keys (a window join's window among them); a
    # different interval only changes when they are evicted
    diff.check_key("join keys", "left_on")
    diff.check_key("join keys of the right stream", "right_on")
    diff.check_key("join kind", "how")
    diff.check_key("window", "window", window_text)
    diff.check("window join state", window_join_state(diff.old), window_join_state(diff.new))
    diff.check_fields("input fields", diff.old_input.get("schema"), diff.new_input.get("schema"))
    diff.allow("within_ms")


def window_join_state(record: dict[str, Any]) -> str | None:
    """Where a window join keeps each side's records: under Spark's window column, or (a checkpoint
    written by a headrace before window joins were Spark's own) under the window's start."""
    if record.get("window") is None:
        return None
    return "by window" if record.get("state_key") == "window" else "by window start (an earlier headrace)"


def compare_dedupe(diff: StateDiff) -> None:
    # Spark keeps each key with the time it expires (its first record's + within): a different
    # within applies to the keys first seen after the restart
    diff.check_key("dedupe keys", "on")
    keys = diff.new.get("on") or []
    old, new = diff.old_input.get("schema"), diff.new_input.get("schema")
    if old is not None and new is not None:  # the state keeps the keys' values, nothing else of a record
        diff.check_fields("key field types", [f for f in old if f[0] in keys], [f for f in new if f[0] in keys])
    diff.allow("within_ms")


def compare_operator(diff: StateDiff) -> None:
    diff.check_key("partitions", "partitions")  # instances own their state: their number is fixed
    diff.allow("application_window", "edges")


# -- rendering -------------------------------------------------------------------------------------

def differences(old: dict[str, Any], new: dict[str, Any], ignore: tuple[str, ...] = (),
                only: tuple[str, ...] | None = None) -> tuple[Change, ...]:
    keys = [k for k in dict.fromkeys([*old, *new]) if k not in ignore and (only is None or k in only)]
    return tuple(Change(k, text(old.get(k)), text(new.get(k))) for k in keys if old.get(k) != new.get(k))


def text(value: Any, limit: int = 80) -> str:
    shown = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return shown if len(shown) <= limit else shown[:limit - 3] + "..."


def millis_text(value: Any) -> str:
    return describe_millis(int(value)) if isinstance(value, int) and value else "none"


def window_text(window: Any) -> str:
    if not isinstance(window, dict) or window.get("kind") not in WindowShape.KINDS:
        return text(window)
    return WindowShape.from_json(window).describe()


def trigger_text(trigger: Any) -> str:
    if not isinstance(trigger, dict) or trigger.get("type") not in Trigger.KINDS:
        return text(trigger)
    return Trigger.from_json(trigger).brief()


def aggs_text(aggs: Any) -> str:
    if not aggs:
        return "none"
    return ", ".join(f"{name}={agg.get('func')}({agg.get('column') or ''})" for name, agg in aggs.items())


def late_text(names: list[str]) -> str:
    return ", ".join(repr(n) for n in names) if names else "none"


def state_text(state: Any) -> str:
    return ", ".join(f"{name} ({kind})" for name, kind in state.items()) if state else "none"
