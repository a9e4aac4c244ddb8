"""A lookup service for the enrich tests (tests/test_enrich.py) and benchmarks/enrich.py, slow and
failing on purpose: ``python tests/enrich_service.py PORT [DELAY_S [plain]]``.

``POST /lookup`` with ``{"id": n, ...}`` answers after DELAY_S (default 0.05) with
``{"risk": (7 n mod 100) / 100, "country": ["DE", "FR", "US"][n mod 3]}``, except:

* n mod 10 = 3: the first call for n answers 500 (10 % of the records fail once);
* n mod 1000 = 999: every call answers 503 (the record's calls all fail);
* n mod 1000 = 500: every call answers 400 (a bad request: not worth another try);
* n mod 1000 = 250: the first call for n answers after 3 s (past the callers' timeout).

With a third argument ``plain`` only the first rule holds (benchmarks/enrich.py).

``GET /calls`` gives the calls made so far per n; ``POST /reset`` forgets them. Prints
``listening`` once it accepts connections.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

from aiohttp import web

COUNTRIES = ("DE", "FR", "US")


def answer(n: int) -> dict:
    """What the service answers for record n (the tests' independent model uses it too)."""
    return {"risk": (7 * n % 100) / 100, "country": COUNTRIES[n % 3]}


def main() -> None:
    port, delay = int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.05
    plain = sys.argv[3:] == ["plain"]
    calls: Counter[int] = Counter()

    async def lookup(request: web.Request) -> web.Response:
        n = int((await request.json())["id"])
        calls[n] += 1
        if plain:
            await asyncio.sleep(delay)
            if n % 10 == 3 and calls[n] == 1:
                return web.json_response({"error": "try again"}, status=500)
            return web.json_response(answer(n))
        if n % 1000 == 250 and calls[n] == 1:
            await asyncio.sleep(3)
        await asyncio.sleep(delay)
        if n % 1000 == 999:
            return web.json_response({"error": "unavailable"}, status=503)
        if n % 1000 == 500:
            return web.json_response({"error": f"no such record {n}"}, status=400)
        if n % 10 == 3 and calls[n] == 1:
            return web.json_response({"error": "try again"}, status=500)
        return web.json_response(answer(n))

    async def counts(_request: web.Request) -> web.Response:
        return web.json_response({str(k): v for k, v in calls.items()})

    async def reset(_request: web.Request) -> web.Response:
        calls.clear()
        return web.json_response({})

    app = web.Application()
    app.add_routes([web.post("/lookup", lookup), web.get("/calls", counts), web.post("/reset", reset)])

    async def serve() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
        print("listening", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
