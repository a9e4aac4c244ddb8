import os

import pytest

from headrace.runtime.session import get_session


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
