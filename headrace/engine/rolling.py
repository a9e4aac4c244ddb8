"""A rolling ``reduce``'s fold: a key's accumulated record and the next record give the new one.

Shared by the Spark lowering (``headrace/spark/rolling.py``) and the local runner
(``headrace/testing/local/windows.py``), so that both call the user's function and word its
errors the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.code_locations import function_label
from headrace.errors import StepFunctionError

Fold = Callable[[Any, dict[str, Any]], Any]  # (accumulator or None, record) -> accumulator


def reduce_fold(step: str, fn: Callable[[dict[str, Any], dict[str, Any]], Any], names: list[str]) -> Fold:
    """The fold of the reduce step ``step``: the first record of a key as it is, then ``fn(accumulated,
    record)``, which must return a dict; the result keeps the fields ``names``."""
    label = function_label(fn)

    def fold(accumulated: Any, record: dict[str, Any]) -> Any:
        if accumulated is None:
            return record
        try:
            result = fn(dict(accumulated), record)
        except Exception as exc:
            raise StepFunctionError(f"step '{step}' ({label}) raised {type(exc).__name__}: {exc} "
                                    f"(accumulated: {accumulated!r}, record: {record!r})") from exc
        if not isinstance(result, dict):
            raise StepFunctionError(f"step '{step}' ({label}) returned a {type(result).__name__}; a reduce "
                                    f"function must return a dict with the fields {names}")
        return {n: result.get(n) for n in names}

    return fold
