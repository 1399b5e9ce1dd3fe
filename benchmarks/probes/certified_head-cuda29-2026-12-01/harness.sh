#!/bin/bash
# Certified head with incumbents: GPU tests of the exact head, rescore and pass, then every row count in interleaved
# ABBA rounds (incumbents on = the default, off, the compaction launch, the pass alone, the BF16 head) and 1,048,576
# adversarial rows through the default path.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels:.
mkdir -p "$OUT/C"
{
date -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
T0=$(date +%s)
timeout 120 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_certified_head_exact_cuda.py \
  tests/test_certified_head_cuda.py || echo "TESTS FAILED rc=$?"
echo "tests (incl. build) took $(( $(date +%s) - T0 )) s"
timeout $(( ${BENCH_LIMIT:-400} )) python3 benchmarks/certified_head_bench.py --sections variants,property_check \
  --repeats ${REPEATS:-7} --rows-checked ${ROWS_CHECKED:-1048576} --out "$OUT/C/bench.json" > /dev/null \
  || echo "BENCH rc=$?"
echo "all done at $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$OUT/C/log"
