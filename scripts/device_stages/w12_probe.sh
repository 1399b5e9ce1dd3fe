# ~110 s on one H200 (6 variant builds side by side ~50 s, weights and 6 x 15 timings plus cuBLAS and the library path
# ~50 s; cut at 145 s, the result file keeps every finished variant): where the wide W12 kernel's time goes at 33-256
# rows on qkv, o_proj and down (one part of its main loop taken out at a time), next to cuBLAS and the library's path.
set -euo pipefail
export MAX_JOBS=$(nproc)
timeout 145 python benchmarks/probes/w12-wide-breakdown-h200-2026-12-02/harness.py \
    --out "$RESULTS/w12-wide-breakdown-h200.json" || echo "wide-kernel breakdown probe stopped (rc=$?)"
