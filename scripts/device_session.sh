#!/usr/bin/env bash
# One call on the lent GPU machine: run the named stages in order, each under its own time limit, keep every
# stage's log and result files under $OUT (one tarball, so the file limit of the transfer never drops one).
#
#   SPECPILOT_GIT_COMMIT=<sha> SPECPILOT_GIT_DIRTY=0|1 bash scripts/device_session.sh STAGE:SECONDS ...
#
# A stage is a file scripts/device_stages/STAGE.sh, run with PYTHONPATH=kernels:. and RESULTS=$OUT/results;
# a failing or timed-out stage is recorded in summary.txt and the next stage still runs.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device-out}
RESULTS=$OUT/results
mkdir -p "$RESULTS"
export RESULTS PYTHONPATH=kernels:. PYTHONUNBUFFERED=1
export SPECPILOT_GIT_COMMIT=${SPECPILOT_GIT_COMMIT:-unknown} SPECPILOT_GIT_DIRTY=${SPECPILOT_GIT_DIRTY:-unknown}
summary=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader || true; } >"$summary"
for spec in "$@"; do
    stage=${spec%%:*}
    limit=${spec#*:}
    [ "$limit" = "$spec" ] && limit=300
    start=$(date +%s)
    timeout --signal=INT --kill-after=15 "$limit" bash "scripts/device_stages/$stage.sh" >"$RESULTS/$stage.log" 2>&1
    rc=$?
    echo "$stage rc=$rc $(( $(date +%s) - start ))s" | tee -a "$summary"
    tail -n 8 "$RESULTS/$stage.log"
done
tar -czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$RESULTS"
cat "$summary"
