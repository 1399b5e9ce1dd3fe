#!/bin/bash
# Session 9 final call: the final tree's GPU tests (W12 mma/gemm, certified head, GDN tree kernels), then the certified
# head's benchmark (stages, every row count in interleaved ABBA rounds: the default, incumbents always and never, the
# compaction launch, the pass alone, the BF16 head) and 1,048,576 adversarial rows through the default path.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels:.
mkdir -p "$OUT/F"
{
date -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
T0=$(date +%s)
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_w12_mma.py tests/test_w12_gemm.py \
  tests/test_certified_head_exact_cuda.py tests/test_certified_head_cuda.py tests/test_certified_head_kernels.py \
  tests/test_gdn_tree_kernels.py 2>&1 | tail -4 || echo "TESTS FAILED rc=$?"
echo "tests (incl. builds) took $(( $(date +%s) - T0 )) s"
T1=$(date +%s)
timeout 220 python3 benchmarks/certified_head_bench.py --sections stages,variants,property_check \
  --repeats 7 --rows-checked 1048576 --out "$OUT/F/bench.json" > /dev/null || echo "BENCH rc=$?"
echo "bench took $(( $(date +%s) - T1 )) s"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$OUT/F/log"
