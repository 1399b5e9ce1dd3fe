# <= 120 s on one H200: the fused ops' launch tiles at the 27B-like single-request step's row counts, then the step.
# (1) benchmarks/engine_linear_probe.py --sections fused: conv, gated norm, silu*up and q/k norm + RoPE at 1, 8, 17,
#     32, 33 rows, each candidate row tile vs the table's (FUSED_TILES) bit for bit and in µs, the table's max abs error
#     vs the torch reference (bf16) (<= 15 s of timing); --sections attention: tree attention's tile (ATTENTION_TILES)
#     at 17, 33, 8, 1 rows and a coordinate descent from it (<= 28 s of timing, Triton builds included;
#     the W12 CUDA build runs beside them);
# (2) system_bench single for stock and W12 linears + head at 1, 8, 17, 32, 33 rows (the QUICK single, ~60 s).
# CPU dry run: ENGINE_TILES_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/engine_tiles.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, it travels).
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
if [ "${ENGINE_TILES_DRY:-0}" = 1 ]; then
    dev="--device cpu --smoke"; rows="1,5"
else
    dev=""; rows="1,8,17,32,33"
fi
rc=0
build=""
if [ "${ENGINE_TILES_DRY:-0}" != 1 ]; then  # the W12 CUDA build (~60 s of CPU) overlaps the sweeps; torch's lock
    python3 -c "from specpilot_kernels.w12 import mma; mma.load_cuda_extension('specpilot_w12_mma', mma.CSRC, mma.SOURCES)" \
        >"$RESULTS/w12-build.log" 2>&1 &
    build=$!
fi
python3 benchmarks/engine_linear_probe.py $dev --sections fused --attention-rows 17,33,1,8,32 --budget-s 15 \
    --out "$RESULTS/engine-fused-tiles-h200.json" >/dev/null 2>"$RESULTS/fused-tiles.log" || rc=1
python3 benchmarks/engine_linear_probe.py $dev --sections attention --attention-rows 17,33,1,8 --budget-s 28 \
    --out "$RESULTS/engine-attention-tiles-h200.json" >/dev/null 2>"$RESULTS/attention-tiles.log" || rc=1
[ -z "$build" ] || wait "$build" || echo "W12 build failed: see w12-build.log" >&2
python3 benchmarks/system_bench.py $dev --sections single --rows "$rows" --single-options stock,w12_linears_head \
    --out "$RESULTS/system-single-h200.json" >/dev/null 2>"$RESULTS/system-single.log" || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
doc = json.loads((out / "engine-fused-tiles-h200.json").read_text())
for T, e in (doc.get("fused") or {}).items():
    if T == "error":
        print("fused error:", e)
        continue
    print(f"fused T={T}:", {op: (r["table"], r["table_us"], r["best"], r["best_us"], r["all_bits_equal"],
                              r["max_abs_err_vs_reference"]) for op, r in e.items()})
doc = json.loads((out / "engine-attention-tiles-h200.json").read_text())
for T, e in (doc.get("attention") or {}).items():
    if T == "error":
        print("attention error:", e)
        continue
    print(f"attention T={T}: table {e['table']} best {e['best']} gain {e['gain']}")
doc = json.loads((out / "system-single-h200.json").read_text())
single = doc.get("single", {})
print("single:", single.get("error") or {k: single.get(k) for k in ("T_AR_ms", "weight_floor_ms",
      "stock_verify_1_row_frac_of_floor", "stock_32_over_1", "w12_linears_head_speedup_vs_stock", "errors")})
print("steps:", single.get("steps_ms"))
PY
exit $rc
