"""The test kit's local runner: a pipeline run in plain Python on headrace's engine, without a
JVM, with Spark's micro-batch and watermark semantics (``run_locally``)."""

from headrace.testing.local.runner import LocalRun, run_locally

__all__ = ["LocalRun", "run_locally"]
