#!/bin/bash
# Engineer B, certified head, FINAL call (<= 120 s): the code to commit (6724e15 + the cooperative compacting rescore
# and half weight rows above 16 rows, uncommitted until this run), GPU tests of the exact head and
# rescore, then the benchmark's variants (every row count: the certified call, the same with the compaction launch,
# the INT8 pass alone, the BF16 head, interleaved ABBA rounds) and 1,048,576 adversarial rows through the default path.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels:.
mkdir -p "$OUT/B"
{
date -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
T0=$(date +%s)
timeout 50 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_certified_head_exact_cuda.py \
  "tests/test_certified_head_cuda.py::test_cuda_prologue_matches_its_reference" \
  "tests/test_certified_head_cuda.py::test_cuda_pass_keeps_the_exact_argmax_on_adversarial_rows" \
  || echo "TESTS FAILED rc=$?"
echo "tests (incl. build) took $(( $(date +%s) - T0 )) s"
timeout $(( 115 - ($(date +%s) - T0) )) python3 benchmarks/certified_head_bench.py --sections variants,property_check \
  --repeats 5 --rows-checked 1048576 --out "$OUT/B/bench.json" > /dev/null \
  || echo "BENCH rc=$?"
echo "all done at $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$OUT/B/log"
