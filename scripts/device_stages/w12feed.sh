# ~110 s on one H200 (two builds side by side ~40 s; 4 shapes x 4 row counts x 9 wide-kernel feed settings + the
# no-ring build, each checked bit for bit against the library, ~70 s): benchmarks/probes/w12-wide-feed-h200-2026-12-02.
set -euo pipefail
export MAX_JOBS=$(nproc)
timeout 170 python benchmarks/probes/w12-wide-feed-h200-2026-12-02/harness.py --out "$RESULTS/w12-wide-feed-h200.json"
