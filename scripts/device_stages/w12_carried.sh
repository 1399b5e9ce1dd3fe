# ~175 s on one H200 (W12 build ~40 s, bits of the carried settings ~25 s, timing <= 100 s by --budget; cut at 195 s,
# the result file keeps every finished shape): the wide W12 kernel with its weights carried in the activation slots
# (0 or 1 weight stages) at 33-256 rows on qkv, o_proj, down, gate_up and, if the budget allows, lm_head: each row
# range's settings beside cuBLAS and the library's current path.
set -euo pipefail
export MAX_JOBS=$(nproc)
timeout 195 python benchmarks/probes/w12-wide-carried-h200-2026-12-02/harness.py \
    --out "$RESULTS/w12-wide-carried-h200.json" --budget 100 ${W12_CARRIED_ARGS:-} \
    || echo "carried-weights probe stopped (rc=$?)"
