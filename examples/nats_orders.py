"""Orders from a NATS JetStream stream: the large ones republished to another subject, exactly once.

    bash scripts/nats.sh start            # a local nats-server with JetStream on 127.0.0.1:4222
    python examples/nats_orders.py        # makes demo streams, publishes sample orders, prints the result
    headrace run examples/nats_orders.py  # reads the stream "ORDERS" (subjects orders.>) until Ctrl-C

The source reads the stream by sequence (exactly-once); the sink publishes each large order as
JSON to ``large_orders.<user>`` with a message id per batch and row, so JetStream drops what a
replayed batch publishes again (exactly-once within the stream's duplicate window, 2 minutes by
default). A message that is not an order goes to the dead letters, printed with its stream and
sequence. Ctrl-C stops it between batches; the next run continues from its checkpoint.
"""

import asyncio
import os
import tempfile
import time
from typing import Any

import headrace as hr

URL = os.environ.get("HEADRACE_EXAMPLE_NATS", "nats://127.0.0.1:4222")
SCHEMA = "order_id long, user string, amount long"


def build(stream: str, large_subject: str, dead_sink: Any) -> hr.Pipeline:
    pipeline = hr.Pipeline("nats_orders")
    orders = pipeline.source("orders", hr.sources.Nats(stream, schema=SCHEMA, url=URL))
    (orders.filter(hr.col("amount") >= 100)
           .select("order_id", "user", "amount", "nats_seq")
           .sink("large", hr.sinks.Nats(large_subject, url=URL, key="user")))
    pipeline.dead_letters().sink("bad_orders", dead_sink)
    return pipeline


pipeline = build("ORDERS", "large_orders", hr.sinks.Console())


async def _publish_sample(stream: str, large: str) -> None:
    import nats

    nc = await nats.connect(URL)
    js = nc.jetstream()
    for name in (stream, large):
        try:
            await js.delete_stream(name)
        except nats.js.errors.NotFoundError:
            pass
    await js.add_stream(name=stream, subjects=[f"{stream}.>"])
    await js.add_stream(name=large, subjects=[f"{large}.>"])
    orders = [(1, "ana", 250), (2, "bob", 40), (3, "ana", 120), (4, "cy", 99), (5, "bob", 300)]
    for order_id, user, amount in orders:
        payload = f'{{"order_id": {order_id}, "user": "{user}", "amount": {amount}}}'
        await js.publish(f"{stream}.new", payload.encode())
    await js.publish(f"{stream}.new", b"not an order")
    await nc.close()


async def _large_orders(large: str) -> list[tuple[str, str]]:
    import nats

    nc = await nats.connect(URL)
    js = nc.jetstream()
    last = (await js.stream_info(large)).state.last_seq
    found = [await js.get_msg(large, seq) for seq in range(1, last + 1)]
    await nc.close()
    return [(msg.subject, msg.data.decode()) for msg in found]


async def _delete(*streams: str) -> None:
    import nats

    nc = await nats.connect(URL)
    for name in streams:
        await nc.jetstream().delete_stream(name)
    await nc.close()


def demo() -> None:
    """Six messages on ``hr_demo_orders.new`` (one not an order); prints what reached ``hr_demo_large``."""
    from headrace.runtime.runner import PipelineRun
    from headrace.testing import TestSink

    stream, large = "hr_demo_orders", "hr_demo_large"
    asyncio.run(_publish_sample(stream, large))
    dead = TestSink()
    run = PipelineRun(build(stream, f"{large}.orders", dead), state_dir=tempfile.mkdtemp(), progress="quiet").start()
    deadline = time.time() + 120
    while (len(asyncio.run(_large_orders(large))) < 3 or not dead.rows()) and time.time() < deadline:
        run.settle()
        time.sleep(0.2)
    run.request_stop("demo done")
    run.wait(until_exhausted=False)
    for subject, data in asyncio.run(_large_orders(large)):
        print(subject, data)
    for row in dead.rows():
        print(f"dead letter at {row['position']}: {row['error']}")
    asyncio.run(_delete(stream, large))


if __name__ == "__main__":
    demo()
