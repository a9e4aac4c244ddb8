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
moves the watermark without adding data to any window. :func:`run_locally` runs the same
pipeline in plain Python, without a JVM (docs/testing.md, "Testing without a JVM").
"""

from __future__ import annotations

import tempfile
from typing import Any

from headrace.connectors.scripted import ProcessingTime, TestSink, TestSource, Watermark
from headrace.testing.local import run_locally

__all__ = ["ProcessingTime", "TestSource", "TestSink", "Watermark", "run_locally", "run_to_completion"]


def run_to_completion(pipeline: Any, *, state_dir: str | None = None, progress: str = "quiet",
                      on_step: Any = None) -> dict[str, list[dict[str, Any]]]:
    """Run ``pipeline`` until every source is exhausted, offering each TestSource
    micro-batch only after the previous one is fully processed. Returns each TestSink's rows
    by sink name. ``on_step(run)`` is called after each step settles."""
    from headrace.runtime.runner import PipelineRun  # Spark's driver: run_locally needs none of it

    state = state_dir or tempfile.mkdtemp(prefix="headrace-test-")
    run = PipelineRun(pipeline, state_dir=state, progress=progress, fresh=state_dir is None)
    run.start()
    run.wait(until_exhausted=True, on_settled=on_step)
    return {sink.name: sink.connector.rows() for sink in pipeline.plan.sinks()
            if isinstance(sink.connector, TestSink)}
