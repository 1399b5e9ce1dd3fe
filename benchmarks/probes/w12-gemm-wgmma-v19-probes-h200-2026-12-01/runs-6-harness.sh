#!/bin/bash
cd "$(dirname "$0")/.."
export PYTHONPATH=kernels:.:benchmarks
timeout 200 python3 .gpu/ab19.py $OUT/ab19l.json gate_up,lm_head 32,64 2>&1 | grep -v -i warn | tail -5 | cut -c1-1500
timeout 100 python3 -m pytest -q -m gpu tests/test_w12_mma.py -p no:cacheprovider 2>&1 | tail -2
timeout 150 ncu --kernel-name regex:w12_wgmma_kernel --launch-skip 2 --launch-count 1 --section WarpStateStats \
  --section SchedulerStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio" \
  python3 .gpu/ncu19.py > $OUT/ncu19.txt 2>&1
echo ncu rc $?
grep -i "stalled\|stall\|warp cycles\|issued\|eligible\|active warps\|throughput\|registers\|achieved\|duration\|SM Frequency" $OUT/ncu19.txt | head -60
