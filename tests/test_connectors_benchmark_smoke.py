"""``benchmarks/connectors.py --quick`` runs end to end for each source whose service is up and ends
with its closing line ``<name> ratio=<x>``.

This checks that the benchmark works, not the figures: on 2,000 records and a shared machine they
mean little (docs/performance.md has the real ones). A source whose service cannot be had is
skipped saying why (a failure in CI).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from conftest import service_or_skip
from test_benchmark_smoke import load_benchmark


@pytest.fixture(scope="module")
def benchmark() -> Any:
    return load_benchmark("connectors")


@pytest.mark.parametrize("name", ["redis", "postgres-cdc", "mqtt", "nats", "rabbitmq", "files", "files-bounded"])
def test_the_quick_benchmark_ends_with_the_closing_line(spark: Any, capsys: Any, benchmark: Any, name: str) -> None:
    bench = benchmark.BENCHES[name](records=2_000, workdir="")
    why = bench.unavailable()  # starts the service with its script when it is not running
    service_or_skip(name, why is None, why or "")
    assert benchmark.main(["--quick", "--only", name]) == 0  # on the `spark` fixture's session
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(rf"{re.escape(name)} ratio=\d+\.\d\d", lines[-1]), lines[-1]
    assert any(re.match(r"\s+headrace\s+median\s+[\d,]+ records/s", line) for line in lines), lines
    assert any(re.match(r"\s+client\s+median\s+[\d,]+ records/s", line) for line in lines), lines
