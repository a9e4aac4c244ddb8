"""A spec as a headrace pipeline: its input files, its steps, its sinks (the public API only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from input_files import write_in_order

import headrace as hr
from headrace.testing import TestSink
from model.spec import (
    AGGREGATE_NAMES,
    EVENT_SCHEMA,
    PROCESS_SCHEMA,
    SECOND_SOURCE,
    SOURCE,
    WEIGHTS,
    BadLine,
    NativeFilter,
    PythonFilter,
    PythonMap,
    Rolling,
    Session,
    Sliding,
    Spec,
    SqlStep,
    SqlWindow,
    TableJoin,
    Tally,
    Tumbling,
    Window,
    WithColumns,
    file_name,
)

# the source turns its event-time field into a timestamp: a map hands it on as one
MAPPED_SCHEMA = {**EVENT_SCHEMA, "ts": "timestamp"}


def write_input(spec: Spec, folder: Path) -> None:
    """One JSON-lines file per micro-batch, named in batch order; a united source's under ``more``."""
    _write_batches(spec.batches, folder / SOURCE)
    if spec.union:
        _write_batches(spec.union.batches, folder / SECOND_SOURCE)


def _write_batches(batches: tuple[tuple[Any, ...], ...], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for number, batch in enumerate(batches):
        lines = [item.raw if isinstance(item, BadLine) else json.dumps(item.as_dict()) for item in batch]
        write_in_order(folder / file_name(number), "".join(line + "\n" for line in lines), number)


class Built:
    """The pipeline of a spec and where each of its sinks puts its rows."""

    def __init__(self, pipeline: hr.Pipeline, sinks: dict[str, Any]) -> None:
        self.pipeline, self.sinks = pipeline, sinks


def build(spec: Spec, name: str, folder: Path) -> Built:
    """``spec``'s pipeline reading ``folder / "input"``; file sinks write under ``folder``."""
    p = hr.Pipeline(name)
    stream = _source(p, SOURCE, folder / "input" / SOURCE, spec.delay)
    for number, step in enumerate(spec.steps):
        stream = _stateless(p, stream, step, f"step_{number}")
    sinks: dict[str, Any] = {}
    united = stream
    if spec.union:
        united = stream.union(_source(p, SECOND_SOURCE, folder / "input" / SECOND_SOURCE, spec.union.delay),
                              name="united")
    if isinstance(spec.stateful, SqlWindow):
        final = p.sql(f"SELECT window, key, count(*) AS n, sum(value) AS total FROM {united.node.name} "
                      f"GROUP BY window(ts, '{spec.stateful.seconds} seconds'), key", name="sql_window")
    else:
        final = _stateful(united, spec.stateful) if spec.stateful else united
    kinds = spec.sink_kinds()
    for sink_name, kind in kinds.items():
        target = {"tap": stream, "dead": None}.get(sink_name, final)
        if target is None:
            target = p.dead_letters()
        connector = TestSink() if kind == "test" else hr.sinks.Files(str(folder / sink_name), format="jsonl")
        target.sink(sink_name, connector)
        sinks[sink_name] = connector
    return Built(p, sinks)


def _source(p: hr.Pipeline, name: str, folder: Path, delay: int) -> hr.Stream:
    files = hr.sources.Files(str(folder), format="jsonl", schema=EVENT_SCHEMA, bounded=True, max_files_per_batch=1)
    return p.source(name, files, event_time="ts", max_out_of_orderness=delay)


def _stateless(p: hr.Pipeline, stream: hr.Stream, step: Any, name: str) -> hr.Stream:
    if isinstance(step, NativeFilter):
        return stream.filter(hr.col("value") > step.above, name=name)
    if isinstance(step, PythonFilter):
        return stream.filter(step, name=name)
    if isinstance(step, PythonMap):
        return stream.map(step, schema=MAPPED_SCHEMA, name=name)
    if isinstance(step, WithColumns):
        return stream.with_columns(value=hr.col("value") * step.times, name=name)
    if isinstance(step, SqlStep):
        return p.sql(f"SELECT key, value + {step.add} AS value, ts FROM {stream.node.name}", name=name)
    if isinstance(step, TableJoin):
        table = p.table(f"{name}_weights", [{"key": k, "weight": w} for k, w in WEIGHTS.items()],
                        schema={"key": "string", "weight": "long"})
        joined = stream.join(table, on="key", how=step.how, name=name)
        return (joined.with_columns(value=hr.col("value") * hr.col("weight"), name=f"{name}_weighted")
                .select("key", "value", "ts", name=f"{name}_select"))
    raise TypeError(f"cannot build {step!r}")


def _aggregates(names: tuple[str, ...]) -> dict[str, Any]:
    made = {"count": hr.count, "sum": lambda: hr.sum("value"), "min": lambda: hr.min("value"),
            "max": lambda: hr.max("value")}
    return {AGGREGATE_NAMES[a]: made[a]() for a in names}


def _shape(shape: Any) -> Any:
    if isinstance(shape, Tumbling):
        return hr.Tumbling(shape.size)
    if isinstance(shape, Sliding):
        return hr.Sliding(shape.size, shape.slide)
    if isinstance(shape, Session):
        return hr.Session(shape.gap)
    raise TypeError(f"cannot build {shape!r}")


def _stateful(stream: hr.Stream, step: Any) -> hr.Stream:
    if isinstance(step, Window):
        grouped: Any = stream.key_by("key") if step.keyed else stream
        trigger = hr.AfterWatermark(early=hr.EveryN(step.early)) if step.early else None
        windowed = grouped.window(_shape(step.shape), name="first_window", trigger=trigger,
                                  allowed_lateness=step.lateness,
                                  accumulation="accumulating" if step.accumulating else "discarding")
        results = windowed.aggregate(**_aggregates(step.aggregates))
        if step.then is None:
            return results
        again: Any = results.key_by("key") if step.keyed else results
        return (again.window(hr.Tumbling(step.then.size), name="second_window")
                .aggregate(sum_n=hr.sum("n"), windows=hr.count()))
    if isinstance(step, Rolling):
        return stream.key_by("key").aggregate(**_aggregates(step.aggregates))
    if isinstance(step, Tally):
        return stream.key_by("key").process(TallyFunction(step.after), schema=PROCESS_SCHEMA, name="tally")
    raise TypeError(f"cannot build {step!r}")


class TallyFunction(hr.KeyedProcessFunction):
    """model.spec.Tally as a process function."""

    seen = hr.ValueState(default=0)

    def __init__(self, after: int) -> None:
        self.after = after

    def process(self, record: dict[str, Any], ctx: Any) -> None:
        self.seen.set(self.seen.get() + 1)
        ctx.emit({"key": ctx.key, "kind": "record", "n": self.seen.get(), "at": ctx.timestamp})
        ctx.register_event_time_timer(ctx.timestamp + self.after)

    def on_timer(self, timer: Any, ctx: Any) -> None:
        ctx.emit({"key": ctx.key, "kind": "timer", "n": self.seen.get(), "at": timer.time})
