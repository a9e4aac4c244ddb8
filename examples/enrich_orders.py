"""Orders enriched by a call to an HTTP service per order: a card lookup that answers in 50 ms,
fails once for one card (the call is tried again) and does not know another (a 404: that order
goes to the dead letters with the reason). The service is started here, on a free local port.
docs/enrich.md shows it. Needs the enrich extra: pip install -e '.[enrich]'

    python examples/enrich_orders.py
"""

import asyncio
import socket
import threading

from aiohttp import web

import headrace as hr
from headrace.testing import TestSink, TestSource, run_to_completion

CARDS = {"c1": ("DE", 0.1), "c2": ("FR", 0.7), "c3": ("US", 0.2)}  # what the service knows


def start_card_service() -> str:
    """A lookup service in a thread of this process: POST {"card": ...} -> {"country", "risk"}."""
    calls: dict[str, int] = {}

    async def lookup(request: web.Request) -> web.Response:
        card = (await request.json())["card"]
        calls[card] = calls.get(card, 0) + 1
        await asyncio.sleep(0.05)
        if card == "c2" and calls[card] == 1:
            return web.json_response({"error": "busy"}, status=503)  # once: the call is tried again
        if card not in CARDS:
            return web.json_response({"error": f"unknown card {card}"}, status=404)
        country, risk = CARDS[card]
        return web.json_response({"country": country, "risk": risk})

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ready = threading.Event()

    def serve() -> None:
        async def main() -> None:
            runner = web.AppRunner(web.Application(middlewares=[]), access_log=None)
            runner.app.add_routes([web.post("/cards", lookup)])
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            ready.set()
            await asyncio.Event().wait()
        asyncio.run(main())

    threading.Thread(target=serve, daemon=True).start()
    ready.wait()
    return f"http://127.0.0.1:{port}/cards"


ORDERS = [{"order": 1, "card": "c1", "amount": 30.0}, {"order": 2, "card": "c2", "amount": 12.5},
          {"order": 3, "card": "c9", "amount": 99.0}, {"order": 4, "card": "c3", "amount": 7.0},
          {"order": 5, "card": "c1", "amount": 41.0}]

def build(url: str) -> hr.Pipeline:
    pipeline = hr.Pipeline("enrich_orders")
    orders = pipeline.source("orders", TestSource([ORDERS], schema={"order": "long", "card": "string",
                                                                    "amount": "double"}))
    cards = orders.enrich(hr.HttpJson(url, send=["card"]), fields={"country": "string", "risk": "double"},
                          concurrency=8, timeout=2.0, retries=2, name="card_lookup")
    cards.sink("enriched", TestSink())
    pipeline.dead_letters(cards).sink("unknown_cards", TestSink())
    return pipeline


pipeline = build("http://127.0.0.1:8000/cards")  # what `headrace explain` shows

if __name__ == "__main__":
    url = start_card_service()
    written = run_to_completion(build(url))
    for row in written["enriched"]:
        print(f"order {row['order']}: {row['amount']:5.1f} on card {row['card']} from {row['country']}, "
              f"risk {row['risk']}")
    for letter in written["unknown_cards"]:
        print(f"dead letter {letter['raw']}: {letter['error'].replace(url, 'the service')}")
