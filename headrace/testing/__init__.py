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
from headrace.errors import HeadraceError
from headrace.testing.local import run_locally

__all__ = ["ProcessingTime", "TestSource", "TestSink", "Watermark", "run_locally", "run_to_completion"]


def run_to_completion(pipeline: Any, *, state_dir: str | None = None, progress: str = "quiet",
                      on_step: Any = None, fresh: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Run ``pipeline`` until every source is exhausted, offering each TestSource
    micro-batch only after the previous one is fully processed. Returns each TestSink's rows
    by sink name. ``on_step(run)`` is called after each step settles. A ``state_dir`` that
    holds a run of the pipeline which read its input to the end is refused (the run would read
    nothing and return no rows); ``fresh=True`` forgets what it holds first."""
    from headrace.runtime.runner import PipelineRun  # Spark's driver: run_locally needs none of it

    state = state_dir or tempfile.mkdtemp(prefix="headrace-test-")
    run = PipelineRun(pipeline, state_dir=state, progress=progress, fresh=fresh or state_dir is None)
    if not fresh:
        _refuse_finished_run(run)
    run.start()
    run.wait(until_exhausted=True, on_settled=on_step)
    return {sink.name: sink.connector.rows() for sink in pipeline.plan.sinks()
            if isinstance(sink.connector, TestSink)}


def _refuse_finished_run(run: Any) -> None:
    """Raise when ``run``'s checkpoint holds a run that read its input to the end: every source
    marked exhausted and every batch of the offset log committed."""
    from headrace.environment.checkpoints import COMMITS, OFFSETS, last_batch

    if run.remote or not run.exhausted():
        return
    last = last_batch(run.checkpoint, OFFSETS)
    if last is None or last_batch(run.checkpoint, COMMITS) != last:
        return  # stopped before its last batch committed: the run goes on from there
    raise HeadraceError(f"pipeline {run.plan.name!r}: the state dir {run.state_dir} holds a run that read the "
                        "input to its end (every source exhausted, every batch committed): run on it again, the "
                        "pipeline would read nothing and return no rows; pass a new state_dir (or none: a temporary "
                        "one), or fresh=True to forget that run")
