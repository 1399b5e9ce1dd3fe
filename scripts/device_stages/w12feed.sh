# ~120 s on one H200 (three builds side by side ~40 s; 4 shapes x 4 row counts x 15 wide-kernel feed settings, each
# checked bit for bit against the library, + 3 settings of the no-ring and no-feed builds, ~80 s):
# benchmarks/probes/w12-wide-feed-h200-2026-12-02.
set -euo pipefail
export MAX_JOBS=$(nproc)
timeout 200 python benchmarks/probes/w12-wide-feed-h200-2026-12-02/harness.py --out "$RESULTS/w12-wide-feed-h200.json"
