"""Benchmarks of headrace against the same pipelines hand-written in PySpark (run each file as a script)."""
