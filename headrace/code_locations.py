"""Where user code lives: how errors and explain name a user function or the user's line.

A leaf module (it imports nothing from headrace), so that window shapes, plan nodes and
the fluent API can all record where a step was defined when the plan is built.

Spark's workers get user code pickled by value (cloudpickle), and cloudpickle 3.1.3+ names
the file of every such code object ``<dynamic-code>``. So the file is recorded on the user's
functions and classes when the plan is built (:func:`remember_definitions`), and read back
from there in the workers; the line numbers survive pickling.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_PACKAGE_DIR = os.path.dirname(__file__)  # the headrace package: frames in it are not the user's
# ... except the pipelines headrace ships as a user would write them (``headrace demo``): their
# steps are named by their own lines, not by the console script that called them.
_PIPELINES_IN_PACKAGE = (os.path.join(_PACKAGE_DIR, "demo.py"),)
_DECLARED_AT: ContextVar[str | None] = ContextVar("headrace_declared_at", default=None)
DEFINED_IN = "__hr_defined_in__"  # the file name recorded on a user function or class
PICKLED_CODE = "<dynamic-code>"  # the file cloudpickle gives code it pickled by value


def _file_name(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def function_label(fn: Callable[..., Any]) -> str:
    """``parse_event at app.py:12``: how errors and explain name a user function."""
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if code is None:
        return name
    defined_in = getattr(fn, DEFINED_IN, None)
    return f"{name} at {defined_in or _file_name(code.co_filename)}:{code.co_firstlineno}"


def _is_users(value: Any) -> bool:
    """Whether ``value`` (a class or function) is the user's code: not headrace's, not the standard
    library's, not an installed package's."""
    module_name = getattr(value, "__module__", None) or ""
    top = module_name.split(".")[0]
    if not top or top == "headrace" or top in sys.stdlib_module_names:
        return False
    path = getattr(sys.modules.get(module_name), "__file__", None) or ""
    return "site-packages" not in path and "dist-packages" not in path


def _record(target: Any, file_name: str) -> None:
    try:
        setattr(target, DEFINED_IN, file_name)
    except (AttributeError, TypeError):  # a builtin or a slotted object: nothing to record on
        pass


def _remember_function(fn: Any) -> None:
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if isinstance(fn, types.FunctionType) and code is not None and code.co_filename != PICKLED_CODE:
        if not code.co_filename.startswith(_PACKAGE_DIR) and DEFINED_IN not in fn.__dict__:
            _record(fn, _file_name(code.co_filename))


def _remember_class(cls: type) -> None:
    for klass in cls.__mro__:
        if not _is_users(klass) or DEFINED_IN in vars(klass):
            continue
        try:
            path = inspect.getsourcefile(klass)
        except (TypeError, OSError):
            path = None
        if path:
            _record(klass, _file_name(path))
        for member in vars(klass).values():
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            elif isinstance(member, property):
                member = member.fget
            _remember_function(member)


def remember_definitions(value: Any, depth: int = 0) -> None:
    """Record, on the user functions and classes that ``value`` holds (a plan node's fields,
    a function, an operator instance, a grouping), the file each was defined in."""
    if depth > 4 or value is None or isinstance(value, (str, bytes, int, float, bool)):
        return
    if isinstance(value, types.FunctionType | types.MethodType):
        _remember_function(value)
    elif isinstance(value, type):
        if _is_users(value):
            _remember_class(value)
    elif isinstance(value, (tuple, list, set, frozenset)):
        for item in value:
            remember_definitions(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            remember_definitions(item, depth + 1)
    elif _is_users(type(value)):
        _remember_class(type(value))
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            remember_definitions(getattr(value, field.name, None), depth + 1)
    elif type(value).__module__.startswith("headrace."):  # a connector or grouping holding user code
        remember_definitions(list(getattr(value, "__dict__", {}).values()), depth + 1)


def _frame_file(frame: inspect.FrameInfo) -> str:
    """The file of a frame, for code pickled by value read back from its function or class."""
    if frame.filename != PICKLED_CODE:
        return frame.filename
    local = frame.frame.f_locals
    owner = local.get("self", local.get("cls"))
    holder = type(owner) if owner is not None and not isinstance(owner, type) else owner
    candidates = [getattr(holder, frame.function, None), holder, frame.frame.f_globals.get(frame.function)]
    for candidate in candidates:
        recorded = getattr(candidate, DEFINED_IN, None) if candidate is not None else None
        if isinstance(recorded, str):
            return recorded
    return frame.filename


def user_location() -> str:
    """``file:line`` of the first caller outside the headrace package, or the place given to
    :func:`declared_at` around the call."""
    declared = _DECLARED_AT.get()
    if declared is not None:
        return declared
    for frame in inspect.stack()[1:]:
        filename = _frame_file(frame)
        if filename in _PIPELINES_IN_PACKAGE or not filename.startswith((_PACKAGE_DIR, "<")):
            return f"{_file_name(filename)}:{frame.lineno}"
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


def ship_class_by_value(cls: type) -> None:
    """A class defined in a script or a test module (not importable on Spark's workers) travels
    by value, with its instances and state; the files of its methods are recorded first, for
    its errors to name them there (operators and spouts)."""
    import cloudpickle  # only when a pipeline runs

    remember_definitions(cls)
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", "") or ""
    if module is not None and module.__name__ != "__main__" and "site-packages" not in path \
            and not module.__name__.startswith("headrace"):
        cloudpickle.register_pickle_by_value(module)
