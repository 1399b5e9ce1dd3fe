# ~170 s on one H200 (W12 build ~45 s; bits of the decoded-weight wide kernel in 5 partitions at 1-256 rows and every
# escape fraction against the 64-rows-a-launch path ~30 s; the five 27B-class shapes at 33-256 rows: cuBLAS, the
# committed configs and the decoded-weight candidates, each checked bit for bit before it is timed, ~60 s; then, in a
# process of its own so a fault there costs nothing else, the two-MMA-warpgroup settings at 256 rows, ~30 s).
set -euo pipefail
export MAX_JOBS=$(nproc)
python benchmarks/w12_wide_check.py --out "$RESULTS/w12-wide-ss-h200.json" ${W12WIDE_ARGS:-}
python benchmarks/w12_wide_check.py --out "$RESULTS/w12-wide-ss-two-mma-h200.json" --sections bits,timing --two-mma \
    --budget 20 || echo "two-MMA-warpgroup run failed (see its JSON)"
