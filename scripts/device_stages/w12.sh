# ~5.5 min on one H200 (build ~1 min, bits ~0.5, --tune 120 s, timing with escapes and --settle ~1.5): W12 build, bits at 1-256 rows and every escape fraction, tune of every row range 17-256, timing vs cuBLAS (bursts, escapes, settled).
set -euo pipefail
export MAX_JOBS=$(nproc)
# W12_ARGS: e.g. "--shapes qkv,o_proj" or "--tune-budget 60"; the tuned mma_configs.json lands in $RESULTS to commit
python benchmarks/w12_device_check.py --out "$RESULTS/w12-device-check-h200.json" --settle 1.0 --tune \
    --tune-budget 120 --write-configs "$RESULTS/mma_configs.json" ${W12_ARGS:-}
