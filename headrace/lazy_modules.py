"""A module imported on first use, for heavy libraries that only running a pipeline needs.

Building, checking and explaining a plan (``headrace validate`` takes under 2 s) never
touches pandas, yet the lowering modules that ``explain`` reads name it; they hold it as
``pd = LazyModule("pandas")``, imported the first time one of its names is read.

>>> json = LazyModule("json")
>>> json.dumps([1])
'[1]'
>>> import pickle; pickle.loads(pickle.dumps(json)).__name__  # pickled as the module itself
'json'
"""

from __future__ import annotations

import importlib
from typing import Any


def lazy_attributes(module: str, where: dict[str, str]) -> Any:
    """A module's ``__getattr__`` (PEP 562) that imports each name of ``where`` on first use,
    from its ``"module:attribute"``.

    >>> getattr_ = lazy_attributes("m", {"dumps": "json:dumps"})
    >>> getattr_("dumps")([1])
    '[1]'
    """

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        origin, _, attribute = where[name].partition(":")
        return getattr(importlib.import_module(origin), attribute)

    return __getattr__


class LazyModule:
    """Stands for the module ``name`` and imports it when one of its names is first read;
    after that its names are found here directly. Pickled (for Spark's workers) as the module."""

    def __init__(self, name: str) -> None:
        self.__dict__["_lazy_name"] = name

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self.__dict__["_lazy_name"])
        self.__dict__.update(vars(module))
        return getattr(module, attribute)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return importlib.import_module, (self.__dict__["_lazy_name"],)

    def __repr__(self) -> str:
        return f"LazyModule({self.__dict__['_lazy_name']!r})"
