"""The driver of a pipeline, above the compiler: run and stop (``runner.py``, ``signals.py``),
progress from Spark's listener, failures and restarts, the restart-compatibility check, rescale."""
