"""A Storm ``JoinBolt`` (``headrace/storm_joins.py``) added to a topology: built with the fluent
API as a window join of its two streams (docs/joins.md), so it runs on Spark's own
stream-stream join. Each stream's fields are renamed ``<component>__<field>`` on the way in,
so the two streams may share field names (their timestamp field, for one) and ``select``
names a field by its component, as Storm does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from headrace.errors import PlanError
from headrace.expr import col
from headrace.storm import DEFAULT_STREAM, StreamDeclaration
from headrace.storm_joins import JoinBolt
from headrace.windows import Tumbling

if TYPE_CHECKING:
    from headrace.api.stream import Stream


def _side(builder: Any, bolt: JoinBolt, component: str, name: str) -> Stream:
    """The component's stream, its fields renamed, with its event time declared."""
    stream = builder.stream(component)
    schema = stream.node.schema
    if schema is None:
        raise PlanError(f"JoinBolt of bolt {name!r} ({bolt.where}): the fields of {component!r} are unknown; give "
                        "the spout or stream a schema")
    time = bolt.timestamp_field
    if time is None:
        raise bolt._fail("has no timestamp field: call with_timestamp_field(field, lag=...); the join runs in event "
                         "time, each stream's watermark trailing its tuples by the lag")
    if time not in dict(schema):
        raise bolt._fail(f"the timestamp field {time!r} is not a field of {component!r}; its fields: "
                         f"{', '.join(n for n, _ in schema)}")
    renamed = stream.select(**{f"{component}__{field}": col(field) for field, _ in schema},
                            name=f"{name}__{component}")
    return renamed.with_event_time(f"{component}__{time}", bolt.lag, name=f"{name}__{component}_time")


def add_join_bolt(builder: Any, name: str, bolt: JoinBolt) -> StreamDeclaration:
    """Add the join to ``builder`` (a TopologyBuilder) and the selection of its output fields as
    steps; the last one is named
    ``name`` (the bolt's id), which bolts and ``builder.stream(name)`` read. Returns its stream."""
    bolt.check()
    join = bolt.joins[0]
    left, right = (_side(builder, bolt, component, name) for component in (bolt.source, join.stream))
    window = Tumbling(bolt.window)
    joined = left.join(right, on={f"{bolt.source}__{bolt.key}": f"{join.stream}__{join.key}"}, how=join.how,
                       window=window, name=f"{name}__join")
    out = joined.select(**{field: col(f"{component}__{field}") for component, field in bolt.selected}, name=name)
    schema = out.node.schema
    fields = tuple(n for n, _ in schema) if schema is not None else None
    return StreamDeclaration(DEFAULT_STREAM, fields, schema)


def join_inputs(bolt: Any) -> tuple[str, ...]:
    """The components a JoinBolt reads (its subscriptions must name them)."""
    return (bolt.source, bolt.joins[0].stream) if bolt.joins else (bolt.source,)
