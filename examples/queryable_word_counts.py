"""Word counts you can look up while they are counted: the running count of each word is the
queryable view ``totals``, and the count of each word in each 1-second window is the view
``per_second`` (updated each micro-batch that adds to the window). ``headrace server`` serves both.
The generator's 300,000 lines span 3 seconds of event time, 100,000 lines a micro-batch.

    headrace server                                     # in one terminal; in another:
    headrace submit examples/queryable_word_counts.py
    headrace query queryable_word_counts totals stream --min-batch 3
    headrace query queryable_word_counts per_second --prefix 'stream|'
"""

import headrace as hr


def split_line(record: dict) -> list[dict]:
    return [{"word": word.lower(), "event_time": record["event_time"]} for word in record["line"].split()]


pipeline = hr.Pipeline("queryable_word_counts")
lines = pipeline.source("lines", hr.sources.Generator("words", limit=300_000, rows_per_batch=100_000),
                        event_time="event_time", max_out_of_orderness="1s")
words = lines.flat_map(split_line, schema={"word": "string", "event_time": "timestamp"}, name="split").key_by("word")
words.count(name="count").queryable("totals")  # the view's key: the word
per_second = words.window(hr.Tumbling("1s"), name="windows").aggregate(n=hr.count(), emit="updates")
per_second.queryable("per_second")  # the view's key: the word and the window's start
