# ~150 s on one H200 (W12 build ~45 s; bits of the decoded-weight wide kernel in 5 partitions at 1-256 rows and every
# escape fraction against the 64-rows-a-launch path ~30 s; the five 27B-class shapes at 33-256 rows: cuBLAS, the
# committed configs and the decoded-weight candidates, each checked bit for bit before it is timed, ~60 s).
set -euo pipefail
export MAX_JOBS=$(nproc)
python benchmarks/w12_wide_check.py --out "$RESULTS/w12-wide-ss-h200.json" ${W12WIDE_ARGS:-}
