"""The connector classes a pipeline file names by ``type:``, imported only when named.

``headrace/sources.py`` and ``headrace/sinks.py`` stay the one list of connectors: their
``from headrace.connectors.X import Y as Name`` lines are read (not run), so checking a file
imports the connectors it uses, not all of them with their client libraries.

>>> sinks = ConnectorTypes("headrace.sinks", "headrace.connectors.base:SinkConnector", exclude=("Failover",))
>>> "Console" in sinks.names and "Failover" not in sinks.names
True
>>> sinks.get("Console").__name__
'Console'
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys


class ConnectorTypes:
    """The public connector classes of ``module`` (``headrace.sources``), subclasses of ``base``
    (``module:Class``), by the name they have there."""

    def __init__(self, module: str, base: str, exclude: tuple[str, ...] = ()) -> None:
        self.module, self.base = module, base
        self.where = {name: origin for name, origin in _public_imports(module).items()
                      if name[:1].isupper() and name not in exclude}

    @property
    def names(self) -> list[str]:
        return list(self.where)

    def __contains__(self, name: object) -> bool:
        return name in self.where

    def get(self, name: str) -> type:
        """The class named ``name`` (imported now)."""
        module, attribute = self.where[name]
        value = getattr(importlib.import_module(module), attribute)
        base_module, _, base_name = self.base.partition(":")
        base = getattr(importlib.import_module(base_module), base_name)
        if not (isinstance(value, type) and issubclass(value, base)):
            raise TypeError(f"{self.module}.{name} is not a {base_name}")
        return value


def _public_imports(module: str) -> dict[str, tuple[str, str]]:
    """``{name: (module, attribute)}`` for the names in ``module``'s ``__all__`` that it imports."""
    loaded = sys.modules.get(module)
    spec = importlib.util.find_spec(module)
    source = spec.loader.get_source(module) if spec is not None and spec.loader is not None else None  # type: ignore[attr-defined]
    if source is None:
        raise ImportError(f"cannot read the source of {module}")
    tree = ast.parse(source)
    imported: dict[str, tuple[str, str]] = {}
    public: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            public = list(ast.literal_eval(node.value))
    if loaded is not None:  # already imported: its __all__ is the truth
        public = list(getattr(loaded, "__all__", public))
    return {name: imported[name] for name in public if name in imported}
