#!/usr/bin/env bash
# Installs everything, then runs the whole test suite (GPU tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 -m pytest -q -p no:cacheprovider "$@"
