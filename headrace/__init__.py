"""headrace: streaming pipelines in Python, run on Apache Spark.

>>> import headrace as hr
>>> p = hr.Pipeline("doc")
>>> words = p.source("words", hr.sources.Generator("words", limit=1000))
>>> words.filter(hr.col("line").is_not_null()).sink("out", hr.sinks.Null())
>>> print(p.explain().splitlines()[0])
pipeline 'doc'
"""

from headrace import sinks, sources
from headrace.aggregates import Agg, count, max, mean, min, sum
from headrace.api.stream import KeyedStream, Pipeline, Stream, Table, WindowedStream, WindowResult
from headrace.errors import (
    HeadraceError,
    IncompatibleCheckpoint,
    PipelineFailed,
    PlanError,
    SetupError,
    SinkError,
    SourceError,
    StepFunctionError,
)
from headrace.expr import Expr, col, expr, lit
from headrace.process import Context, KeyedProcessFunction, Timer
from headrace.runtime.runner import RunResult, run
from headrace.state import ListState, MapState, ValueState
from headrace.triggers import AfterDelay, AfterWatermark, CountTrigger, EveryN
from headrace.window_functions import AggregateFunction
from headrace.windows import Count, Global, Session, Sliding, Tumbling

__all__ = [
    "AfterDelay", "AfterWatermark", "AggregateFunction", "Context", "Count", "CountTrigger", "EveryN", "Global",
    "KeyedProcessFunction", "ListState", "MapState", "Timer", "ValueState", "WindowResult",
    "Agg", "Expr", "HeadraceError", "IncompatibleCheckpoint", "KeyedStream", "Pipeline", "PipelineFailed",
    "PlanError", "RunResult", "Session", "SetupError", "SinkError", "Sliding", "SourceError", "StepFunctionError",
    "Stream", "Table", "Tumbling", "WindowedStream", "col", "count", "expr", "lit", "max", "mean", "min", "run",
    "sinks", "sources", "sum",
]
