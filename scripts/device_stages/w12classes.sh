# <= 145 s on one H200 (W12 build ~60-100 s, shared with the other stages of the call; bits of 7 class-block partitions
# at 17-64 rows and escape fractions 0, 1e-3, 1e-2 ~10 s; the five one-wave 27B-class shapes at 17-64 rows: cuBLAS, the
# committed config, class blocks of 1 and 2 warpgroups at 17-32 and at 33-64 rows ~25 s): the warpgroup kernel's class
# blocks (benchmarks/w12_class_blocks_check.py) against the current kernel and cuBLAS side by side.
set -euo pipefail
export MAX_JOBS=$(nproc)
timeout 145 python benchmarks/w12_class_blocks_check.py --out "$RESULTS/w12-class-blocks-h200.json"
