# ~6 min on one H200 (build ~1.5 min, multicast probe <= 1.5, bits ~0.5, --tune 120 s, timing with escapes and --settle ~1.5): W12 build, bits at 1-256 rows and every escape fraction, tune of every row range 17-256, timing vs cuBLAS (bursts, escapes, settled).
set -uo pipefail
export MAX_JOBS=$(nproc)
# The wide kernel's activation multicast is checked alone first, in a process of its own under a time limit: only a
# clean run lets the main run check and tune it (a fault or a hang there must not cost the rest).
# The build runs first and without a limit of its own (a build killed half way would leave its lock file behind).
python benchmarks/w12_device_check.py --sections build --out "$RESULTS/w12-build-h200.json"
multicast=
if timeout --signal=INT --kill-after=10 90 python benchmarks/w12_device_check.py --sections multicast \
        --out "$RESULTS/w12-multicast-probe-h200.json" \
   && python -c "import json, sys; d = json.load(open(sys.argv[1]))['multicast']; sys.exit(not d.get('all_ok'))" \
        "$RESULTS/w12-multicast-probe-h200.json"; then
    multicast=--multicast
fi
echo "multicast: ${multicast:-off}"
set -e
# W12_ARGS: e.g. "--shapes qkv,o_proj" or "--tune-budget 60"; the tuned mma_configs.json lands in $RESULTS to commit
python benchmarks/w12_device_check.py --out "$RESULTS/w12-device-check-h200.json" --settle 1.0 --tune $multicast \
    --tune-budget 120 --write-configs "$RESULTS/mma_configs.json" ${W12_ARGS:-}
