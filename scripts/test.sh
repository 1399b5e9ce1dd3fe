#!/usr/bin/env bash
# What CI runs (.ci/run calls this): install, lint, then the whole test suite (GPU tests skip without a GPU).
# The tests include the results index check and the README's limits (tests/test_results_index.py).
# Extra arguments go to pytest (e.g. `bash scripts/test.sh tests/test_browse.py -x`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

python3 -m ruff check .

python3 -m ruff format --check .

exec python3 -m pytest -q -p no:cacheprovider "$@"
