# <= 150 s on one H200 (the W12 build ~60-90 s unless built; then ~40 s; then what is left of 145 s): the 27B-like
# engine on this tree's tables at the verify rows of issue 28 (ROWS, default 8,17,24,32: each fused linear cuBLAS vs
# W12, and the stock vs W12 linears + LM head step, side by side in one process: scripts/device_stages/engine_rows.sh),
# then issue 29's five bench shapes at 1-32 rows against cuBLAS with escapes at 24 and 32 rows (w12_device_check
# timing only, no tune) in the time left.
# CPU dry run: W12SMALL2_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/w12small2.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, carry it).
set -uo pipefail
export MAX_JOBS=$(nproc)
mkdir -p "$RESULTS"
rc=0
if [ "${W12SMALL2_DRY:-0}" = 1 ]; then
    ENGINE_ROWS_DRY=1 bash scripts/device_stages/engine_rows.sh || rc=1
    exit $rc
fi
ROWS=${ROWS:-8,17,24,32} bash scripts/device_stages/engine_rows.sh || rc=1
left=$((145 - SECONDS))
if [ "$left" -gt 25 ]; then
    timeout "$left" python benchmarks/w12_device_check.py --out "$RESULTS/w12-small-bench-h200.json" --settle 0 \
        --sections timing --rows 1,2,4,8,16,17,24,32 --escape-rows 24,32 \
        --shapes "${SHAPES:-down,o_proj,qkv,lm_head,gate_up}" > "$RESULTS/w12small2.log" 2>&1 || rc=1
    python - "$RESULTS/w12-small-bench-h200.json" <<'PY' || rc=1
import json, sys
doc = json.load(open(sys.argv[1]))
print(doc.get("summary", {}).get("projections_1_32_geomean"), doc.get("summary", {}).get("escapes_1e-2_1_32_min_at"))
for name, shape in doc.get("shapes", {}).items():
    if "rows" in shape:
        print(name, " ".join(f"{r['M']}:{r['speedup']:.2f}x" for r in shape["rows"]))
        for fraction, rows in shape.get("escapes_w12_us", {}).items():
            print("  esc", fraction, rows)
PY
else
    echo "skipped the bench shapes: $left s left"
fi
exit $rc
