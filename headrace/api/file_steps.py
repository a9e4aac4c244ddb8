"""The step kinds of a pipeline file, one registry entry each.

A step is a mapping with ``name``, ``from`` (the source or step it reads), an optional
``selector`` and exactly one *action* key, which picks its kind here; the kind names the other
keys it takes (its options) and builds the step with the fluent API (``headrace/api/stream.py``),
never a plan node of its own. Adding a kind is one decorated function::

    @step_kind("sql", reads_from=False)
    def _sql(step: StepContext) -> Any:
        return step.pipeline.sql(step.text(step.action), name=step.name)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from headrace import aggregates
from headrace.api.located_yaml import Located, closest
from headrace.api.step_context import IDENTIFIER, StepContext, StepKind
from headrace.api.stream import JoinResult, WindowResult
from headrace.triggers import AfterDelay, AfterWatermark, CountTrigger, EveryN
from headrace.windows import Count, Global, Session, Sliding, Tumbling

STEP_KINDS: dict[str, StepKind] = {}


def step_kind(key: str, *, options: tuple[str, ...] = (), reads_from: bool = True
              ) -> Callable[[Callable[[StepContext], Any]], Callable[[StepContext], Any]]:
    """Register the function below as the builder of the steps whose action key is ``key``;
    the first line of its docstring says what the kind does (``StepKind.summary``)."""
    def register(build: Callable[[StepContext], Any]) -> Callable[[StepContext], Any]:
        summary = (build.__doc__ or "").strip().splitlines()[0] if build.__doc__ else ""
        STEP_KINDS[key] = StepKind(key, build, options, reads_from, summary)
        return build
    return register


# -- stateless steps -------------------------------------------------------------------------------

@step_kind("filter")
def _filter(step: StepContext) -> Any:
    """Keep the records where a Spark SQL condition holds, or where {function: module:fn} returns true."""
    action = step.action
    if action.is_map:
        return step.input.filter(step.function_entry(action), name=step.name)
    return step.input.filter(step.expression(action), name=step.name)


@step_kind("select")
def _select(step: StepContext) -> Any:
    """Keep and compute columns: a list of column names and {new_name: SQL expression} entries."""
    columns = []
    for item in step.listed(step.action, "select"):
        if item.is_map and len(item.value) == 1:
            (out, value), = item.items()
            expression = step.expression(value)
            columns.append(expression if expression.output_name() == out else expression.alias(out))
        elif item.is_scalar and isinstance(item.value, str) and IDENTIFIER.fullmatch(item.value):
            columns.append(step.expression(item))
        else:
            raise step.fail(item, f"select takes column names and {{name: expression}} entries, got "
                                  f"{item.describe()}; name a computed column: {{doubled: \"amount * 2\"}}")
    return step.input.select(*columns, name=step.name)


@step_kind("with_columns")
def _with_columns(step: StepContext) -> Any:
    """Add or replace columns: {name: SQL expression, ...}."""
    columns = {out: step.expression(value) for out, value in step.mapping(step.action, "with_columns").items()}
    return step.input.with_columns(columns, name=step.name)


@step_kind("event_time", options=("max_out_of_orderness",))
def _event_time(step: StepContext) -> Any:
    """Declare the event-time field; the watermark trails it by max_out_of_orderness."""
    delay = step.option("max_out_of_orderness")
    return step.input.with_event_time(step.text(step.action), delay.value if delay else 0, name=step.name)


@step_kind("key_by")
def _key_by(step: StepContext) -> Any:
    """Partition by fields (a name or a list of names) or by {function: module:fn}."""
    action = step.action
    if action.is_map:
        return step.input.key_by(step.function_entry(action), name=step.name)
    fields = [step.text(item) for item in step.listed(action, "key_by")] if action.is_list else [step.text(action)]
    return step.input.key_by(*fields, name=step.name)


@step_kind("map", options=("schema",))
def _map(step: StepContext) -> Any:
    """A Python function module:fn applied to each record; schema gives its output fields."""
    return step.input.map(step.function(step.action), schema=step.plain_option("schema"), name=step.name)


@step_kind("flat_map", options=("schema",))
def _flat_map(step: StepContext) -> Any:
    """A Python function module:fn returning zero or more records for each record."""
    return step.input.flat_map(step.function(step.action), schema=step.plain_option("schema"), name=step.name)


@step_kind("map_batches", options=("schema", "format"))
def _map_batches(step: StepContext) -> Any:
    """A Python function module:fn over whole batches (format: arrow or pandas)."""
    return step.input.map_batches(step.function(step.action), format=step.plain_option("format") or "arrow",
                                  schema=step.plain_option("schema"), name=step.name)


@step_kind("join", options=("on", "how", "within", "in_window"))
def _join(step: StepContext) -> Any:
    """Join a table (under tables:) on the `on` fields, or a stream bounded in event time (within, in_window)."""
    on = step.required_option("on", "the fields to join on, e.g. on: user_id, or on: {auction: id}")
    fields: Any = step.text(on) if not (on.is_list or on.is_map) else (
        [step.text(item) for item in step.listed(on, "on")] if on.is_list
        else {left: step.text(right) for left, right in step.mapping(on, "on").items()})
    how = step.plain_option("how") or "inner"
    other = step.builder.kind_of.get(str(step.action.text))
    if other == "table":
        return step.input.join(step.table(step.action), fields, how=how, name=step.name)
    if other not in ("source", "step"):
        tables = [n for n, kind in step.builder.kind_of.items() if kind == "table"]
        streams = [n for n, kind in step.builder.kind_of.items() if kind in ("source", "step") and n != step.name]
        raise step.fail(step.action, f"join: {step.action.describe()} is neither a table under tables: nor a source "
                                     f"or step{closest(str(step.action.text), tables + streams)}; the tables are "
                                     f"{', '.join(tables) or 'none'}; the sources and steps are "
                                     f"{', '.join(streams) or 'none'}")
    # in_window, not window: that key is the window step's action
    within, window = step.option("within"), step.option("in_window")
    bound = tuple(item.value for item in step.listed(within, "within")) if within and within.is_list else (
        within.value if within else None)
    shape = None
    if window is not None:
        if window.is_map:
            step.check_keys(window, ("tumbling",), "in_window")
            with step.at(window["tumbling"]):
                shape = _window_shape(step, "tumbling", window["tumbling"])
        else:
            shape = Tumbling(window.value)
    return step.input.join(step.stream(step.action), fields, how=how, within=bound, window=shape, name=step.name)


@step_kind("union")
def _union(step: StepContext) -> Any:
    """All records of `from` and of the listed sources or steps (the same fields)."""
    others = [step.stream(item) for item in step.listed(step.action, "union")]
    return step.input.union(*others, name=step.name)


@step_kind("dead_letters", reads_from=False)
def _dead_letters(step: StepContext) -> Any:
    """The records the listed sources (or `all`) could not parse."""
    action = step.action
    if action.is_scalar and action.value in ("all", True):
        return step.pipeline.dead_letters(name=step.name)
    return step.pipeline.dead_letters(*(step.source(item) for item in step.listed(action, "dead_letters")),
                                      name=step.name)


# -- stateful steps: de-duplication, keyed and windowed steps ----------------------------------------

@step_kind("dedupe", options=("within", "keep"))
def _dedupe(step: StepContext) -> Any:
    """Drop the records whose fields (a name or a list of names) repeat an earlier record's (docs/dedupe.md)."""
    action = step.action
    keys = [step.text(item) for item in step.listed(action, "dedupe")] if action.is_list else step.text(action)
    within = step.option("within")
    return step.input.dedupe(keys, within=within.value if within else None, keep=step.plain_option("keep") or "first",
                             name=step.name)


