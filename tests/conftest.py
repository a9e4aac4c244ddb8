import os

import pytest

from headrace.connectors.base import redact_dsn
from headrace.environment.session import get_session

# The tests' Spark JVMs (this process's and every headrace run the tests start, which inherit it) compile with
# C1 only: a test's JVM runs for seconds to minutes, too short for C2's optimisations to pay back their compile
# time; it cuts the suite's CPU by a fifth. Benchmarks run without it: users get Spark's default JIT.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

# A test that stalls prints its stacks and fails; the fast tier refuses to start a JVM.
pytest_plugins = ["stall_watchdog", "no_jvm"]

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



def pytest_collection_modifyitems(items):
    """Docstring examples need no JVM (those that would are skipped in their text): the fast tier runs them."""
    for item in items:
        if isinstance(item, pytest.DoctestItem):
            item.add_marker(pytest.mark.fast)
