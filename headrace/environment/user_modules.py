"""The user's own modules, shipped to Spark's Python workers with the code that needs them.

A pipeline's functions and classes are pickled on the driver and unpickled in Spark's Python
workers. cloudpickle pickles a function or class of a module the driver imported by reference
(the module's name), so the worker imports that module again; a module the worker cannot import
fails the batch (``ModuleNotFoundError: No module named 'mysteps'``). That is the case of the
modules a script imports from its own folder (``python app/main.py`` puts ``app/`` on the
driver's path only), of a test's modules and of a folder added to ``sys.path`` at run time.

:func:`ship_user_modules`, called as every run starts (``headrace/runtime/runner.py``: ``p.run()``,
the test kit, ``headrace run`` and the server's drivers all start runs there), finds the top-level
modules and packages the driver has imported that are the user's own (neither the standard
library's, nor an installed package's, nor headrace's or pyspark's) and that the workers cannot
import as the same file, and has them pickled by value (``register_pickle_by_value``, with
pyspark's cloudpickle and with the one operators' instances are pickled with): their code travels
with the functions and classes that use it, and the workers need not find it on their path.

Whether a worker can import a module is asked of the workers' Python itself, once per module:
for a local master it runs on this machine, in the directory Spark's JVM started in, with the
environment's ``PYTHONPATH``; a module it finds at the same file stays pickled by reference, as
before. On a cluster the executors have other files: every user module travels by value.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import sysconfig
from types import ModuleType
from typing import Any

from headrace.environment.session import jvm_directory

# never shipped: headrace and what it runs on (installed, and loaded in every worker)
_NOT_USERS = frozenset({"__main__", "headrace", "pyspark", "py4j", "cloudpickle"})
_INSTALLED = ("site-packages", "dist-packages")
_CHECK_TIMEOUT_S = 60.0
_FIND_SPECS = """\
import importlib.util, json, sys
found = {}
for name in json.loads(sys.argv[1]):
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    found[name] = None if spec is None else [spec.origin, list(spec.submodule_search_locations or [])]
print(json.dumps(found))
"""

# {(module name, its location, the workers' Python, their directory, PYTHONPATH): importable there}
_importable: dict[tuple[str, tuple[str, ...], str, str, str], bool] = {}


def location(module: ModuleType) -> tuple[str, ...]:
    """Where a module lives: its file, or a namespace package's folders; () for a built-in one.

    >>> import json
    >>> location(json)[0].endswith("json/__init__.py")
    True
    >>> location(sys)
    ()
    """
    path = getattr(module, "__file__", None)
    if path:
        return (os.path.realpath(path),)
    return tuple(sorted(os.path.realpath(folder) for folder in getattr(module, "__path__", None) or ()))


@functools.cache
def _standard_library() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(os.path.realpath(paths[key]) + os.sep for key in ("stdlib", "platstdlib") if key in paths)


def is_users(name: str, where: tuple[str, ...]) -> bool:
    """Whether the top-level module ``name`` at ``where`` is the user's own code.

    >>> is_users("mysteps", ("/home/ada/app/mysteps.py",))
    True
    >>> is_users("numpy", ("/venv/lib/python3.12/site-packages/numpy/__init__.py",))
    False
    >>> is_users("headrace", ("/src/headrace/__init__.py",)), is_users("os", ("/usr/lib/python3.12/os.py",))
    (False, False)
    """
    if not where or "." in name or name in _NOT_USERS or name in sys.stdlib_module_names:
        return False
    standard = _standard_library()
    return not any(part in path for path in where for part in _INSTALLED) and \
        not any(path.startswith(standard) for path in where)


def user_modules() -> dict[str, ModuleType]:
    """The user's own top-level modules and packages the driver has imported, by name."""
    found = {}
    for name, module in list(sys.modules.items()):
        if "." in name or name in _NOT_USERS or not isinstance(module, ModuleType):
            continue  # a submodule travels with its top-level package
        if is_users(name, location(module)):
            found[name] = module
    return found


def importable_on_workers(modules: dict[str, ModuleType], python: str, directory: str) -> set[str]:
    """Those of ``modules`` the workers' ``python``, started in ``directory`` with this process's
    ``PYTHONPATH``, imports from the same file (asked once per module; none if it cannot be asked)."""
    path = os.environ.get("PYTHONPATH", "")
    keys = {name: (name, location(module), python, directory, path) for name, module in modules.items()}
    unknown = [name for name, key in keys.items() if key not in _importable]
    if unknown:
        found = _find_on_workers(unknown, python, directory)
        for name in unknown:
            where = found.get(name)
            _importable[keys[name]] = where is not None and _same_place(where, keys[name][1])
    return {name for name, key in keys.items() if _importable[key]}


def _find_on_workers(names: list[str], python: str, directory: str) -> dict[str, Any]:
    """Where the workers' Python finds each of ``names`` (None: not at all); {} when it cannot be
    asked, so that every module is shipped."""
    try:
        done = subprocess.run([python, "-c", _FIND_SPECS, json.dumps(names)], cwd=directory, capture_output=True,
                              text=True, timeout=_CHECK_TIMEOUT_S)
        found = json.loads(done.stdout) if done.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _same_place(found: list[Any], where: tuple[str, ...]) -> bool:
    """Whether a worker's find (origin, search locations) is the module at ``where``."""
    origin, folders = found
    if origin and origin != "namespace":
        return (os.path.realpath(origin),) == where
    return tuple(sorted(os.path.realpath(folder) for folder in folders)) == where


def register_by_value(module: ModuleType) -> None:
    """Have ``module`` (and its submodules) pickled by value by both picklers a run uses."""
    import cloudpickle  # operators' and bolts' instances (headrace/engine/instances.py)
    from pyspark import cloudpickle as spark_cloudpickle  # Spark's Python functions and data sources

    for pickler in (spark_cloudpickle, cloudpickle):
        pickler.register_pickle_by_value(module)


def ship_user_modules(spark: Any) -> list[str]:
    """Ship by value the user's modules the workers of ``spark`` (a session) cannot import (the
    module's docstring); returns their names."""
    modules = user_modules()
    context = spark.sparkContext
    if modules and str(context.master).startswith("local"):
        python = context.pythonExec or sys.executable
        for name in importable_on_workers(modules, python, jvm_directory()):
            del modules[name]
    for module in modules.values():
        register_by_value(module)
    return sorted(modules)