@step_kind("aggregate", options=("ttl",))
def _aggregate(step: StepContext) -> Any:
    """Running aggregates per key ({name: count | sum(col) | min(col) | max(col) | mean(col)})."""
    keyed = step.keyed_input("aggregate")
    ttl = step.option("ttl")
    return keyed.aggregate(aggregates_of(step, step.action), name=step.name, ttl=ttl.value if ttl else None)


@step_kind("reduce", options=("ttl",))
def _reduce(step: StepContext) -> Any:
    """Fold each key's records with a Python function module:fn(accumulated, record)."""
    keyed = step.keyed_input("reduce")
    ttl = step.option("ttl")
    return keyed.reduce(step.function(step.action), name=step.name, ttl=ttl.value if ttl else None)


@step_kind("process", options=("schema", "arguments"))
def _process(step: StepContext) -> Any:
    """A hr.KeyedProcessFunction class module:Class (made with `arguments`) on each key's records."""
    keyed = step.keyed_input("process")
    found = step.imported(step.action)
    arguments = step.option("arguments")
    if isinstance(found, type):
        kwargs = step.mapping(arguments, "arguments") if arguments else {}
        try:
            function = found(**{k: v.plain() for k, v in kwargs.items()})
        except Exception as exc:  # noqa: BLE001 - the user's constructor: reported with its type
            raise step.fail(arguments or step.action, f"{step.text(step.action)}(...) raised "
                                                      f"{type(exc).__name__}: {exc}") from None
    elif arguments is not None:
        raise step.fail(arguments, f"{step.text(step.action)} is an instance already; arguments are for a class")
    else:
        function = found
    return keyed.process(function, schema=step.plain_option("schema"), name=step.name)


