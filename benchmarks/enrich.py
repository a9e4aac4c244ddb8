"""An enrich step calling an HTTP service, against the same calls made by a plain asyncio client
(aiohttp, the same concurrency and retries), in the same run.

    .venv/bin/python benchmarks/enrich.py                    # 10,000 records, 50 ms a call, 64 at a time
    .venv/bin/python benchmarks/enrich.py --records 2000     # smaller

The service is ``tests/enrich_service.py`` in its ``plain`` mode, in a process of its own: it
answers each call after 50 ms, and the first call for 10 % of the records with a 500 (tried
again). headrace: ``Files`` (JSON lines, bounded, one file) -> ``enrich(hr.HttpJson(...),
concurrency=64, retries=3)`` -> ``Files`` sink, the pipeline's dead letters in a second sink,
timed from ``hr.run``'s start to its end (a warm session: a small run goes first). The client:
the same 10,000 POSTs from one asyncio loop with at most 64 in flight, each tried again after
the same backoff. Checks that every record was enriched once with the service's answer, and
prints ``enrich records=<n> seconds=<headrace's> client_seconds=<the client's> ratio=<client /
headrace>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from enrich_service import answer  # noqa: E402

import headrace as hr  # noqa: E402
from headrace.connectors.files_sink import read_rows  # noqa: E402

CONCURRENCY, RETRIES, BACKOFF = 64, 3, 0.02
FIELDS = {"risk": "double", "country": "string"}


def start_service(delay: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    service = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "enrich_service.py"), str(port),
                                str(delay), "plain"], stdout=subprocess.PIPE, text=True)
    assert service.stdout is not None and service.stdout.readline().strip() == "listening"
    return service, f"http://127.0.0.1:{port}/lookup"


def headrace_run(url: str, records: int, workdir: str, name: str) -> tuple[float, list[dict], list[dict]]:
    folder = os.path.join(workdir, name)
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(os.path.join(folder, "in"))
    with open(os.path.join(folder, "in", "orders.jsonl"), "w") as out:
        out.writelines(json.dumps({"id": n}) + "\n" for n in range(records))
    p = hr.Pipeline(name)
    enriched = (p.source("orders", hr.sources.Files(os.path.join(folder, "in"), "jsonl", "id long", bounded=True))
                .enrich(hr.HttpJson(url, send=["id"]), fields=FIELDS, concurrency=CONCURRENCY, retries=RETRIES,
                        backoff=BACKOFF, name="lookup"))
    enriched.sink("out", hr.sinks.Files(os.path.join(folder, "out"), format="jsonl"))
    p.dead_letters(enriched).sink("dead", hr.sinks.Files(os.path.join(folder, "dead"), format="jsonl"))
    started = time.perf_counter()
    hr.run(p, state_dir=os.path.join(folder, "state"), progress="quiet")
    seconds = time.perf_counter() - started
    return (seconds, read_rows(os.path.join(folder, "out"), "jsonl"),
            read_rows(os.path.join(folder, "dead"), "jsonl") if os.path.isdir(os.path.join(folder, "dead")) else [])


async def client_calls(url: str, records: int) -> tuple[float, list[dict]]:
    import aiohttp

    slots = asyncio.Semaphore(CONCURRENCY)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(n: int) -> dict:
            for attempt in range(RETRIES + 1):
                if attempt:
                    await asyncio.sleep(BACKOFF * 2 ** (attempt - 1))
                async with slots, session.post(url, json={"id": n}) as reply:
                    if reply.status < 400:
                        return {"id": n, **await reply.json()}
            raise RuntimeError(f"record {n}: every call failed")

        started = time.perf_counter()
        rows = await asyncio.gather(*(one(n) for n in range(records)))
        return time.perf_counter() - started, list(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--delay", type=float, default=0.05, help="the service's time per call, in seconds")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    workdir = tempfile.mkdtemp(prefix="headrace-enrich-bench-")
    service, url = start_service(args.delay)
    try:
        headrace_run(url, 100, workdir, "enrich_warm_up")  # starts the session and the Python workers
        client_seconds, client_rows = asyncio.run(client_calls(url, args.records))
        seconds, rows, dead = headrace_run(url, args.records, workdir, "enrich_bench")
    finally:
        service.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    expected = {n: {"id": n, **answer(n)} for n in range(args.records)}
    exact = {r["id"]: r for r in rows} == expected and len(rows) == args.records and not dead
    assert {r["id"]: r for r in client_rows} == expected
    print(f"enrich records={args.records} exact={'yes' if exact else 'no'} seconds={seconds:.2f} "
          f"client_seconds={client_seconds:.2f} ratio={client_seconds / seconds:.2f}")


if __name__ == "__main__":
    main()
