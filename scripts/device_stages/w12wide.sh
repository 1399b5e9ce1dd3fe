# ~3 min on one H200: the decoded-weight wide kernel's check (build; bits in 5 partitions at 1-256 rows and every
# escape fraction against the 64-rows-a-launch path; the five 27B-class shapes at 33-256 rows: cuBLAS, the committed
# configs and the decoded-weight candidates, each bit-checked first), the two-MMA-warpgroup settings in a process of
# their own (a fault there costs nothing else), then the committed configs with each winning setting (--pick) written
# into this tree and the full device check (bits, 1-256 rows against cuBLAS, escapes, settled) run with them.
set -euo pipefail
source scripts/device_stages/_common.sh
python benchmarks/w12_wide_check.py --out "$RESULTS/w12-wide-ss-h200.json" ${W12WIDE_ARGS:-}
python benchmarks/w12_wide_check.py --out "$RESULTS/w12-wide-ss-two-mma-h200.json" --sections bits,timing --two-mma \
    --budget 20 || echo "two-MMA-warpgroup run failed (see its JSON)"
picked=("$RESULTS/w12-wide-ss-h200.json")
[ -s "$RESULTS/w12-wide-ss-two-mma-h200.json" ] && picked+=("$RESULTS/w12-wide-ss-two-mma-h200.json")
python benchmarks/w12_wide_check.py --pick "${picked[@]}" --out "$RESULTS/mma_configs.json"
cp "$RESULTS/mma_configs.json" kernels/specpilot_kernels/w12/mma_configs.json
python benchmarks/w12_device_check.py --out "$RESULTS/w12-device-check-h200.json" --settle 0.5 --sections bits,timing
