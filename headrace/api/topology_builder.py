"""Storm topologies on a ``hr.Pipeline``: spouts, bolts with parallelism, and groupings.

>>> import headrace as hr
>>> class Exclaim(hr.Bolt):
...     declare_output_fields = "word string"
...     def process(self, tuple):
...         self.emit([tuple["word"] + "!!!"], anchors=tuple)
>>> builder = hr.TopologyBuilder("exclaim_doc")
>>> builder.set_spout("word", hr.testing.TestSource([[{"word": "storm"}]], schema="word string"))
>>> builder.set_bolt("exclaim", Exclaim(), parallelism=2).shuffle_grouping("word")
<BoltDeclarer 'exclaim'>
>>> builder.stream("exclaim").sink("out", hr.sinks.Null())
>>> print(next(line.strip() for line in builder.pipeline.explain().splitlines() if "Exclaim" in line))
exclaim          operator Exclaim x2 (word.default <- word shuffle) <- word

A bolt is an ``OperatorNode(api="storm")`` with ``parallelism`` instances (its tasks); each
declared stream is one of its output ports; each subscription is an ``Edge`` into the input
port ``<component>.<stream>``. A component id names a spout or bolt of this builder, or any step
or Apex operator of the pipeline (whose output ports are its streams), so operators, bolts and
fluent streams mix in one pipeline. Components are declared before they are subscribed to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrace.apex_operators import Operator
from headrace.api.join_bolts import add_join_bolt, join_inputs
from headrace.api.operator_dag import InputPortRef, OutputPortRef, add_stream
from headrace.code_locations import user_location
from headrace.contract import SourceConnector
from headrace.errors import PlanError
from headrace.groupings import All, Custom, Direct, Fields, Global, Grouping, LocalOrShuffle, PartialKey, Shuffle
from headrace.plan.nodes import OperatorNode
from headrace.storm import (
    DEFAULT_STREAM,
    TICK_COMPONENT,
    BaseWindowedBolt,
    Bolt,
    Spout,
    StreamDeclaration,
    declared_streams,
    spout_stream,
    tick_millis,
    tuple_of,
)
from headrace.storm_joins import JoinBolt

if TYPE_CHECKING:
    from headrace.api.stream import Pipeline, Stream


@dataclass(frozen=True)
class Component:
    """A spout, bolt, Apex operator or fluent step as the builder sees it: the plan node bolts
    read from and its streams."""

    id: str
    kind: str  # "spout" (an hr.Spout), "source" (a connector or a fluent stream), "bolt", "operator"
    node: str
    streams: dict[str, StreamDeclaration]


@dataclass(frozen=True)
class TupleCustom(Custom):
    """A custom grouping whose function gets a ``Tuple`` from every kind of component."""

    component: str = ""
    stream: str = DEFAULT_STREAM

    def targets(self, record: Any, instances: int, *, emitter: int, sent: list[int]) -> list[int]:
        return super().targets(tuple_of(record, self.component, self.stream), instances, emitter=emitter, sent=sent)


def _parallelism(value: Any, what: str, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"{what} ({where}): parallelism must be a whole number of tasks, at least 1, got {value!r}")
    return value


class TopologyBuilder:
    """Builds a Storm topology on ``pipeline`` (an ``hr.Pipeline``, or a name for a new one)."""

    def __init__(self, pipeline: Pipeline | str) -> None:
        from headrace.api.stream import Pipeline

        self.pipeline: Pipeline = Pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        if not isinstance(self.pipeline, Pipeline):
            raise PlanError(f"TopologyBuilder takes an hr.Pipeline or a pipeline name, got {pipeline!r}")
        self._components: dict[str, Component] = {}
        self._views: dict[str, str] = {}  # spout id -> the step selecting its declared fields

    # -- components -----------------------------------------------------------------------------------
    def _new_id(self, component_id: Any, what: str, where: str) -> str:
        if not isinstance(component_id, str) or not component_id or component_id == TICK_COMPONENT:
            raise PlanError(f"{what} ({where}): component id {component_id!r} must be a non-empty string other than "
                            f"{TICK_COMPONENT!r}")
        if "." in component_id:
            raise PlanError(f"{what} ({where}): component id {component_id!r} must not contain '.' (it names "
                            "streams as <component>.<stream>)")
        return component_id

    def _new_component(self, method: str, component_id: Any, component: Any, parallelism: Any) -> tuple[str, str]:
        """What ``set_spout`` and ``set_bolt`` check first: a new component id, a parallelism and a
        spout or bolt instance (not its class). Returns how messages name the call, and where it is."""
        where = user_location()
        what = f"{method}({component_id!r})"
        self._new_id(component_id, what, where)
        _parallelism(parallelism, what, where)
        if isinstance(component, type):
            raise PlanError(f"{what} ({where}): give an instance of the {method.removeprefix('set_')}, e.g. "
                            f"{component.__name__}(), not the class")
        return what, where

    def set_spout(self, component_id: str, spout: Any, parallelism: int = 1, *,
                  max_tuples_per_batch: int = 1000) -> None:
        """Add a spout: an ``hr.Spout`` (run on the driver, ``parallelism`` tasks), a headrace source
        connector (``hr.sources.Kafka(...)``: its partitions are its parallelism) or a fluent stream."""
        from headrace.api.stream import Stream
        from headrace.connectors.spout import SpoutSource

        what, where = self._new_component("set_spout", component_id, spout, parallelism)
        if isinstance(spout, Spout):
            declaration = spout_stream(spout, f"step '{component_id}' ({where})")
            connector = SpoutSource(component_id, spout, parallelism, max_tuples_per_batch, declaration)
            stream = self.pipeline.source(component_id, connector)
            self._add(Component(component_id, "spout", stream.node.name, {declaration.name: declaration}))
            return
        if parallelism != 1:
            raise PlanError(f"{what} ({where}): parallelism {parallelism} applies to an hr.Spout; a source "
                            "connector's parallelism is its own partitions (a Kafka topic's, for one); leave it at 1")
        if isinstance(spout, SourceConnector):
            stream = self.pipeline.source(component_id, spout)
        elif isinstance(spout, Stream):
            if spout.pipeline is not self.pipeline:
                raise PlanError(f"{what} ({where}): the stream belongs to pipeline {spout.pipeline.name!r}, not to "
                                f"{self.pipeline.name!r}")
            stream = spout
        else:
            raise PlanError(f"{what} ({where}): expected an hr.Spout, a headrace source connector or a stream, got "
                            f"{type(spout).__name__}")
        schema = stream.node.schema
        fields = tuple(n for n, _ in schema) if schema is not None else None
        self._add(Component(component_id, "source", stream.node.name,
                            {DEFAULT_STREAM: StreamDeclaration(DEFAULT_STREAM, fields, schema)}))

    def set_bolt(self, component_id: str, bolt: Any, parallelism: int = 1) -> BoltDeclarer:
        """Add a bolt with ``parallelism`` tasks; subscribe it to streams through what this returns."""
        what, where = self._new_component("set_bolt", component_id, bolt, parallelism)
        if isinstance(bolt, JoinBolt):  # Spark's own join, whose parallelism is Spark's
            declaration = add_join_bolt(self, component_id, bolt)
            self._add(Component(component_id, "source", component_id, {DEFAULT_STREAM: declaration}))
            return JoinBoltDeclarer(self, component_id, join_inputs(bolt))
        if not isinstance(bolt, Bolt):
            hint = "; add Apex operators with pipeline.add_operator" if isinstance(bolt, Operator) else ""
            raise PlanError(f"{what} ({where}): expected an hr.Bolt, got {type(bolt).__name__}{hint}")
        kind = type(bolt)
        step = f"step '{component_id}' ({where})"
        if isinstance(bolt, BaseWindowedBolt):
            if type(bolt).execute is BaseWindowedBolt.execute:
                raise PlanError(f"{step}: {kind.__name__} has no execute(self, window) method")
            if bolt.window_config is None:
                raise PlanError(f"{step}: {kind.__name__} has no window: call with_window(length, sliding_interval) "
                                "on it, e.g. with_window(30, 10) or with_window('10s', '5s')")
            if kind.tick_every is not None or "tick_every" in vars(bolt):
                raise PlanError(f"{step}: a windowed bolt is driven by its window; tick_every is for other bolts")
        elif kind.process is Bolt.process:
            raise PlanError(f"{step}: {kind.__name__} has no process(self, tuple) method")
        tick_millis(bolt)
        streams = declared_streams(bolt, step)
        config = getattr(bolt, "window_config", None)
        if config is not None and config.late_stream and config.late_stream not in streams:
            streams[config.late_stream] = StreamDeclaration(config.late_stream, None)
        ports = tuple((name, declaration.schema) for name, declaration in streams.items())
        self.pipeline.plan.add(OperatorNode(component_id, (), where, None, operator=bolt, partitions=parallelism,
                                            output_ports=ports, api="storm"))
        self._add(Component(component_id, "bolt", component_id, streams))
        return BoltDeclarer(self, component_id)

    def _add(self, component: Component) -> None:
        self._components[component.id] = component

    def component(self, component_id: Any, where: str, what: str) -> Component:
        """A component by id: this builder's spouts and bolts, then the pipeline's steps and operators."""
        known = self._components.get(component_id)
        if known is not None:
            return known
        node = self.pipeline.plan.nodes.get(component_id) if isinstance(component_id, str) else None
        if isinstance(node, OperatorNode):
            return Component(component_id, "operator", component_id,
                             {port: StreamDeclaration(port, tuple(n for n, _ in schema) if schema else None, schema)
                              for port, schema in node.output_ports})
        if node is not None and node.kind not in ("sink", "table", "port"):
            fields = tuple(n for n, _ in node.schema) if node.schema is not None else None
            return Component(component_id, "source", component_id,
                             {DEFAULT_STREAM: StreamDeclaration(DEFAULT_STREAM, fields, node.schema)})
        names = ", ".join(self._components) or "none"
        raise PlanError(f"{what} ({where}): unknown component {component_id!r}; declared so far: {names} (declare a "
                        "component with set_spout or set_bolt before subscribing to it)")

    # -- streams out ----------------------------------------------------------------------------------
    def stream(self, component_id: str, stream: str = DEFAULT_STREAM, *, name: str | None = None) -> Stream:
        """A component's stream as a fluent stream (for steps and sinks); a bolt's stream needs
        types in its declaration."""
        from headrace.api.stream import Stream

        where = user_location()
        what = f"stream({component_id!r}, {stream!r})"
        component = self.component(component_id, where, what)
        declaration = self._declared(component, stream, where, what)
        plan = self.pipeline.plan
        if component.kind == "spout":
            view = self._views.get(component_id)
            if view is None:
                assert declaration.fields is not None
                source = Stream(self.pipeline, plan.nodes[component.node])
                view = source.select(*declaration.fields, name=name or f"{component_id}_tuples").node.name
                self._views[component_id] = view
            return Stream(self.pipeline, plan.nodes[view])
        if component.kind == "source":
            return Stream(self.pipeline, plan.nodes[component.node])
        if declaration.direct:
            raise PlanError(f"{what} ({where}): stream {stream!r} of {component_id!r} is direct (its emitter names "
                            "the task of each tuple); read it through a bolt with direct_grouping")
        if component.kind == "bolt" and declaration.schema is None:
            raise PlanError(f"{what} ({where}): stream {stream!r} of bolt {component_id!r} declares fields "
                            f"({declaration.describe_fields()}) without types; declare them with types, e.g. "
                            "declare_output_fields = 'word string, count long', to use it in steps and sinks")
        return OutputPortRef(self.pipeline, component.node, stream).stream(name)

    def port(self, component_id: str, stream: str = DEFAULT_STREAM) -> OutputPortRef:
        """A bolt's (or operator's) stream as an output port, to connect to an Apex operator with
        ``pipeline.add_stream``; its records are ``hr.Tuple``s (``record["word"]`` works)."""
        where = user_location()
        what = f"port({component_id!r}, {stream!r})"
        component = self.component(component_id, where, what)
        self._declared(component, stream, where, what)
        if component.kind not in ("bolt", "operator"):
            raise PlanError(f"{what} ({where}): {component_id!r} is a {component.kind}, not a bolt; connect its "
                            f"stream (builder.stream({component_id!r})) to the operator")
        return OutputPortRef(self.pipeline, component.node, stream)

    def _declared(self, component: Component, stream: Any, where: str, what: str) -> StreamDeclaration:
        declaration = component.streams.get(stream) if isinstance(stream, str) else None
        if declaration is None:
            raise PlanError(f"{what} ({where}): {component.id!r} has no stream {stream!r}; its streams: "
                            f"{', '.join(component.streams) or 'none'}")
        return declaration

    def create_topology(self) -> Pipeline:
        """The pipeline, validated (Storm's createTopology)."""
        return self.pipeline.validate()

    def __repr__(self) -> str:
        return f"TopologyBuilder({self.pipeline.name!r}, components: {', '.join(self._components) or 'none'})"


class BoltDeclarer:
    """Subscribes a bolt to streams (Storm's InputDeclarer); every method returns the declarer."""

    def __init__(self, builder: TopologyBuilder, bolt: str) -> None:
        self._builder, self.bolt = builder, bolt

    def _subscribe(self, method: str, component_id: str, stream: str, grouping: Grouping) -> BoltDeclarer:
        builder = self._builder
        where = user_location()
        what = f"bolt {self.bolt!r}: {method}({component_id!r}, stream={stream!r})"
        if component_id == self.bolt:
            raise PlanError(f"{what} ({where}): a bolt cannot subscribe to its own stream (a topology is acyclic)")
        component = builder.component(component_id, where, what)
        declaration = builder._declared(component, stream, where, what)
        if isinstance(grouping, Direct) and not declaration.direct:
            raise PlanError(f"{what} ({where}): stream {stream!r} of {component_id!r} is not declared direct; a direct "
                            "grouping needs a stream its bolt declares with direct=True and emits with emit_direct")
        if declaration.direct and not isinstance(grouping, Direct):
            raise PlanError(f"{what} ({where}): stream {stream!r} of {component_id!r} is declared direct; subscribe "
                            "to it with direct_grouping")
        wanted = getattr(grouping, "fields", ())
        if wanted and declaration.fields is not None:
            unknown = [f for f in wanted if f not in declaration.fields]
            if unknown:
                raise PlanError(f"{what} ({where}): stream {stream!r} of {component_id!r} has no field(s) "
                                f"{', '.join(unknown)}; its fields: {declaration.describe_fields()}")
        port = f"{component_id}.{stream}"
        node = builder.pipeline.plan.nodes[self.bolt]
        assert isinstance(node, OperatorNode)
        if any(edge.target_port == port for edge in node.edges):
            raise PlanError(f"{what} ({where}): bolt {self.bolt!r} already subscribes to stream {stream!r} of "
                            f"{component_id!r}; a bolt takes each stream once")
        if component.kind in ("bolt", "operator"):
            source: Any = OutputPortRef(builder.pipeline, component.node, stream)
        else:
            source = builder.pipeline.plan.nodes[component.node]
        add_stream(builder.pipeline, f"{component_id}.{stream}->{self.bolt}", source,
                   InputPortRef(builder.pipeline, self.bolt, port), grouping=grouping)
        return self

    @staticmethod
    def _fields(fields: Any, method: str) -> tuple[str, ...]:
        names = (fields,) if isinstance(fields, str) else tuple(fields) if isinstance(fields, (list, tuple)) else ()
        if not names or not all(isinstance(f, str) and f for f in names):
            raise PlanError(f"{method} ({user_location()}): fields must be a field name or a list of them, e.g. "
                            f"['word'], got {fields!r}")
        return names

    def shuffle_grouping(self, component_id: str, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """Round robin over the bolt's tasks."""
        return self._subscribe("shuffle_grouping", component_id, stream, Shuffle())

    def none_grouping(self, component_id: str, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """Storm's "don't care": a shuffle grouping."""
        return self._subscribe("none_grouping", component_id, stream, Shuffle())

    def fields_grouping(self, component_id: str, fields: str | list[str], stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """Tuples with the same values of ``fields`` go to the same task (a stable hash, in every run)."""
        return self._subscribe("fields_grouping", component_id, stream,
                               Fields(*self._fields(fields, "fields_grouping")))

    def partial_key_grouping(self, component_id: str, fields: str | list[str],
                             stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """Of the two tasks two hashes of ``fields`` pick, the one that got fewer tuples so far."""
        return self._subscribe("partial_key_grouping", component_id, stream,
                               PartialKey(*self._fields(fields, "partial_key_grouping")))

    def all_grouping(self, component_id: str, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """A copy of every tuple to every task."""
        return self._subscribe("all_grouping", component_id, stream, All())

    def global_grouping(self, component_id: str, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """Every tuple to task 0."""
        return self._subscribe("global_grouping", component_id, stream, Global())

    def direct_grouping(self, component_id: str, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """The emitter names the task (``emit_direct``); the stream must be declared direct."""
        return self._subscribe("direct_grouping", component_id, stream, Direct())

    def local_or_shuffle_grouping(self, component_id: str, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """The task with the emitter's own index when there is one, else round robin."""
        return self._subscribe("local_or_shuffle_grouping", component_id, stream, LocalOrShuffle())

    def custom_grouping(self, component_id: str, grouping: Any, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """``grouping(tuple, tasks)`` returns the task index (or a list of them) for each tuple."""
        if isinstance(grouping, Grouping):
            return self._subscribe("custom_grouping", component_id, stream, grouping)
        if not callable(grouping):
            raise PlanError(f"custom_grouping ({user_location()}): expected a function (tuple, tasks) -> task index, "
                            f"or an hr.groupings grouping, got {grouping!r}")
        return self._subscribe("custom_grouping", component_id, stream, TupleCustom(grouping, component_id, stream))

    def grouping(self, component_id: str, grouping: Grouping, stream: str = DEFAULT_STREAM) -> BoltDeclarer:
        """Subscribe with any ``hr.groupings`` grouping."""
        if not isinstance(grouping, Grouping):
            raise PlanError(f"grouping ({user_location()}): expected an hr.groupings grouping (Fields('word'), "
                            f"Shuffle(), ...), got {grouping!r}")
        return self._subscribe("grouping", component_id, stream, grouping)

    def __repr__(self) -> str:
        return f"<BoltDeclarer {self.bolt!r}>"



class JoinBoltDeclarer(BoltDeclarer):
    """A JoinBolt's subscriptions: to the streams it joins, whatever the grouping (Spark's join
    brings each key's tuples together itself)."""

    def __init__(self, builder: TopologyBuilder, bolt: str, inputs: tuple[str, ...]) -> None:
        super().__init__(builder, bolt)
        self.inputs = inputs

    def _subscribe(self, method: str, component_id: str, stream: str, grouping: Grouping) -> BoltDeclarer:
        if component_id not in self.inputs or stream != DEFAULT_STREAM:
            raise PlanError(f"bolt {self.bolt!r}: {method}({component_id!r}, stream={stream!r}) ({user_location()}): "
                            f"a JoinBolt reads the default streams of the components it joins: "
                            f"{', '.join(self.inputs)}")
        return self
