"""Pipeline files: a pipeline described in YAML, built with the fluent API.

``load_pipeline_file("pipeline.yaml")`` reads the file and makes the same calls a Python
program would (``hr.Pipeline``, ``p.source``, ``stream.filter``, ``stream.sink``, ...), so a
file builds exactly the plan of its fluent twin; nothing here makes plan nodes. Every error
names the file's line: ``pipeline.yaml:14: step 'big': ...``. The format is in
docs/pipeline-files.md; the step kinds are in ``headrace/api/file_steps.py``, one entry each.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "pipeline.yaml")
>>> _ = open(path, "w").write('''
... pipeline: doc_file
... sources:
...   lines: {type: Generator, kind: words, limit: 100}
... steps:
...   - name: long_lines
...     from: lines
...     filter: length(line) > 20
... sinks:
...   out: {type: Null, from: long_lines}
... ''')
>>> [node.name for node in load_pipeline_file(path).plan.nodes.values()]
['lines', 'long_lines', 'out']
"""

from __future__ import annotations

import inspect
import os
import re
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from headrace.api.connector_types import ConnectorTypes
from headrace.api.file_steps import STEP_KINDS
from headrace.api.located_yaml import Located, closest, parse_yaml
from headrace.api.selectors import MULTIPLEXING, REPLICATING, Multiplexing
from headrace.api.step_context import StepContext, Unbuilt, check_keys
from headrace.api.stream import Pipeline, Stream, Table
from headrace.code_locations import declared_at
from headrace.connectors.failover import Failover
from headrace.errors import PipelineFileError, PipelineFileErrors, PlanError

TOP_KEYS = ("pipeline", "guarantee", "trigger", "batch_duration", "sources", "tables", "steps", "sinks",
            "sink_groups")
PIPELINE_OPTIONS = ("guarantee", "trigger", "batch_duration")
SOURCE_KEYS = ("type", "event_time", "max_out_of_orderness", "selector")
SINK_KEYS = ("type", "from")
TABLE_KEYS = ("rows", "schema", "path", "format")
STEP_KEYS = ("name", "from", "selector")
GROUP_KINDS = ("failover",)
SOURCE_TYPES = ConnectorTypes("headrace.sources", "headrace.connectors.base:SourceConnector")
SINK_TYPES = ConnectorTypes("headrace.sinks", "headrace.connectors.base:SinkConnector", exclude=("Failover",))
_FLUENT_SUBJECT = re.compile(r"(step|source|sink|table) '(.*)'", re.S)


def load_pipeline_file(path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None) -> Pipeline:
    """The pipeline a YAML file describes, built and validated (no Spark). ``${NAME}`` and
    ``${NAME:-default}`` in the file read ``environ`` (default: the process environment).
    Raises :class:`~headrace.errors.PipelineFileError` naming the file's line."""
    path = os.fspath(path)
    label = os.path.basename(path)
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise PipelineFileError(label, 0, "", f"cannot read the file: {exc.strerror or exc}") from None
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:  # the file's own modules: `my_steps:parse` next to pipeline.yaml
        sys.path.insert(0, folder)
    document = parse_yaml(text, label, os.environ if environ is None else environ)
    return _FileBuilder(document, label).build()


