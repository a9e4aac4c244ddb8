"""The Yahoo Streaming Benchmark pipeline (also `headrace demo`): ad events -> keep the
views -> project -> join ad -> campaign -> views per campaign per 10 s event-time window.

    headrace run examples/ysb.py
    headrace explain examples/ysb.py

The pipeline itself is defined in headrace/demo.py, shared with the benchmark.
"""

from headrace.demo import ysb_pipeline

pipeline = ysb_pipeline(variant="native", limit=3_000_000)
