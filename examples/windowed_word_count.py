"""Windowed word count: words per 1-second event-time window, each window printed once,
when the watermark passes its end (the last ones when the bounded input ends). The
generator's 300,000 lines span 3 seconds of event time, 100,000 lines a micro-batch.

    headrace run examples/windowed_word_count.py
"""

import headrace as hr


def split_line(record: dict) -> list[dict]:
    return [{"word": word.lower(), "event_time": record["event_time"]} for word in record["line"].split()]


pipeline = hr.Pipeline("windowed_word_count")
lines = pipeline.source("lines", hr.sources.Generator("words", limit=300_000, rows_per_batch=100_000),
                        event_time="event_time", max_out_of_orderness="1s")
words = lines.flat_map(split_line, schema={"word": "string", "event_time": "timestamp"}, name="split")
(words.key_by("word")
      .window(hr.Tumbling("1s"), name="per_second")
      .aggregate(n=hr.count())
      .sink("console", hr.sinks.Console(limit=10)))
