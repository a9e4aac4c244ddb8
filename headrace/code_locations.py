"""Where user code lives: how errors and explain name a user function or the user's line.

A leaf module (it imports nothing from headrace), so that window shapes, plan nodes and
the fluent API can all record where a step was defined when the plan is built.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_PACKAGE_DIR = os.path.dirname(__file__)  # the headrace package: frames in it are not the user's
_DECLARED_AT: ContextVar[str | None] = ContextVar("headrace_declared_at", default=None)


def function_label(fn: Callable[..., Any]) -> str:
    """``parse_event at app.py:12``: how errors and explain name a user function."""
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if code is None:
        return name
    return f"{name} at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"


def user_location() -> str:
    """``file:line`` of the first caller outside the headrace package, or the place given to
    :func:`declared_at` around the call."""
    declared = _DECLARED_AT.get()
    if declared is not None:
        return declared
    for frame in inspect.stack()[1:]:
        if not frame.filename.startswith((_PACKAGE_DIR, "<")):
            return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"
    return "<headrace>"


@contextmanager
def declared_at(where: str) -> Iterator[None]:
    """Within the block, steps are defined at ``where`` (``pipeline.yaml:12``) instead of at the
    Python caller: how a pipeline file's steps, built by the fluent API, name their lines.

    >>> with declared_at("pipeline.yaml:12"):
    ...     user_location()
    'pipeline.yaml:12'
    """
    token = _DECLARED_AT.set(where)
    try:
        yield
    finally:
        _DECLARED_AT.reset(token)
