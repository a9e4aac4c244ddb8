"""Set-up errors a user can meet before Spark starts: each is one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headrace.environment import session
from headrace.errors import SetupError

pytestmark = pytest.mark.fast  # needs no JVM and no service

ROOT = Path(__file__).resolve().parents[1]


def test_missing_java_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-java"))
    with pytest.raises(SetupError) as error:
        session.check_java()
    message = str(error.value)
    assert "\n" not in message
    assert "Java 17" in message and "apt-get install openjdk-17-jre-headless" in message


def test_setup_script_says_java_is_missing(tmp_path):
    """scripts/setup.sh on a machine with Python but no Java stops with one line, before any install."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "env"):
        found = subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True, env=env,
                            timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs Java 17" in lines[0] and "openjdk-17" in lines[0]


def test_spark_defaults_follow_the_settings(monkeypatch):
    monkeypatch.setenv("HEADRACE_SPARK_UI", "1")
    defaults = session.spark_defaults("local[2]")
    assert defaults["spark.ui.enabled"] == "true"
    assert defaults["spark.sql.streaming.stateStore.providerClass"].endswith("RocksDBStateStoreProvider")
    assert defaults["spark.sql.shuffle.partitions"] == str(os.cpu_count() or 2)
