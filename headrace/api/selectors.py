"""Flume's channel selectors for a pipeline file's sources and steps: which consumers get a record.

* ``replicating`` (the default): every consumer gets every record.
* ``multiplexing``: each record goes to the consumers its field's value is mapped to, and
  to the ``default`` consumers when the value is mapped to none (or is null).

A multiplexing selector becomes one native filter per consumer, ``<step>_to_<consumer>``,
between the step and that consumer; a consumer's condition is built here:

>>> selector = Multiplexing("region", {"eu_log": ("eu",), "us_log": ("us", "ca")}, ("archive",), 7)
>>> selector.condition("us_log")
isin(col('region'), 'us', 'ca')
>>> selector.condition("archive")
(not(isin(col('region'), 'eu', 'us', 'ca')) | is_null(col('region')))
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.expr import Expr, col

REPLICATING = "replicating"
MULTIPLEXING = "multiplexing"


@dataclass(frozen=True)
class Multiplexing:
    """Route each record by the value of ``field``: ``routes`` maps a consumer to the values it
    gets, ``default`` names the consumers of the values no route names. ``line`` is where the
    selector is written."""

    field: str
    routes: dict[str, tuple[object, ...]]
    default: tuple[str, ...]
    line: int

    def mapped_values(self) -> tuple[object, ...]:
        seen: dict[object, None] = {}
        for values in self.routes.values():
            seen.update(dict.fromkeys(values))
        return tuple(seen)

    def consumers(self) -> set[str]:
        return {*self.routes, *self.default}

    def condition(self, consumer: str) -> Expr:
        """The records ``consumer`` gets."""
        field = col(self.field)
        parts: list[Expr] = []
        if self.routes.get(consumer):
            parts.append(field.isin(*self.routes[consumer]))
        if consumer in self.default:
            mapped = self.mapped_values()
            parts.append((~field.isin(*mapped) | field.is_null()) if mapped else field.is_null() | field.is_not_null())
        condition = parts[0]
        for part in parts[1:]:
            condition = condition | part
        return condition

    def route_name(self, owner: str, consumer: str) -> str:
        """The name of the filter step between ``owner`` and ``consumer``."""
        return f"{owner}_to_{consumer}"
