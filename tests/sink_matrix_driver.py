"""A driver process for tests/test_sink_matrix.py: JSON-lines files (a bad line in each) -> a keyed
one-minute window count -> two groups of sinks, with the dead letters sunk between them; until SIGTERM.

    python tests/sink_matrix_driver.py '{"name": ..., "state_dir": ..., "input": ..., "sinks": [[kind, target], ...],
                                         "before": N, "dead": ..., "pause_file": ..., "pause_at": ...}'

The first ``before`` sinks write first, then the dead-letter sink writes its batch and, at batch
``pause_at`` of the first run, creates ``pause_file`` and waits: the first group and the dead
letters have committed the batch, the second group has not, and Spark's commit log has not. The
test kills the process group there.
"""

from __future__ import annotations

import os
import time
from typing import Any

from driver_process import driver_main

import headrace as hr
from headrace.connectors.files_sink import FileSink

SCHEMA = "user string, event_time timestamp"
PG_DSN = os.environ.get("HEADRACE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


def make_sink(kind: str, target: str) -> Any:
    """The matrix's sink of ``kind`` writing to ``target`` (a table, topic, stream, subject or folder)."""
    if kind == "files":
        return hr.sinks.Files(target, format="jsonl")
    if kind == "postgres":
        return hr.sinks.Postgres(target, dsn=PG_DSN)  # no key: a batch written twice would show
    if kind == "kafka":
        return hr.sinks.Kafka(target, key="user")
    if kind == "delta":
        return hr.sinks.Delta(target)  # appended, no key
    if kind == "redis":
        return hr.sinks.Redis(stream=target)
    if kind == "nats":
        return hr.sinks.Nats(f"{target}.windows", stream=target)
    if kind == "rabbitmq":
        return hr.sinks.RabbitMQ(target)
    if kind == "view":  # kept in the pipeline's state dir, named after its sink step
        return hr.sinks.View(key=["user", "window_start"])
    raise ValueError(kind)


class PausingFiles(FileSink):
    """A JSON-lines file sink that, once, waits after committing batch ``at`` (see the module)."""

    def __init__(self, path: str, pause_file: str, at: int) -> None:
        super().__init__(path, format="jsonl")
        self.pause_file, self.at = pause_file, at

    def write_batch(self, df: Any, batch_id: int) -> None:
        super().write_batch(df, batch_id)
        if batch_id == self.at and not os.path.exists(self.pause_file):
            with open(self.pause_file, "w") as marker:
                marker.write(f"{batch_id}\n")
            time.sleep(600)


def build(name: str, input: str, sinks: list[Any], dead: Any = None, before: int = 1) -> hr.Pipeline:
    """The matrix's pipeline into ``sinks``, the dead letters into ``dead`` after the first ``before``."""
    p = hr.Pipeline(name)
    clicks = p.source("clicks", hr.sources.Files(input, format="jsonl", schema=SCHEMA, bounded=True,
                                                 max_files_per_batch=1),
                      event_time="event_time", max_out_of_orderness="1s")
    counts = clicks.key_by("user").window(hr.Tumbling("1m")).count().select("user", "window_start", "count")
    for index, sink in enumerate(sinks[:before]):
        counts.sink(f"first_{index}", sink)
    if dead is not None:  # between the two groups: the sinks write in the order they were defined
        p.dead_letters().sink("dead", dead)
    for index, sink in enumerate(sinks[before:]):
        counts.sink(f"second_{index}", sink)
    return p


def pipeline(args: dict[str, Any]) -> hr.Pipeline:
    dead = PausingFiles(args["dead"], args["pause_file"], args["pause_at"])
    sinks = [make_sink(kind, target) for kind, target in args["sinks"]]
    return build(args["name"], args["input"], sinks, dead, before=args["before"])


if __name__ == "__main__":
    driver_main(pipeline)
