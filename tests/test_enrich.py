"""Enrich steps (docs/enrich.md): calls to a real local HTTP service (tests/enrich_service.py),
slowed and failing on purpose, checked against what the service answers for each record (its
``answer``) and against the calls it counted: every record enriched once, beside other sinks and
the dead letters, in input order; retries, timeouts, permanent failures, a cache, a plain
function; a SIGKILL in between; what is refused when the pipeline is built."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import headrace as hr
from headrace.connectors.files_sink import read_rows
from headrace.testing import TestSink, TestSource

pytest.importorskip("aiohttp", reason="the enrich extra: pip install -e '.[enrich]'")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from enrich_service import answer  # noqa: E402

HERE = Path(__file__).resolve().parent
FIELDS = {"risk": "double", "country": "string"}


def dead(n: int) -> str | None:
    """Why the service never answers record n (None: it does, after a retry or not)."""
    return {999: "4 calls failed; the last: ConnectionError: HTTP 503", 500: "call 1 failed for good: HTTP 400"}.get(
        n % 1000)


def calls_expected(n: int) -> int:
    """The calls a single pass makes for record n, from the service's rules."""
    if n % 1000 == 999:
        return 4
    if n % 1000 == 500:
        return 1
    return 2 if n % 10 == 3 or n % 1000 == 250 else 1


