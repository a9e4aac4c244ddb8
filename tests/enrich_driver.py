"""A driver process for tests/test_enrich.py: files -> an enrich step calling
tests/enrich_service.py -> files, with the step's dead letters in files of their own, until
SIGTERM. Each micro-batch reads one file. The test kills it with SIGKILL and restarts it.

    python tests/enrich_driver.py '{"name": ..., "input": ..., "url": ..., "state_dir": ..., "out": ..., "dead": ...}'
"""

from __future__ import annotations

from driver_process import driver_main

import headrace as hr


def pipeline(args: dict) -> hr.Pipeline:
    p = hr.Pipeline(args["name"])
    enriched = (p.source("orders", hr.sources.Files(args["input"], "jsonl", "id long", max_files_per_batch=1))
                .enrich(hr.HttpJson(args["url"], send=["id"]), fields={"risk": "double", "country": "string"},
                        concurrency=32, timeout=2.0, retries=3, backoff=0.02, name="lookup"))
    enriched.sink("out", hr.sinks.Files(args["out"], format="jsonl"))
    p.dead_letters(enriched).sink("dead", hr.sinks.Files(args["dead"], format="jsonl"))
    return p


if __name__ == "__main__":
    driver_main(pipeline)
