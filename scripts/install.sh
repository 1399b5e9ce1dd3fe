#!/usr/bin/env bash
# Installs SpecPilot and what its tests need on a fresh machine (CPU, Python 3.11).
# torch comes first and pinned: a looser requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