WINDOW_SHAPES: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "tumbling": (Tumbling, ("size", "offset")),
    "sliding": (Sliding, ("size", "slide", "offset")),
    "session": (Session, ("gap",)),
    "count": (Count, ("size", "slide")),
    "global": (Global, ()),
}
WINDOW_RESULTS = ("aggregate", "reduce", "process")
WINDOW_KEYS = (*WINDOW_SHAPES, "trigger", "allowed_lateness", "accumulation", *WINDOW_RESULTS, "schema", "emit")


@step_kind("window")
def _window(step: StepContext) -> Any:
    """Event-time (or count) windows per key, or over the whole stream, with aggregates or a function."""
    spec = step.action
    step.check_keys(spec, WINDOW_KEYS, "window")
    shape = _one_of(step, spec, tuple(WINDOW_SHAPES), "a window shape")
    result = _one_of(step, spec, WINDOW_RESULTS, "what the window computes")
    with step.at(spec[shape]):
        window = _window_shape(step, shape, spec[shape])
    trigger = _trigger(step, spec["trigger"]) if "trigger" in spec else None
    lateness, accumulation = spec.get("allowed_lateness"), spec.get("accumulation")
    for extra, allowed in (("emit", "aggregate"), ("schema", "process")):
        if extra in spec and result != allowed:
            raise step.fail(spec.line_of(extra), f"window {extra} goes with {allowed}, not with {result}")
    windowed = step.input.window(window, trigger=trigger, allowed_lateness=lateness.value if lateness else 0,
                                 accumulation=accumulation.value if accumulation else "accumulating", name=step.name)
    if result == "aggregate":
        emit = spec.get("emit")
        return windowed.aggregate(aggregates_of(step, spec["aggregate"]), emit=emit.value if emit else "final")
    if result == "reduce":
        return windowed.reduce(step.function(spec["reduce"]))
    return windowed.process(step.function(spec["process"]),
                            schema=spec["schema"].plain() if "schema" in spec else None)


@step_kind("late_records")
def _late_records(step: StepContext) -> Any:
    """The records a window step or a join of two streams (its `from`) dropped as too late:
    `late_records: true`."""
    if step.action.value is not True:
        raise step.fail(step.action, f"write late_records: true, got {step.action.describe()}")
    dropping = step.input
    if not isinstance(dropping, (WindowResult, JoinResult)):
        raise step.fail(step.spec.line_of("from"), f"late_records reads from a window step or a join of two "
                                                   f"streams; {step.spec['from'].value!r} is neither")
    return dropping.late_records(name=step.name)


# -- values --------------------------------------------------------------------------------------------

_AGGREGATE = re.compile(r"^\s*(?P<func>[A-Za-z_]\w*)\s*(?:\(\s*(?P<column>[^()]*?)\s*\))?\s*$")


def aggregates_of(step: StepContext, spec: Located) -> dict[str, aggregates.Agg]:
    """``{n: count, total: sum(amount)}`` as the fluent API's aggregates."""
    found = {}
    for out, value in step.mapping(spec, "aggregate").items():
        match = _AGGREGATE.match(value.value) if value.is_scalar and isinstance(value.value, str) else None
        func = match.group("func").lower() if match else ""
        if func not in aggregates.FUNCTIONS:
            raise step.fail(value, f"aggregate {out}: {value.describe()} is not an aggregate"
                                   f"{closest(func, aggregates.FUNCTIONS) if func else ''}; write count, sum(col), "
                                   "min(col), max(col) or mean(col)")
        assert match is not None
        column = match.group("column") or None
        if func == "count" and column not in (None, "*"):
            raise step.fail(value, f"aggregate {out}: count counts records and takes no column; write count")
        found[out] = aggregates.count() if func == "count" else getattr(aggregates, func)(column)
    return found


def _one_of(step: StepContext, spec: Located, choices: tuple[str, ...], what: str) -> str:
    given = [key for key in choices if key in spec]
    if not given:
        raise step.fail(spec, f"the window needs {what}: one of {', '.join(choices)}")
    if len(given) > 1:
        raise step.fail(spec.line_of(given[1]), f"the window has {given[0]} and {given[1]}; give one")
    return given[0]


