#!/usr/bin/env bash
# Set up, then run every check: ruff, mypy, the import check and the test suite (real Spark, real services).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
echo "== ruff"; .venv/bin/ruff check headrace tests examples benchmarks scripts
echo "== mypy"; .venv/bin/mypy headrace
echo "== imports"; .venv/bin/python scripts/check_imports.py
echo "== services"
if ! bash scripts/services.sh; then
  # The tests that need a missing service skip, saying why; with CI=true they fail.
  echo "some services are unavailable: their tests will skip${CI:+ (CI: they fail)}" >&2
fi
# Three test processes (pytest-xdist), each file's tests in one of them: the tests wait much of the
# time (JVMs starting, drivers killed and restarted, services), so three keep two cores busier than
# two do (on this 2-core machine: 25 min of tests with three, 31 with two). HEADRACE_TEST_WORKERS=0
# runs them in this process.
workers=${HEADRACE_TEST_WORKERS:-3}
parallel=()
# A test whose process ends on a stall (tests/stall_watchdog.py) runs once more, in a fresh one.
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile --reruns 1 --only-rerun "crashed while running")
echo "== pytest"; .venv/bin/python -m pytest -q "${parallel[@]}" --durations=25 "$@"
shared_cases="$PWD/../shared/conformance/cases.json"
if [ -f "$shared_cases" ]; then
  echo "== conformance"; .venv/bin/python -m headrace.testing.conformance "$shared_cases" 2>/dev/null
fi
