"""headrace: streaming pipelines in Python, run on Apache Spark.

>>> import headrace as hr
>>> p = hr.Pipeline("doc")
>>> words = p.source("words", hr.sources.Generator("words", limit=1000))
>>> words.filter(hr.col("line").is_not_null()).sink("out", hr.sinks.Null())
>>> print(p.explain().splitlines()[0])
pipeline 'doc'
"""

# ruff: noqa: F401  (the imports under TYPE_CHECKING are for type checkers; __all__ is built from _PUBLIC)
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public names load on first use (PEP 562), so a Spark Python worker that unpickles one
# of headrace's connectors or operators imports that module and what it needs, not all of
# headrace with pandas and the runtime: each worker a pipeline starts is quicker to start.
_PUBLIC = {
    "headrace.aggregates": ("Agg", "AggregateFunction", "count", "max", "mean", "min", "sum"),
    "headrace.api.stream": ("KeyedStream", "Pipeline", "Stream", "Table", "WindowedStream", "WindowResult"),
    "headrace.apex_operators": ("InputPort", "Operator", "OperatorContext", "OutputPort", "Unifier"),
    "headrace.api.pipeline_file": ("load_pipeline_file",),
    "headrace.engine.enrichment": ("HttpJson", "PermanentError"),
    "headrace.errors": ("HeadraceError", "IncompatibleCheckpoint", "PipelineFailed", "PlanError", "SetupError",
                        "SinkError", "SourceError", "StepFunctionError", "PipelineFileError"),
    "headrace.process": ("Context", "KeyedProcessFunction", "Timer"),
    "headrace.runtime.runner": ("RunResult", "run"),
    "headrace.state": ("ListState", "MapState", "ValueState"),
    "headrace.triggers": ("AfterDelay", "AfterWatermark", "CountTrigger", "EveryN"),
    "headrace.windows": ("Count", "Global", "Session", "Sliding", "Tumbling"),
    "headrace.storm": ("BaseWindowedBolt", "Bolt", "Spout", "TopologyContext", "Tuple", "TupleWindow"),
    "headrace.storm_joins": ("JoinBolt",),
    "headrace.api.topology_builder": ("TopologyBuilder",),
}
# Bound now: the function ``expr`` has the name of its module, which would replace it on the
# package once anything imports ``headrace.expr`` (a light module).
from headrace.expr import Expr, col, expr, lit  # noqa: E402

_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}
_SUBMODULES = ("ml", "sinks", "sources")

__all__ = sorted([*_MODULE_OF, *_SUBMODULES, "Expr", "col", "expr", "lit"])


def __getattr__(name: str) -> Any:
    if name in _MODULE_OF:
        value = getattr(importlib.import_module(_MODULE_OF[name]), name)
        globals()[name] = value
        return value
    try:  # a submodule: hr.sources, hr.sinks, hr.testing, hr.windows, ...
        return importlib.import_module(f"headrace.{name}")
    except ModuleNotFoundError as missing:
        if missing.name != f"headrace.{name}":
            raise
    raise AttributeError(f"module 'headrace' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:  # what type checkers and editors see
    from headrace import sinks, sources
    from headrace.aggregates import Agg, AggregateFunction, count, max, mean, min, sum
    from headrace.apex_operators import InputPort, Operator, OperatorContext, OutputPort, Unifier
    from headrace.api.pipeline_file import load_pipeline_file
    from headrace.api.stream import KeyedStream, Pipeline, Stream, Table, WindowedStream, WindowResult
    from headrace.api.topology_builder import TopologyBuilder
    from headrace.engine.enrichment import HttpJson, PermanentError
    from headrace.errors import (
        HeadraceError,
        IncompatibleCheckpoint,
        PipelineFailed,
        PipelineFileError,
        PlanError,
        SetupError,
        SinkError,
        SourceError,
        StepFunctionError,
    )
    from headrace.process import Context, KeyedProcessFunction, Timer
    from headrace.runtime.runner import RunResult, run
    from headrace.state import ListState, MapState, ValueState
    from headrace.storm import BaseWindowedBolt, Bolt, Spout, TopologyContext, Tuple, TupleWindow
    from headrace.storm_joins import JoinBolt
    from headrace.triggers import AfterDelay, AfterWatermark, CountTrigger, EveryN
    from headrace.windows import Count, Global, Session, Sliding, Tumbling