def _window_shape(step: StepContext, kind: str, spec: Located) -> Any:
    make, params = WINDOW_SHAPES[kind]
    if kind == "global":
        if not (spec.value in (None, True) or (spec.is_map and not spec.value)):
            raise step.fail(spec, f"write global: true, got {spec.describe()}")
        return make()
    if spec.is_map:
        step.check_keys(spec, params, kind)
        return make(**{key: value.value for key, value in spec.items()})
    if kind == "sliding":
        raise step.fail(spec, "a sliding window needs a size and a slide: sliding: {size: 10s, slide: 5s}")
    return make(spec.value)


def _trigger(step: StepContext, spec: Located) -> Any:
    """``{count: n}``, or ``{early_every: n | early_after: duration, on_time_empty: skip | fire}``."""
    step.check_keys(spec, ("count", "early_every", "early_after", "on_time_empty"), "trigger")
    with step.at(spec):
        if "count" in spec:
            others = [key for key in spec.keys() if key != "count"]
            if others:
                raise step.fail(spec.line_of(others[0]), f"a count trigger fires every n records; it takes no "
                                                         f"{others[0]}")
            return CountTrigger(spec["count"].value)
        if "early_every" in spec and "early_after" in spec:
            raise step.fail(spec.line_of("early_after"), "give early_every or early_after, not both")
        early: Any = None
        if "early_every" in spec:
            early = EveryN(spec["early_every"].value)
        elif "early_after" in spec:
            early = AfterDelay(spec["early_after"].value)
        on_time_empty = spec.get("on_time_empty")
        return AfterWatermark(early=early, on_time_empty=on_time_empty.value if on_time_empty else "skip")


# -- SQL and operators -----------------------------------------------------------------------------

@step_kind("sql", reads_from=False)
def _sql(step: StepContext) -> Any:
    """A Spark SQL query over the pipeline's streams and tables, named by their step names (docs/sql.md)."""
    from headrace.plan.sql_query import parse, references

    query = step.text(step.action)
    with step.at(step.action):
        named = [ref.name for ref in references(parse(query, step.name, f"line {step.action.line}"))]
    builder = step.builder
    for name in named:  # build what the query reads first; reading it counts as a `from:`
        if builder.kind_of.get(name) in ("source", "step"):
            builder.input_for(Located(name, step.action.line, "scalar"), step.name)
            if name in builder.unread:
                builder.unread.remove(name)
    with step.at(step.action):
        return step.pipeline.sql(query, name=step.name)


OPERATOR_OPTIONS = ("args", "partitions", "application_window", "input", "output", "grouping")


@step_kind("operator", options=OPERATOR_OPTIONS)
def _operator(step: StepContext) -> Any:
    """An hr.Operator class module:Class (args: its keyword arguments) fed from `from` (docs/operators.md)."""
    from headrace.apex_operators import input_ports, output_ports
    from headrace.groupings import Fields

    kind = step.imported(step.action)
    if not isinstance(kind, type):
        raise step.fail(step.action, f"operator: {step.action.value!r} names {type(kind).__name__}, not a class; "
                                     "name an hr.Operator subclass, e.g. mypkg.ops:WordCounter")
    args = step.plain_option("args") or {}
    if not isinstance(args, dict):
        raise step.fail(step.option("args") or step.action,
                        f"args must be a mapping of keyword arguments, got {args!r}")
    with step.at(step.action):
        try:
            operator = kind(**args)
        except TypeError as exc:
            raise step.fail(step.option("args") or step.action, f"{kind.__name__}(**args) failed: {exc}") from None
        handle = step.pipeline.add_operator(step.name, operator, partitions=step.plain_option("partitions") or 1,
                                            application_window=step.plain_option("application_window") or 1)
    ins, outs = list(input_ports(kind)), [n for n, p in output_ports(kind).items() if p.schema_spec is not None]
    port_in = step.plain_option("input") or (ins[0] if len(ins) == 1 else None)
    port_out = step.plain_option("output") or (outs[0] if len(outs) == 1 else None)
    if port_in not in ins:
        raise step.fail(step.option("input") or step.action, f"input: choose the input port `from` feeds among "
                                                              f"{', '.join(ins) or 'none'}, got {port_in!r}")
    if port_out not in output_ports(kind):
        raise step.fail(step.option("output") or step.action, f"output: choose the output port this step's stream "
                                                               f"is, among {', '.join(output_ports(kind)) or 'none'}, "
                                                               f"got {port_out!r}")
    grouping = step.plain_option("grouping")
    if isinstance(grouping, dict) and set(grouping) == {"fields"}:
        fields = grouping["fields"]
        grouping = Fields(*(fields if isinstance(fields, list) else [fields]))
    with step.at(step.option("grouping") or step.action):
        step.pipeline.add_stream(f"{step.name}_in", step.input, getattr(handle, port_in), grouping=grouping)
        return getattr(handle, port_out).stream(name=f"{step.name}_{port_out}")