def plan_summary(pipeline: Pipeline) -> dict[str, Any]:
    """What ``headrace validate`` reports: the pipeline, its counts of sources, steps and sinks,
    and its guarantee."""
    nodes = list(pipeline.plan.nodes.values())
    guarantee, _ = pipeline.plan.guarantee()
    sources = sum(node.kind == "source" for node in nodes)
    sinks = sum(node.kind == "sink" for node in nodes)
    tables = sum(node.kind == "table" for node in nodes)
    return {"pipeline": pipeline.name, "sources": sources, "steps": len(nodes) - sources - sinks - tables,
            "sinks": sinks, "tables": tables, "guarantee": guarantee.value}


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is when a sink prints (a Console sink's ``out: stderr``)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


class _FileBuilder:
    """Reads the declarations, then adds each to a fluent Pipeline, inputs first."""

    def __init__(self, document: Located, label: str) -> None:
        self.doc, self.label = document, label
        self.kind_of: dict[str, str] = {}  # name -> source, table, step, sink or sink group
        self.decl: dict[str, Located] = {}
        self.sources: dict[str, Located] = {}
        self.tables: dict[str, Located] = {}
        self.steps: dict[str, Located] = {}
        self.sinks: dict[str, Located] = {}
        self.groups: dict[str, Located] = {}
        self.readers: dict[str, list[str]] = {}  # stream name -> the names of what reads it
        self.streams: dict[str, Stream] = {}
        self.built_tables: dict[str, Table] = {}
        self.selectors: dict[str, Multiplexing] = {}
        self.routes: dict[tuple[str, str], Stream] = {}
        self.building: list[str] = []
        self.unread: list[str] = []  # sources and steps nothing reads
        self.pipeline: Pipeline = None  # type: ignore[assignment]  # set first thing in build()
        self.errors: list[PipelineFileError] = []  # found so far; build() reports them all
        self.failed: set[str] = set()  # sources, tables and steps that could not be built
        self.undeclared = False  # whether some declaration was refused (its name may be unknown)

    # -- errors ---------------------------------------------------------------------------------
    def fail(self, where: Located | int, subject: str, message: str) -> PipelineFileError:
        line = where if isinstance(where, int) else where.line
        return PipelineFileError(self.label, line, subject, message)

    @contextmanager
    def at(self, line: int, subject: str) -> Iterator[None]:
        """Build inside: the fluent API records ``file:line`` as where the steps are defined, and a
        PlanError it raises comes out as a PipelineFileError naming that line."""
        try:
            with declared_at(f"{self.label}:{line}"):
                yield
        except PipelineFileError:
            raise
        except PlanError as exc:
            raise self.relocate(exc, line, subject) from None

    def relocate(self, exc: PlanError, line: int, subject: str) -> PipelineFileError:
        """``step 'x' (pipeline.yaml:12): msg`` as ``pipeline.yaml:12: step 'x': msg``; a message
        without this file's line keeps ``line``."""
        text = str(exc)
        match = re.match(rf"^(?P<head>[^:]*?) \({re.escape(self.label)}:(?P<line>\d+)\): (?P<rest>.*)$", text, re.S)
        if match is None:
            return self.fail(line, subject, text)
        head, rest = match.group("head"), match.group("rest")
        named = _FLUENT_SUBJECT.fullmatch(head)
        if named and named.group(2) in self.kind_of:  # the fluent API names a step of the file
            return self.fail(int(match.group("line")), f"{self.kind_of[named.group(2)]} '{named.group(2)}'", rest)
        if named:  # a step the fluent API made for one of the file's (e.g. a source's event time)
            return self.fail(int(match.group("line")), subject, rest)
        return self.fail(int(match.group("line")), subject, f"{head}: {rest}")

    @contextmanager
    def collecting(self, name: str = "") -> Iterator[None]:
        """Build one declaration; an error in it is kept, and the build goes on with the next one,
        so that ``headrace validate`` reports every error at once. What it reads could not be
        built (an error already kept) skips it: no second error for the same cause."""
        try:
            yield
        except PipelineFileError as exc:
            self.errors.append(exc)
            self.failed.update([*self.building, name] if name else self.building)
        except Unbuilt:
            self.failed.update([*self.building, name] if name else self.building)
        finally:
            self.building.clear()

    # -- the file ---------------------------------------------------------------------------------
    def build(self) -> Pipeline:
        doc = self.doc
        if not doc.is_map:
            raise self.fail(doc, "", f"a pipeline file is a mapping that starts with `pipeline: NAME`, got "
                                     f"{doc.describe()}")
        check_keys(self, doc, TOP_KEYS, "", "the file")
        self._pipeline()
        self._declarations()
        self.undeclared = bool(self.errors)
        for name in self.sources:
            with self.collecting(name):
                self.stream_of(name, self.sources[name].line)
        for name, spec in self.tables.items():
            with self.collecting(name):
                self._table(name, spec)
        for name in self.steps:
            with self.collecting(name):
                self.stream_of(name, self.steps[name].line)
        grouped: dict[str, str] | None = None  # None: a sink group is wrong, its members unknown
        with self.collecting():
            grouped = self._group_members()
        for name, spec in self.sinks.items() if grouped is not None else ():
            if name not in grouped:
                with self.collecting():
                    self._sink(name, spec)
        for name, spec in self.groups.items() if grouped is not None else ():
            with self.collecting():
                self._sink_group(name, spec)
        for name in self.unread if not self.errors else ():  # else: often a `from:` with an error in it
            self.errors.append(self.fail(self.decl[name], f"{self.kind_of[name]} '{name}'",
                                         "nothing reads it: name it in the `from:` of a step or sink, or remove it"))
        if not self.errors:  # the whole plan's checks need every part of it
            guarantee = doc.line_of("guarantee") if "guarantee" in doc else doc.line_of("pipeline")
            try:
                self.pipeline.validate()
            except PlanError as exc:
                raise self.relocate(exc, guarantee, "") from None
        if len(self.errors) == 1:
            raise self.errors[0]
        if self.errors:
            raise PipelineFileErrors(sorted(self.errors, key=lambda e: e.line))
        return self.pipeline

    def _pipeline(self) -> None:
        name_node = self.doc.get("pipeline")
        if name_node is None:
            raise self.fail(1, "", "a pipeline file starts with `pipeline: NAME` (the pipeline's name)")
        name = name_node.text
        if not name:
            raise self.fail(name_node, "", f"the pipeline's name must be text, got {name_node.describe()}")
        with self.at(name_node.line, ""):
            Pipeline(name)
        options = {key: self.doc[key].value for key in PIPELINE_OPTIONS if key in self.doc}
        for key, value in options.items():  # each on its own first, to name its line
            with self.at(self.doc.line_of(key), ""):
                Pipeline(name, **{key: value})
        with self.at(name_node.line, ""):
            self.pipeline = Pipeline(name, **options)

    def _declarations(self) -> None:
        doc = self.doc
        for section, into in (("sources", self.sources), ("tables", self.tables), ("sinks", self.sinks),
                              ("sink_groups", self.groups)):
            node = doc.get(section)
            if node is None:
                continue
            if not node.is_map:
                raise self.fail(node, "", f"{section}: is a mapping of names to their settings, got {node.describe()}")
            kind = {"sources": "source", "tables": "table", "sinks": "sink", "sink_groups": "sink group"}[section]
            for name, spec in node.items():
                with self.collecting():
                    if not spec.is_map:
                        if name not in self.kind_of:  # known, so what reads it is skipped, not refused again
                            self.kind_of[name] = kind
                            self.failed.add(name)
                        raise self.fail(node.line_of(name), f"{kind} '{name}'", "expected its settings as a mapping "
                                                                                f"(type: ..., ...), got "
                                                                                f"{spec.describe()}")
                    spec.line = node.line_of(name)
                    self._declare(name, kind, spec)
                    into[name] = spec
        steps = doc.get("steps")
        if steps is not None:
            if not steps.is_list:
                raise self.fail(steps, "", "steps: is a list of steps, each `- name: ...`")
            for item in steps.value:
                with self.collecting():
                    if not item.is_map or "name" not in item:
                        raise self.fail(item, "", "each step is a mapping that starts with `name:`")
                    name = item["name"].text
                    if not name:
                        raise self.fail(item["name"], "", f"a step's name must be text, got "
                                                          f"{item['name'].describe()}")
                    self._declare(name, "step", item)
                    self.steps[name] = item
        dead_letters_of: set[str] = set()  # sources a dead_letters step names (it reads them, not their stream)
        for name, spec in self.steps.items():
            for ref in _references(spec):
                self.readers.setdefault(str(ref.text), []).append(name)
            listed = spec.get("dead_letters")
            if listed is not None and listed.is_list:
                dead_letters_of.update(str(item.text) for item in listed.value)
        for name, spec in (*self.sinks.items(), *self.groups.items()):
            if "from" in spec:
                self.readers.setdefault(str(spec["from"].text), []).append(name)
        self.unread = [name for name in (*self.sources, *self.steps)
                       if name not in self.readers and name not in dead_letters_of]

    def _declare(self, name: str, kind: str, spec: Located) -> None:
        if name in self.kind_of:
            first = self.decl[name]
            self.failed.add(name)  # which of the two a `from:` means is unknown: what reads it is skipped
            raise self.fail(spec, f"{kind} '{name}'", f"the name is already used by the {self.kind_of[name]} at line "
                                                      f"{first.line}; every source, table, step and sink needs a "
                                                      "name of its own")
        self.kind_of[name], self.decl[name] = kind, spec

    # -- streams ------------------------------------------------------------------------------------
    def stream_of(self, name: str, line: int) -> Stream:
        """The stream of a source or step, built (with what it reads) when first asked for."""
        if name in self.streams:
            return self.streams[name]
        if name in self.failed:
            raise Unbuilt(name)
        if name in self.building:
            cycle = " -> ".join([*self.building[self.building.index(name):], name])
            raise self.fail(line, f"step '{name}'", f"the steps read from each other in a cycle: {cycle}")
        self.building.append(name)
        if self.kind_of[name] == "source":
            self._source(name, self.sources[name])
        else:
            self._step(name, self.steps[name])
        self.building.pop()
        spec = self.decl[name]
        if "selector" in spec:
            selector = self._selector(name, spec["selector"])
            if selector is not None:
                self.selectors[name] = selector
        return self.streams[name]

    def input_for(self, ref: Located, reader: str) -> Stream:
        """The stream ``reader`` gets from the source or step ``ref`` names: all of it, or the
        records its multiplexing selector routes to ``reader``."""
        name = ref.text
        subject = f"{self.kind_of[reader]} '{reader}'"
        if name in self.failed or (name not in self.kind_of and self.undeclared):
            raise Unbuilt(str(name))  # (a name no declaration has may be one whose declaration is wrong)
        if not name or self.kind_of.get(name) not in ("source", "step"):
            streams = [n for n, kind in self.kind_of.items() if kind in ("source", "step")]
            what = f"the {self.kind_of[name]} {name!r}" if name in self.kind_of else ref.describe()
            raise self.fail(ref, subject, f"from: {what} is not a source or step"
                                          f"{closest(str(name), streams)}; the sources and steps are "
                                          f"{', '.join(streams) or 'none'}")
        stream = self.stream_of(name, ref.line)
        selector = self.selectors.get(name)
        if selector is None:
            return stream
        if (name, reader) not in self.routes:
            with self.at(selector.line, f"{self.kind_of[name]} '{name}'"):
                route = stream.filter(selector.condition(reader), name=selector.route_name(name, reader))
            self.routes[(name, reader)] = route
        return self.routes[(name, reader)]

    def _selector(self, owner: str, spec: Located) -> Multiplexing | None:
        subject = f"{self.kind_of[owner]} '{owner}'"
        if spec.is_scalar and spec.value == REPLICATING:
            return None
        if not spec.is_map or MULTIPLEXING not in spec:
            raise self.fail(spec, subject, "selector is `replicating` or a mapping with multiplexing: FIELD, "
                                           "mapping: {VALUE: [reader, ...]} and default: [reader, ...]; got "
                                           f"{spec.describe()}")
        check_keys(self, spec, (MULTIPLEXING, "mapping", "default"), subject, "a selector")
        field = spec[MULTIPLEXING].text
        schema = dict(self.streams[owner].node.schema or ())
        if not field or (schema and field not in schema):
            raise self.fail(spec[MULTIPLEXING], subject, f"the selector routes by {spec[MULTIPLEXING].describe()}, "
                                                         f"which is not a field of {owner!r}"
                                                         f"{closest(str(field), schema)}; its fields are "
                                                         f"{', '.join(schema)}")
        field_type = schema.get(field)
        readers = self.readers.get(owner, [])
        routes: dict[str, list[object]] = {}
        mapping = spec.get("mapping")
        if mapping is None or not mapping.is_map or not mapping.value:
            raise self.fail(mapping or spec, subject, "a multiplexing selector needs mapping: {VALUE: [reader, ...]}")
        for key, targets in mapping.items():
            value = key if field_type == "string" else mapping.typed_keys[key]
            for target in self._readers_named(targets, owner, readers, subject):
                routes.setdefault(target, []).append(value)
        default = tuple(self._readers_named(spec["default"], owner, readers, subject)) if "default" in spec else ()
        selector = Multiplexing(str(field), {r: tuple(v) for r, v in routes.items()}, default, spec.line)
        unrouted = [r for r in readers if r not in selector.consumers()]
        if unrouted:
            named = ", ".join(map(repr, unrouted))
            raise self.fail(spec, subject, f"the multiplexing selector sends nothing to {named}, which read"
                                           f"{'s' if len(unrouted) == 1 else ''} from {owner!r}: map a value to "
                                           f"{'it' if len(unrouted) == 1 else 'them'} or list "
                                           f"{'it' if len(unrouted) == 1 else 'them'} under default")
        return selector

    def _readers_named(self, targets: Located, owner: str, readers: list[str], subject: str) -> list[str]:
        names = targets.value if targets.is_list else [targets]
        found = []
        for target in names:
            if target.text not in readers:
                raise self.fail(target, subject, f"the selector names {target.describe()}, which does not read from "
                                                 f"{owner!r}{closest(str(target.text), readers)}; what reads from "
                                                 f"it: {', '.join(readers)}")
            found.append(str(target.text))
        return found

    # -- declarations -----------------------------------------------------------------------------------
    def _source(self, name: str, spec: Located) -> None:
        subject = f"source '{name}'"
        connector = self.connector(name, spec, subject, SOURCE_TYPES, SOURCE_KEYS, "source")
        with self.at(spec.line, subject):
            stream = self.pipeline.source(name, connector)
        event_time = spec.get("event_time")
        if "max_out_of_orderness" in spec and event_time is None:
            raise self.fail(spec.line_of("max_out_of_orderness"), subject, "max_out_of_orderness goes with event_time: "
                                                                           "FIELD")
        if event_time is not None:
            delay = spec.get("max_out_of_orderness")
            with self.at(event_time.line, subject):
                stream = stream.with_event_time(str(event_time.text), delay.value if delay else 0,
                                                name=f"{name}_event_time")
        self.streams[name] = stream

    def _table(self, name: str, spec: Located) -> None:
        subject = f"table '{name}'"
        check_keys(self, spec, TABLE_KEYS, subject, "a table")
        values = {key: spec[key].plain() for key in TABLE_KEYS if key in spec}
        with self.at(spec.line, subject):
            self.built_tables[name] = self.pipeline.table(name, values.pop("rows", None), **values)

    def _step(self, name: str, spec: Located) -> None:
        subject = f"step '{name}'"
        actions = [key for key in spec.keys() if key in STEP_KINDS]
        if not actions:
            others = [key for key in spec.keys() if key not in STEP_KEYS]
            hint = closest(others[0], STEP_KINDS) if others else ""
            raise self.fail(spec, subject, f"the step does nothing{hint}: give it one action, "
                                           f"{', '.join(STEP_KINDS)}")
        if len(actions) > 1:
            raise self.fail(spec.line_of(actions[1]), subject, f"the step has two actions, {actions[0]} and "
                                                               f"{actions[1]}; a step does one thing: split it in two")
        kind = STEP_KINDS[actions[0]]
        check_keys(self, spec, (*STEP_KEYS, kind.key, *kind.options), subject, f"a {kind.key} step")
        if kind.reads_from and "from" not in spec:
            raise self.fail(spec, subject, "the step needs from: the source or step it reads")
        if not kind.reads_from and "from" in spec:
            raise self.fail(spec.line_of("from"), subject, f"a {kind.key} step reads what its value names; remove "
                                                           "from:")
        line = spec.line_of(kind.key)
        context = StepContext(self, name, spec, kind)
        with self.at(line, subject):
            self.streams[name] = kind.build(context)

    def _group_members(self) -> dict[str, str]:
        """Member sink -> its group, after checking each group's members."""
        members: dict[str, str] = {}
        for group, spec in self.groups.items():
            subject = f"sink group '{group}'"
            check_keys(self, spec, ("from", *GROUP_KINDS), subject, "a sink group")
            if "failover" not in spec:
                raise self.fail(spec, subject, "give the group's members in order: failover: [primary, backup, ...]")
            listed = spec["failover"]
            if not listed.is_list or len(listed.value) < 2:
                raise self.fail(listed, subject, "failover: lists the member sinks in order, a primary and at least "
                                                 "one backup: [primary, backup]")
            for item in listed.value:
                member = item.text
                if not member or member not in self.sinks:
                    raise self.fail(item, subject, f"{item.describe()} is not a sink under sinks:"
                                                   f"{closest(str(member), self.sinks)}; the sinks are "
                                                   f"{', '.join(self.sinks) or 'none'}")
                if member in members:
                    raise self.fail(item, subject, f"sink {member!r} is already a member of sink group "
                                                   f"{members[member]!r}; a sink belongs to one group")
                if "from" in self.sinks[member]:
                    raise self.fail(self.sinks[member].line_of("from"), f"sink '{member}'",
                                    f"the sink is a member of sink group {group!r} (line {spec.line}), which reads "
                                    "the stream: remove from: here")
                members[member] = group
            if "from" not in spec:
                raise self.fail(spec, subject, "the group needs from: the source or step its members write")
        return members

    def _sink(self, name: str, spec: Located) -> None:
        subject = f"sink '{name}'"
        connector = self.connector(name, spec, subject, SINK_TYPES, SINK_KEYS, "sink")
        if "from" not in spec:
            raise self.fail(spec, subject, "the sink needs from: the source or step it writes (or list it in a "
                                           "sink group's failover:)")
        stream = self.input_for(spec["from"], name)
        with self.at(spec.line, subject):
            stream.sink(name, connector)

    def _sink_group(self, name: str, spec: Located) -> None:
        subject = f"sink group '{name}'"
        members = [str(item.text) for item in spec["failover"].value]
        connectors = [self.connector(member, self.sinks[member], f"sink '{member}'", SINK_TYPES, SINK_KEYS, "sink")
                      for member in members]
        stream = self.input_for(spec["from"], name)
        with self.at(spec.line, subject):
            stream.sink(name, Failover(*connectors, names=members))

    def connector(self, name: str, spec: Located, subject: str, types: ConnectorTypes, reserved: tuple[str, ...],
                  kind: str) -> Any:
        """The connector ``type:`` names, made with the other keys as its arguments."""
        type_node = spec.get("type")
        if type_node is None:
            raise self.fail(spec, subject, f"give the {kind}'s type: one of {', '.join(types.names)}")
        type_name = type_node.text
        if type_name == "Failover" and kind == "sink":
            raise self.fail(type_node, subject, "a failover group is declared under sink_groups: {name: {from: step, "
                                                "failover: [primary, backup]}}")
        if type_name not in types:
            raise self.fail(type_node, subject, f"unknown {kind} type {type_name!r}"
                                                f"{closest(str(type_name), types.names)}; the {kind} types are "
                                                f"{', '.join(types.names)}")
        make = types.get(str(type_name))
        params = {p.name: p for p in inspect.signature(make).parameters.values()
                  if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        arguments: dict[str, Any] = {}
        for key, value in spec.items():
            if key in reserved:
                continue
            if key not in params:
                known = sorted({*params, *reserved})
                raise self.fail(spec.line_of(key), subject, f"{type_name} has no option {key!r}"
                                                            f"{closest(key, known)}; its options are "
                                                            f"{', '.join(known)}")
            arguments[key] = _argument(params[key], value)
        missing = [p for p in params if params[p].default is inspect.Parameter.empty and p not in arguments]
        if missing:
            raise self.fail(spec, subject, f"{type_name} needs {', '.join(missing)}")
        with self.at(spec.line, subject):
            try:
                return make(**arguments)
            except PlanError:
                raise
            except Exception as exc:  # noqa: BLE001 - a connector refusing an argument
                raise self.fail(spec, subject, f"{type_name}: {type(exc).__name__}: {exc}") from None


def _references(spec: Located) -> list[Located]:
    """The streams a step names: its ``from:``, a union's others and a join's other (a stream
    or a table: a table read by nothing else is refused as a table, so either counts)."""
    found = [spec["from"]] if "from" in spec else []
    union = spec.get("union")
    if union is not None:
        found += union.value if union.is_list else [union]
    if "join" in spec:
        found.append(spec["join"])
    return found


def _argument(param: inspect.Parameter, value: Located) -> Any:
    """A connector argument from its YAML value; an output stream given as ``stdout``/``stderr``."""
    plain = value.plain()
    if "IO[" in str(param.annotation) and plain in ("stdout", "stderr"):
        return None if plain == "stdout" else _CurrentStderr()
    return plain
