"""User code named by import path, ``package.module:function``, as pipeline files name it.

>>> resolve("json:dumps").__name__
'dumps'
>>> try:
...     resolve("json:lods")
... except ImportPathError as exc:
...     print(str(exc).split(";")[0])
module 'json' has no attribute 'lods' (did you mean 'loads'?)
"""

from __future__ import annotations

import importlib
import re
import sys
from types import ModuleType
from typing import Any

from headrace.api.located_yaml import closest

_IMPORT_PATH = re.compile(r"^(?P<module>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):(?P<attr>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)$")


class ImportPathError(Exception):
    """An import path that does not name something importable; the message says why."""


def resolve(path: Any) -> Any:
    """The object ``package.module:name`` names (``name`` may be dotted: ``Class.method``)."""
    match = _IMPORT_PATH.match(path) if isinstance(path, str) else None
    if match is None:
        raise ImportPathError(f"{path!r} is not an import path; write module:function, e.g. my_steps:parse")
    module_name, attribute = match.group("module"), match.group("attr")
    module = _import(module_name)
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            where = f"module {module_name!r}" if value is module else f"{module_name}:{attribute.rsplit('.', 1)[0]}"
            public = sorted(n for n in dir(value) if not n.startswith("_") and callable(getattr(value, n, None)))
            shown = ", ".join(public[:12]) + (", ..." if len(public) > 12 else "")
            listing = f"; its functions and classes: {shown}" if public else ""
            raise ImportPathError(f"{where} has no attribute {part!r}{closest(part, public)}{listing}")
        value = getattr(value, part)
    ship_by_value(module)
    return value


def resolve_callable(path: Any) -> Any:
    """Like :func:`resolve`, for something to call: a function (or a class, or a callable object)."""
    value = resolve(path)
    if not callable(value):
        raise ImportPathError(f"{path} is a {type(value).__name__} ({value!r:.60}), not a function")
    return value


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise ImportPathError(f"cannot import module {name!r}: no module named {exc.name!r} on the Python path "
                                  "(the pipeline file's directory is on it)") from None
        raise ImportPathError(f"importing module {name!r} failed: ModuleNotFoundError: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any error of the user's module, reported with its type
        raise ImportPathError(f"importing module {name!r} failed: {type(exc).__name__}: {exc}") from None


def ship_by_value(module: ModuleType) -> None:
    """Send the code of ``module``'s top-level package to Spark's Python workers with the function
    (by value, with pyspark's cloudpickle and the one operators' instances are pickled with) when it
    is the user's own code rather than an installed package: the workers need not find it on their
    Python path."""
    top = sys.modules.get(module.__name__.split(".")[0], module)
    path = getattr(top, "__file__", None) or ""
    if not path or "site-packages" in path or "dist-packages" in path or top.__name__ == "headrace":
        return
    if top.__name__ in sys.stdlib_module_names:
        return
    import cloudpickle  # operators' and bolts' instances (headrace/engine/instances.py)
    from pyspark import cloudpickle as spark_cloudpickle  # already loaded by the fluent API

    for pickler in (spark_cloudpickle, cloudpickle):
        pickler.register_pickle_by_value(top)
