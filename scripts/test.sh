#!/usr/bin/env bash
# Set up, then run every check: ruff, mypy and the test suite (real Spark, real services).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
echo "== ruff"; .venv/bin/ruff check headrace tests examples benchmarks
echo "== mypy"; .venv/bin/mypy headrace
echo "== pytest"; .venv/bin/python -m pytest -q "$@"
