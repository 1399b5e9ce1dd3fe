#!/usr/bin/env bash
# The main job on a fresh machine: install, build sglang-fork from the pinned SGLang 0.5.23 wheel (the
# deterministic stock commit the project's gitlink names, plus one branch per recorded entry), verify that
# every entry reproduces, apply all recorded entries onto stock as branch deploy/main-job, show the result.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
specpilot-mem init
specpilot-mem show stock
specpilot-mem graph
specpilot-mem verify
specpilot-mem apply --all --onto stock --branch deploy/main-job --force
git -C sglang-fork --no-pager diff --stat stock deploy/main-job
