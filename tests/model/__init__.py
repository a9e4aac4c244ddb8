"""A reference model of headrace pipelines, for the differential test (tests/test_differential.py).

``spec`` describes a random pipeline as plain data; ``interpreter`` runs a spec on its bounded
input in plain Python, from the documented semantics (docs/semantics.md, windows.md,
process.md) and nothing of headrace's; ``build`` turns the same spec into a headrace pipeline
and its input files; ``generate`` draws specs with Hypothesis.
"""
