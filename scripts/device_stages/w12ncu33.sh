# ~130 s on one H200 (W12 build unless already built; two ncu runs of one kernel launch each, ~30 s apiece): what sets
# the one-wave projections' 33-row time (attn_out 5120 x 6144: 34 us at 33 rows on the warpgroup kernel, 19 at 32 on
# the per-warp one; class blocks, one round instead of 1.21, were slower). Per launch: duration, waves and occupancy
# limits (LaunchStats, Occupancy), issue and stall reasons (SchedulerStats, WarpStateStats: long scoreboard on the
# weight loads, wgmma waits, mbarrier waits on the activation ring), DRAM/L2 throughput (SpeedOfLight, Memory).
set -euo pipefail
source scripts/device_stages/_common.sh
P=benchmarks/probes/w12-ncu-33-rows-2026-12-03
python $P/driver.py 33  # builds the extension outside ncu
for case in "33 w12_wgmma_kernel" "32 w12_shared_x_kernel" "8 w12_(mma|shared_x)_kernel"; do
  set -- $case
  timeout 60 ncu --kernel-name "regex:$2" --launch-skip 1 --launch-count 1 --section LaunchStats --section Occupancy \
    --section SchedulerStats --section WarpStateStats --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio" \
    python $P/driver.py "$1" > "$RESULTS/w12-ncu-$1rows.txt" 2>&1 || echo "ncu $1 rc $?"
  grep -i "duration\|waves per sm\|achieved occupancy\|theoretical occupancy\|block limit\|registers per\|eligible\|issued warp\|stalled_long\|stalled_wait\|stalled_barrier\|stalled_math\|stalled_short\|stalled_sleep\|stalled_membar\|dram throughput\|l2 cache throughput" \
    "$RESULTS/w12-ncu-$1rows.txt" | head -40
done
