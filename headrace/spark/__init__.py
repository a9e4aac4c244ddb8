"""Lowering plans to Spark: the only package that imports PySpark (camelCase stays here)."""
