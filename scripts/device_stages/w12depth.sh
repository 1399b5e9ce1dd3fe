# ~50 s on one H200 (two builds side by side ~30 s; 4 shapes x 3 row counts x 6 wide-kernel settings in two builds,
# each checked bit for bit against the library, ~20 s): benchmarks/probes/w12-wide-depth-h200-2026-12-02.
set -euo pipefail
source scripts/device_stages/_common.sh
timeout 150 python benchmarks/probes/w12-wide-depth-h200-2026-12-02/harness.py --out "$RESULTS/w12-wide-depth-h200.json"
