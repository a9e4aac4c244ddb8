"""The test kit: explicit micro-batches in, collected rows out.

>>> import headrace as hr
>>> from headrace.testing import TestSource, TestSink, run_to_completion
>>> source = TestSource([[{"word": "a"}, {"word": "b"}], [{"word": "a"}]], schema={"word": "string"})
>>> p = hr.Pipeline("doc_words")
>>> sink = TestSink()
>>> p.source("words", source).key_by("word").count().sink("counts", sink)
>>> out = run_to_completion(p)  # doctest: +SKIP
>>> sorted((r["word"], r["count"]) for r in out["counts"])  # doctest: +SKIP
[('a', 1), ('a', 2), ('b', 1)]

Each list given to :class:`TestSource` is one micro-batch, processed to completion
(including the watermark's effect) before the next is offered; a :class:`Watermark`
moves the watermark without adding data to any window.
"""

from __future__ import annotations

import tempfile
from typing import Any

from headrace.connectors.scripted import ProcessingTime, TestSink, TestSource, Watermark
from headrace.runtime.runner import PipelineRun

__all__ = ["ProcessingTime", "TestSource", "TestSink", "Watermark", "run_to_completion"]


def run_to_completion(pipeline: Any, *, state_dir: str | None = None, progress: str = "quiet",
                      on_step: Any = None) -> dict[str, list[dict[str, Any]]]:
    """Run ``pipeline`` until every source is exhausted, offering each TestSource
    micro-batch only after the previous one is fully processed. Returns each TestSink's rows
    by sink name. ``on_step(run)`` is called after each step settles."""
    _ship_test_modules(pipeline)
    state = state_dir or tempfile.mkdtemp(prefix="headrace-test-")
    run = PipelineRun(pipeline, state_dir=state, progress=progress, fresh=state_dir is None)
    run.start()
    run.wait(until_exhausted=True, on_settled=on_step)
    return {sink.name: sink.connector.rows() for sink in pipeline.plan.sinks()
            if isinstance(sink.connector, TestSink)}


def _ship_test_modules(pipeline: Any) -> None:
    """Functions defined in a test module (not importable on Spark's workers) travel by value."""
    import sys

    from pyspark import cloudpickle

    functions = [f.fn for f in pipeline.plan.functions.values()]  # SQL's, then the steps'
    for node in pipeline.plan.nodes.values():
        functions += [getattr(node, "fn", None), getattr(node, "reduce_fn", None)]
    for fn in functions:
        module = sys.modules.get(getattr(fn, "__module__", "") or "")
        path = getattr(module, "__file__", "") or ""
        if module is not None and "site-packages" not in path and not module.__name__.startswith("headrace"):
            if module.__name__ != "__main__":
                cloudpickle.register_pickle_by_value(module)
