#!/bin/bash
# Session 9: W12 with shared activations at 17-32 rows (qkv, o_proj, down): GPU tests, then the benchmark on the
# configs on file (no partition re-tune; the staged and shared-activation choices re-timed as the bench does).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels:.
mkdir -p "$OUT/W"
{
date -u
T0=$(date +%s)
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_w12_mma.py tests/test_w12_gemm.py 2>&1 | tail -4
echo "tests (incl. build) took $(( $(date +%s) - T0 )) s"
T1=$(date +%s)
timeout 230 python3 benchmarks/w12_gemm_bench.py --variants mma --tune none --shapes qkv,o_proj,gate_up,down,lm_head \
  --out "$OUT/W/bench.json" 2> "$OUT/W/bench.log" > /dev/null || echo "BENCH rc=$?"
echo "bench took $(( $(date +%s) - T1 )) s"
grep -a "summary" "$OUT/W/bench.log" | tail -1 | cut -c1-900
} 2>&1 | tee "$OUT/W/log"
