#!/usr/bin/env bash
# Set up, then run the checks and the tests. Two tiers:
#   bash scripts/test.sh          every check and every test (real Spark, real services): what CI runs
#   bash scripts/test.sh --fast   ruff, mypy, the import check and the tests marked `fast`: no JVM, no
#                                 service; minutes. It starts no Java process (tests/no_jvm.py refuses one).
# Arguments after the tier go to pytest (a file, -k EXPR, -x ...).
set -euo pipefail
cd "$(dirname "$0")/.."
tier=all
if [ "${1:-}" = "--fast" ]; then tier=fast; shift; fi

if [ "$tier" = fast ] && .venv/bin/python -c "import headrace, pyspark" 2>/dev/null; then
  : # an existing .venv: setting up again would start Java (its check and the class archive)
else
  bash scripts/setup.sh
fi
export PYSPARK_PYTHON="$PWD/.venv/bin/python"
echo "== ruff"; .venv/bin/ruff check headrace tests examples benchmarks scripts
echo "== mypy"; .venv/bin/mypy headrace
echo "== imports"; .venv/bin/python scripts/check_imports.py

if [ "$tier" = fast ]; then
  echo "== pytest (fast tier)"
  HEADRACE_TEST_NO_JVM=1 exec .venv/bin/python -m pytest -q -m fast -n 2 --durations=10 "$@"
fi

echo "== services"
if ! bash scripts/services.sh; then
  # The tests that need a missing service skip, saying why; with CI=true they fail.
  echo "some services are unavailable: their tests will skip${CI:+ (CI: they fail)}" >&2
fi
# Three test processes (pytest-xdist), each file's tests in one of them: the tests wait much of the
# time (JVMs starting, drivers killed and restarted, services), so three keep two cores busier than
# two do. HEADRACE_TEST_WORKERS=0 runs them in this process. No test is ever run again: a failure,
# or a stall (tests/stall_watchdog.py prints its stacks), fails the run.
workers=${HEADRACE_TEST_WORKERS:-3}
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
echo "== pytest"; .venv/bin/python -m pytest -q "${parallel[@]}" --durations=25 "$@"
shared_cases="$PWD/../shared/conformance/cases.json"
if [ -f "$shared_cases" ]; then
  echo "== conformance"; .venv/bin/python -m headrace.testing.conformance "$shared_cases" 2>/dev/null
fi
