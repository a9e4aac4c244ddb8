"""Clicks from a Redis stream, counted per user and 10 seconds of entry time.

    bash scripts/redis.sh start            # a local Redis on 127.0.0.1:6379
    python examples/redis_clicks.py        # adds sample clicks to a demo stream and prints their counts
    headrace run examples/redis_clicks.py  # reads the stream "clicks" until Ctrl-C

Add clicks with ``redis-cli XADD clicks '*' data '{"user": "ana", "url": "/home"}'``; an entry
that is not such JSON goes to the dead letters, printed with its stream and entry id. The event
time is the millisecond part of the entry id (``redis_time``). Ctrl-C stops it between batches;
the next run continues from its checkpoint. The source is exactly-once; the console sink prints
a replayed batch again (at-least-once), a transactional sink would not.
"""

import os
import tempfile
import time
from typing import Any

import headrace as hr

URL = os.environ.get("HEADRACE_EXAMPLE_REDIS", "redis://127.0.0.1:6379/0")


def build(stream: str, counts_sink: Any, dead_sink: Any) -> hr.Pipeline:
    pipeline = hr.Pipeline("redis_clicks")
    clicks = pipeline.source("clicks", hr.sources.Redis(stream, schema="user string, url string", url=URL),
                             event_time="redis_time", max_out_of_orderness="5s")
    (clicks.key_by("user")
           .window(hr.Tumbling("10s"), name="per_10s")
           .count()
           .sink("counts", counts_sink))
    pipeline.dead_letters().sink("bad_clicks", dead_sink)
    return pipeline


pipeline = build("clicks", hr.sinks.Console(), hr.sinks.Console())


def demo() -> None:
    """Nine clicks at known entry ids (from 2026-01-01T00:00:00Z), and one an hour later whose
    entry time closes every window before it; then the counts, once all nine are counted."""
    import redis

    from headrace.runtime.runner import PipelineRun
    from headrace.testing import TestSink

    stream, start_ms = "headrace_example_clicks", 1_767_225_600_000
    clicks = [(0, "ana"), (2_000, "bob"), (4_000, "ana"), (9_999, "ana"), (10_000, "bob"),
              (12_500, "ana"), (15_000, "bob"), (21_000, "ana"), (29_000, "bob")]
    client = redis.Redis.from_url(URL)
    client.delete(stream)
    for at, user in [*clicks, (3_600_000, "closing")]:
        client.xadd(stream, {"data": f'{{"user": "{user}", "url": "/"}}'}, id=f"{start_ms + at}-0")
    out, dead = TestSink(), TestSink()
    run = PipelineRun(build(stream, out, dead), state_dir=tempfile.mkdtemp(), progress="quiet").start()
    deadline = time.time() + 120
    while sum(row["count"] for row in out.rows()) < len(clicks) and time.time() < deadline:
        run.settle()
        time.sleep(0.2)
    run.request_stop("demo done")
    run.wait(until_exhausted=False)
    client.delete(stream)
    for row in sorted(out.rows(), key=lambda r: (r["window_start"], r["user"])):
        print(f"{row['window_start']:%H:%M:%S}-{row['window_end']:%H:%M:%S} {row['user']}: {row['count']}")
    for row in dead.rows():
        print(f"dead letter at {row['position']}: {row['error']}")


if __name__ == "__main__":
    demo()
