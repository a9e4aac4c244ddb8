"""The fast tier starts no Java process: with ``HEADRACE_TEST_NO_JVM=1`` (``scripts/test.sh --fast``)
``JAVA_HOME`` points at a ``java`` that refuses to start, for this process and every process a test
starts, so a test marked ``fast`` that needs a JVM fails, saying so, instead of slowing the tier down."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REFUSAL = "the fast tier starts no JVM: a test marked 'fast' started Java; mark it for a Spark tier instead"


def refuse_java() -> None:
    """Point ``JAVA_HOME`` at a ``java`` that prints :data:`REFUSAL` and exits 1."""
    home = Path(tempfile.mkdtemp(prefix="headrace-no-jvm-"))
    java = home / "bin" / "java"
    java.parent.mkdir()
    java.write_text(f"#!/bin/sh\necho \"{REFUSAL}\" >&2\nexit 1\n")
    java.chmod(0o755)
    os.environ["JAVA_HOME"] = str(home)


if os.environ.get("HEADRACE_TEST_NO_JVM") == "1":
    refuse_java()