class Service:
    """tests/enrich_service.py in a process of its own."""

    def __init__(self, delay: float = 0.05) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen([sys.executable, str(HERE / "enrich_service.py"), str(self.port), str(delay)],
                                         stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None and self.process.stdout.readline().strip() == "listening"
        self.url = f"http://127.0.0.1:{self.port}/lookup"

    def calls(self) -> dict[int, int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/calls") as reply:
            return {int(k): v for k, v in json.load(reply).items()}

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def service():
    running = Service()
    yield running
    running.close()


def write_orders(folder: Path, ids: list[range]) -> None:
    folder.mkdir()
    for number, part in enumerate(ids):
        (folder / f"orders-{number}.jsonl").write_text("".join(json.dumps({"id": i, "amount": i / 4}) + "\n"
                                                               for i in part))


def test_ten_thousand_records_are_enriched_once_each_beside_another_sink_and_the_dead_letters(spark, tmp_path,
                                                                                              service):
    """10,000 records in two files, 10 % of them failing once, some timing out once (a 3 s answer
    against a 2 s timeout: a shorter one is also missed by answers slowed by a loaded machine,
    which then count a second call), some never answered: each record is written once with the
    service's answer or is a dead letter with the reason; a second sink of the same step sees the
    same records; the service was called as its rules say for a single pass (the two sinks and
    the dead letters share one round of calls); each file's records keep their order."""
    write_orders(tmp_path / "in", [range(0, 5000), range(5000, 10_000)])
    p = hr.Pipeline("enrich_many")
    enriched = (p.source("orders", hr.sources.Files(str(tmp_path / "in"), "jsonl", "id long, amount double",
                                                    bounded=True))
                .enrich(hr.HttpJson(service.url, send=["id"]), fields=FIELDS, concurrency=64, timeout=2,
                        retries=3, backoff=0.02, name="lookup"))
    enriched.sink("out", hr.sinks.Files(str(tmp_path / "out"), format="jsonl"))
    german = TestSink()
    enriched.filter(hr.col("country") == "DE").sink("german", german)
    p.dead_letters(enriched).sink("dead", hr.sinks.Files(str(tmp_path / "dead"), format="jsonl"))
    result = hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")

    out = read_rows(str(tmp_path / "out"), "jsonl")
    expected = {n: {"id": n, "amount": n / 4, **answer(n)} for n in range(10_000) if dead(n) is None}
    assert len(out) == len(expected) == 9980
    assert {r["id"]: r for r in out} == expected
    assert sorted(r["id"] for r in german.rows()) == sorted(n for n, r in expected.items() if r["country"] == "DE")
    letters = read_rows(str(tmp_path / "dead"), "jsonl")
    assert sorted(r["id"] for r in map(lambda d: json.loads(d["raw"]), letters)) == [
        n for n in range(10_000) if dead(n) is not None]
    for letter in letters:
        n = json.loads(letter["raw"])["id"]
        assert letter["source"] == "lookup" and letter["error"].startswith(dead(n)), letter
        assert re.fullmatch(r"batch 0, partition \d, record \d+", letter["position"]), letter
    # a batch run twice (a restart that replays it) calls the service twice for its records
    assert service.calls() == {n: calls_expected(n) for n in range(10_000)}, \
        f"restarts {result.restarts}, batches {[report.get('batchId') for report in result.progress]}"
    for first in (0, 5000):  # each file is a partition: its records come out in its order
        ids = [r["id"] for r in out if first <= r["id"] < first + 5000]
        assert ids == sorted(ids)


def test_a_record_whose_calls_all_fail_stops_a_pipeline_without_dead_letters_naming_step_and_record(spark,
                                                                                                    tmp_path):
    async def lookup(record: dict) -> dict:
        if record["id"] == 7:
            raise ValueError("no card 7")
        return {"risk": 0.5}

    p = hr.Pipeline("enrich_fails")
    (p.source("orders", TestSource([[{"id": i} for i in range(10)]], schema={"id": "long"}))
     .enrich(lookup, fields={"risk": "double"}, retries=1, backoff=0, name="lookup").sink("out", TestSink()))
    with pytest.raises(hr.HeadraceError, match=r"step 'lookup' \(test_enrich.py:\d+\): 2 calls failed; the last: "
                                               r"ValueError: no card 7 \(record: \{\"id\": 7\}\); send such records "
                                               r"to the dead letters with p.dead_letters"):
        hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")


def test_a_plain_function_runs_in_threads_in_order_and_a_cache_calls_each_key_once(spark, tmp_path, service):
    """A plain (blocking) function keeps the input's order; with cache_ttl and cache_key, records
    of the same key in a worker share one call (the service counts one per id)."""
    def grade(record: dict) -> dict:
        time.sleep(0.01)
        return {"grade": "high" if record["amount"] > 10 else "low"}

    rows = [{"id": i % 7, "amount": float(i)} for i in range(40)]
    p = hr.Pipeline("enrich_cached")
    graded = TestSink()
    source = p.source("orders", TestSource([rows], schema={"id": "long", "amount": "double"}))
    source.enrich(grade, fields={"grade": "string"}, concurrency=8, name="grade").sink("graded", graded)
    cached = TestSink()
    (source.enrich(hr.HttpJson(service.url, send=["id"]), fields=FIELDS, cache_ttl="10m", cache_key=["id"],
                   name="lookup").sink("cached", cached))
    hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")
    assert graded.rows() == [{**r, "grade": "high" if r["amount"] > 10 else "low"} for r in rows]
    assert sorted(cached.rows(), key=lambda r: r["amount"]) == [{**r, **answer(r["id"])} for r in rows]
    calls = service.calls()
    assert set(calls) == set(range(7)) and all(calls[n] == calls_expected(n) for n in range(7)), calls


def test_a_sigkill_of_the_driver_then_a_restart_writes_each_record_once(tmp_path):
    """Three files, a micro-batch each, the service slow (0.2 s a call): the driver's process
    group is killed while file 1's batch is being enriched; the restart enriches that batch
    again (its records are called again, as docs/enrich.md says) and every record is written
    once, with the service's answer, or is a dead letter once."""
    from driver_process import Driver, KilledRun
    from input_files import write_in_order

    service = Service(delay=0.2)
    try:
        folder = tmp_path / "in"
        folder.mkdir()
        files = [range(0, 200), range(1000, 1200), range(2000, 2200)]
        args = {"name": "enrich_killed", "input": str(folder), "url": service.url, "state_dir": str(tmp_path / "state"),
                "out": str(tmp_path / "out"), "dead": str(tmp_path / "dead")}
        run = KilledRun(HERE / "enrich_driver.py", args, tmp_path / "driver.log")
        write_in_order(folder / "part-0.jsonl", "".join(json.dumps({"id": i}) + "\n" for i in files[0]), 0)
        driver = Driver(HERE / "enrich_driver.py", args, tmp_path / "driver.log")
        try:
            driver.wait_for("file 0 enriched", lambda: run.committed() >= 1)
            write_in_order(folder / "part-1.jsonl", "".join(json.dumps({"id": i}) + "\n" for i in files[1]), 1)
            driver.wait_for("file 1's calls under way", lambda: any(n >= 1000 for n in service.calls()))
            time.sleep(0.3)
        finally:
            driver.kill()
        assert run.committed() == 1, "file 1's batch committed before the kill"
        write_in_order(folder / "part-2.jsonl", "".join(json.dumps({"id": i}) + "\n" for i in files[2]), 2)
        run.restart_until("every file enriched", lambda: run.committed() >= 3)
        every = [n for part in files for n in part]
        out = run.written()
        assert sorted(r["id"] for r in out) == [n for n in every if dead(n) is None]
        assert all(r["risk"] == answer(r["id"])["risk"] and r["country"] == answer(r["id"])["country"] for r in out)
        letters = read_rows(args["dead"], "jsonl")
        assert sorted(json.loads(d["raw"])["id"] for d in letters) == [n for n in every if dead(n) is not None]
        calls = service.calls()
        assert all(calls[n] == calls_expected(n) for part in (files[0], files[2]) for n in part)
        assert any(calls[n] > calls_expected(n) for n in files[1])  # the replayed batch called again
    finally:
        service.close()


def _stream(p: hr.Pipeline) -> hr.Stream:
    return p.source("orders", TestSource([[{"id": 1, "amount": 2.0}]], schema={"id": "long", "amount": "double"}))


async def _lookup(record: dict) -> dict:
    return {"risk": 0.5}


@pytest.mark.parametrize("build, message", [
    (lambda s: s.enrich("http://x", fields=FIELDS),
     r"enrich needs an async function, a function or hr.HttpJson\(...\) to call, got 'http://x'"),
    (lambda s: s.enrich(_lookup, fields=None), r"enrich needs fields=\{'name': 'type', ...\}"),
    (lambda s: s.enrich(_lookup, fields={"amount": "double"}),
     r"the stream already has a field 'amount', which the call would add"),
    (lambda s: s.enrich(_lookup, fields=FIELDS, concurrency=0),
     r"concurrency must be a whole number of calls at a time, 1 or more, got 0"),
    (lambda s: s.enrich(_lookup, fields=FIELDS, retries=-1), r"retries must be a whole number, 0 or more, got -1"),
    (lambda s: s.enrich(_lookup, fields=FIELDS, timeout=0), r"timeout must be more than 0 seconds, got 0"),
    (lambda s: s.enrich(_lookup, fields=FIELDS, cache_ttl="1m", cache_key=["card"]),
     r"cache_key names 'card', which the stream does not have \(it has amount, id\)"),
    (lambda s: s.enrich(_lookup, fields=FIELDS, cache_key=["id"]), r"cache_key= needs cache_ttl="),
    (lambda s: s.enrich(lambda r: {}, fields=FIELDS, concurrency=1000),
     r"a plain function runs in a thread per call in flight; concurrency=1000"),
    (lambda s: s.enrich(_lookup, fields=FIELDS, name="lookup").key_by("country").count(name="per_country"),
     r"step 'per_country' \(test_enrich.py:\d+\): this step reads the output of enrich step 'lookup' "
     r"\(test_enrich.py:\d+\); enrich steps run in each micro-batch after Spark's streaming query"),
])
@pytest.mark.fast
def test_an_enrich_step_that_cannot_run_is_refused_when_the_pipeline_is_built(build, message):
    p = hr.Pipeline("refused")
    with pytest.raises(hr.PlanError, match=message):
        build(_stream(p)).sink("out", TestSink())
        p.validate()


@pytest.mark.fast
def test_the_dead_letters_of_sources_and_of_enrich_steps_go_to_sinks_of_their_own(tmp_path):
    p = hr.Pipeline("mixed_dead_letters")
    orders = p.source("orders", hr.sources.Files(str(tmp_path), "jsonl", "id long"))
    enriched = orders.enrich(_lookup, fields={"risk": "double"}, name="lookup")
    with pytest.raises(hr.PlanError, match=r"the dead letters of enrich step 'lookup' and those of sources go to "
                                           r"sinks of their own"):
        p.dead_letters(orders, enriched)


def test_the_benchmark_checks_its_records_and_ends_with_its_ratio_line():
    """benchmarks/enrich.py on 300 records, 10 ms a call: every record enriched once (exact=yes)."""
    result = subprocess.run([sys.executable, str(HERE.parent / "benchmarks" / "enrich.py"), "--records", "300",
                             "--delay", "0.01"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.fullmatch(r"enrich records=300 exact=yes seconds=[\d.]+ client_seconds=[\d.]+ ratio=[\d.]+",
                        result.stdout.strip()), result.stdout
