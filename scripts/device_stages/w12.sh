# ~3 min on one H200 (build ~0.5 min, bits ~0.5, --tune <= 90 s, timing with escapes and --settle ~1): W12 build, bits at 1-256 rows and every escape fraction, tune of every row range 17-256, timing vs cuBLAS (bursts, escapes, settled). (The wide kernel's breakdown probe ran once: w12-wide-breakdown-h200-2026-12-02.json.)
set -euo pipefail
source scripts/device_stages/_common.sh
# W12_ARGS: e.g. "--shapes qkv,o_proj" or "--tune-budget 60"; the tuned mma_configs.json lands in $RESULTS to commit.
# (--multicast, which the first H200 tune found slower everywhere, is left out; the device check documents it.)
python benchmarks/w12_device_check.py --out "$RESULTS/w12-device-check-h200.json" --settle 1.0 --tune \
    --tune-budget 90 --write-configs "$RESULTS/mma_configs.json" ${W12_ARGS:-}
