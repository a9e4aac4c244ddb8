import os

import pytest

from headrace.connectors.base import redact_dsn
from headrace.environment.session import get_session

pytest_plugins = ["stall_watchdog"]  # a test that stalls prints its stacks and is run once more

PG_DSN = os.environ.get("HEADRACE_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def spark():
    """One Spark session for the whole test run."""
    return get_session("local[2]")


def service_or_skip(name: str, reachable: bool, why: str) -> None:
    """In CI a missing service fails the test; elsewhere it is skipped with the reason."""
    if reachable:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{name} is needed in CI and cannot be reached: {why}")
    pytest.skip(f"{name} not reachable: {why}")


@pytest.fixture(scope="module")
def pg():
    """A connection to the test database, or a skip (a failure in CI) saying why there is none."""
    psycopg = pytest.importorskip("psycopg")
    try:
        conn = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        service_or_skip("PostgreSQL", False, f"{redact_dsn(PG_DSN)}: {exc}")
    yield conn
    conn.close()


def pytest_addoption(parser):
    parser.addoption("--fuzz-examples", type=int, default=None,
                     help="examples of the differential test (tests/test_differential.py) to run; CI runs a few")


# The files that keep a test process busy longest (seconds of one process, measured with
# --junitxml), handed out first: pytest-xdist's --dist loadfile gives each process whole files
# in collection order, and long files at the end would leave one process working alone.
LONGEST_FIRST = ("test_examples.py", "test_conformance.py", "test_signals.py", "test_sink_matrix.py",
                 "test_multi_stage.py", "test_topology.py", "test_sink_faults.py", "test_operators.py",
                 "test_operator_api.py", "test_delta.py", "test_kafka_replication.py", "test_cluster.py",
                 "test_chaos.py", "test_benchmark_smoke.py", "test_sql.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file's order is kept
