# ~5.5 min on one H200 (build ~0.5 min, bits ~0.5, --tune <= 90 s, timing with escapes and --settle ~1, wide-kernel breakdown probe: 6 builds and timings ~2.5): W12 build, bits at 1-256 rows and every escape fraction, tune of every row range 17-256, timing vs cuBLAS (bursts, escapes, settled), then where the wide kernel's time goes.
set -euo pipefail
export MAX_JOBS=$(nproc)
# W12_ARGS: e.g. "--shapes qkv,o_proj" or "--tune-budget 60"; the tuned mma_configs.json lands in $RESULTS to commit.
# (--multicast, which the first H200 tune found slower everywhere, is left out; the device check documents it.)
python benchmarks/w12_device_check.py --out "$RESULTS/w12-device-check-h200.json" --settle 1.0 --tune \
    --tune-budget 90 --write-configs "$RESULTS/mma_configs.json" ${W12_ARGS:-}
# the wide kernel with one part of its main loop taken out at a time (timing only; last, in its own process)
python benchmarks/probes/w12-wide-breakdown-h200-2026-12-02/harness.py --out "$RESULTS/w12-wide-breakdown-h200.json" \
    || echo "wide-kernel breakdown probe failed (rc=$?)"
