#!/usr/bin/env bash
# Create .venv with headrace and its development tools. Needs Python 3.11+ and Java 17+.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "headrace needs Python 3.11 or newer as '$python' (set PYTHON=/path/to/python3.11)" >&2
  exit 1
fi
java_bin=${JAVA_HOME:+$JAVA_HOME/bin/}java
if ! command -v "$java_bin" >/dev/null 2>&1 || ! "$java_bin" -version >/dev/null 2>&1; then
  echo "headrace needs Java 17 or newer for Spark and found none: install it (Debian/Ubuntu: apt-get install openjdk-17-jre-headless; macOS: brew install openjdk@17) or set JAVA_HOME" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
# PYTHONWARNINGS: the build backend's notes (setuptools' "Editable installation" warning) are not the user's business
PYTHONWARNINGS=ignore .venv/bin/python -m pip install --quiet -e ".[dev,kafka,redis,nats,mqtt,rabbitmq,ml,enrich]" 2>&1 \
  | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import headrace, pyspark" || { echo "headrace's installation into .venv failed" >&2; exit 1; }
# Spark's JVM starts about twice as fast from a class archive of this installation: write it now,
# once, so that the first runs start from it too (headrace/environment/class_archive.py).
PYSPARK_PYTHON="$PWD/.venv/bin/python" .venv/bin/python -m headrace.environment.build_class_archive
