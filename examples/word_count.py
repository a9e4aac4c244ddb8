"""Running word count: how often each word has been seen so far, updated every micro-batch.

    headrace run examples/word_count.py
"""

import headrace as hr


def split_line(record: dict) -> list[dict]:
    return [{"word": word} for word in record["line"].split()]


pipeline = hr.Pipeline("word_count")
lines = pipeline.source("lines", hr.sources.Generator("words", limit=300_000, rows_per_batch=100_000))
words = lines.flat_map(split_line, schema={"word": "string"}, name="split")
words.key_by("word").count(name="counts").sink("console", hr.sinks.Console(limit=10))
