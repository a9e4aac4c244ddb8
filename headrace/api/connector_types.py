"""The connector classes a pipeline file names by ``type:``, imported only when named.

``headrace/sources.py`` and ``headrace/sinks.py`` stay the one list of connectors
(``CONNECTORS``), whose modules load on first use, so checking a file imports the connectors it
uses, not all of them with their client libraries.

>>> sinks = ConnectorTypes("headrace.sinks", "headrace.connectors.base:SinkConnector", exclude=("Failover",))
>>> "Console" in sinks.names and "Failover" not in sinks.names
True
>>> sinks.get("Console").__name__
'Console'
"""

from __future__ import annotations

import importlib


class ConnectorTypes:
    """The public connector classes of ``module`` (``headrace.sources``), subclasses of ``base``
    (``module:Class``), by the name they have there."""

    def __init__(self, module: str, base: str, exclude: tuple[str, ...] = ()) -> None:
        self.module, self.base = module, base
        self.where = {name: origin for name, origin in _public_classes(module).items()
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


def _public_classes(module: str) -> dict[str, tuple[str, str]]:
    """``{name: (module, attribute)}`` of the connector list ``CONNECTORS`` of ``module``."""
    listed: dict[str, str] = importlib.import_module(module).CONNECTORS
    return {name: (origin.partition(":")[0], origin.partition(":")[2]) for name, origin in listed.items()}
