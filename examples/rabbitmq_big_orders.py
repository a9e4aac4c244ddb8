"""RabbitMQ Streams in and out: orders from the stream ``orders``, the big ones (amount >= 10)
to the stream ``big_orders``, exactly once (the sink publishes under a fixed publisher name
with a publishing id per row, and the broker drops what a replayed batch publishes again).

    bash scripts/rabbitmq.sh start
    python examples/rabbitmq_big_orders.py      # creates both streams, fills orders, runs 20 s, reads back

Its output (offset, body, properties):

    0 {"order_id":0,"user":"ana","amount":12} {b'key': b'ana'}
    1 {"order_id":2,"user":"ana","amount":40} {b'key': b'ana'}
    2 {"order_id":4,"user":"bob","amount":25} {b'key': b'bob'}
"""

import asyncio
import json

import headrace as hr

pipeline = hr.Pipeline("big_orders")
orders = pipeline.source("orders", hr.sources.RabbitMQ("orders", schema="order_id long, user string, amount long"))
(orders.filter(hr.col("amount") >= 10).select("order_id", "user", "amount")
 .sink("to_big", hr.sinks.RabbitMQ("big_orders", key="user")))


async def fill_orders() -> None:
    from rstream import AMQPMessage, Producer

    async with Producer("127.0.0.1", 5552, username="guest", password="guest") as producer:
        for stream in ("orders", "big_orders"):
            await producer.delete_stream(stream, missing_ok=True)
            await producer.create_stream(stream)
        for i, (user, amount) in enumerate([("ana", 12), ("bob", 3), ("ana", 40), ("cy", 7), ("bob", 25)]):
            body = json.dumps({"order_id": i, "user": user, "amount": amount}).encode()
            await producer.send_wait("orders", AMQPMessage(body=body))


async def read_back() -> None:
    from rstream import Consumer, amqp_decoder

    async with Consumer("127.0.0.1", 5552, username="guest", password="guest") as consumer:
        async def show(message, context) -> None:  # noqa: ANN001 - rstream's callback
            print(context.offset, bytes(message.body).decode(), message.application_properties)
        await consumer.subscribe("big_orders", show, decoder=amqp_decoder)
        await asyncio.sleep(2)


if __name__ == "__main__":
    asyncio.run(fill_orders())
    hr.run(pipeline, state_dir="/tmp/rabbitmq_example_state", fresh=True, progress="quiet", max_seconds=20)
    asyncio.run(read_back())
