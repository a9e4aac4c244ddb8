#!/usr/bin/env bash
# Set up, then run the demo: the Yahoo Streaming Benchmark pipeline on generated ad events.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/headrace demo "$@"
