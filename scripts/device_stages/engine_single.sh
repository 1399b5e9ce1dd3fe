# ~200 s on one H200 (Triton builds of the fused ops ~30 s; the W12 CUDA build ~60 s runs beside the probe): the
# 27B-like single-request step. (1) system_kernel_probe: each fused op vs its torch reference at 1, 8, 17, 33 rows
# (bf16) and the stock step per kernel at 1 and 32 rows, with the growth per kernel class (cuBLAS's GEMMs, SGLang's
# GDN kernel, the engine's fused ops) and stock's kept ratio (the 32-row step if only cuBLAS and SGLang's kernel
# grew) (~50 s); engine_linear_probe's linears: each fused linear alone, cuBLAS vs W12 at 1-33 rows, and the step's
# GEMMs summed per row count (~25 s); (2) system_bench check (the trained pair through every option set vs the
# engine's AR, bf16 and fp32, ~20 s) and single for stock, W12 linears + head and GDN path at 1,8,17,32,33,64 rows (~90 s).
# ENGINE_SINGLE_QUICK=1 (~90 s): only (2)'s single for stock and W12 linears + head at 1,8,17,32,33 rows, no check.
# CPU dry run: ENGINE_SINGLE_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/engine_single.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, it travels).
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
if [ "${ENGINE_SINGLE_DRY:-0}" = 1 ]; then
    dev="--device cpu --smoke"; rows="1,5"; probe_rows="1,5"
else
    dev=""; rows="1,8,17,32,33,64"; probe_rows="1,32"
fi
sections="check,single"; options="stock,w12_linears_head,gdn_path"
if [ "${ENGINE_SINGLE_QUICK:-0}" = 1 ]; then
    sections="single"; options="stock,w12_linears_head"
    [ "${ENGINE_SINGLE_DRY:-0}" = 1 ] || rows="1,8,17,32,33"
fi
rc=0
build=""
if [ "${ENGINE_SINGLE_DRY:-0}" != 1 ]; then  # the W12 CUDA build overlaps the probe (torch's build lock)
    python3 -c "from specpilot_kernels.w12 import mma; mma.load_cuda_extension('specpilot_w12_mma', mma.CSRC, mma.SOURCES)" \
        >"$RESULTS/w12-build.log" 2>&1 &
    build=$!
fi
if [ "${ENGINE_SINGLE_QUICK:-0}" != 1 ]; then
    python3 benchmarks/system_kernel_probe.py $dev --rows "$probe_rows" --eager-steps 1 --graph-steps 3 \
        --out "$RESULTS/system-kernel-probe-h200.json" >/dev/null 2>"$RESULTS/probe.log" || rc=1
fi
[ -z "$build" ] || wait "$build" || echo "W12 build failed: see w12-build.log" >&2
if [ "${ENGINE_SINGLE_QUICK:-0}" != 1 ]; then
    python3 benchmarks/engine_linear_probe.py $dev --sections linears --rows 1,8,17,32,33 --replays 10 \
        --out "$RESULTS/engine-linear-probe-h200.json" >/dev/null 2>"$RESULTS/linear-probe.log" || rc=1
fi
python3 benchmarks/system_bench.py $dev --sections "$sections" --rows "$rows" \
    --single-options "$options" --out "$RESULTS/system-single-h200.json" >/dev/null \
    2>"$RESULTS/system-single.log" || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
if (out / "system-kernel-probe-h200.json").exists():
    doc = json.loads((out / "system-kernel-probe-h200.json").read_text())
    print("kernel check:", doc.get("kernel_check"))
    for rows, e in doc["by_rows"].items():
        if "error" in e:
            print(f"  rows {rows}: {e['error']}")
            continue
        g = e["graph"]
        print(f"  rows {rows}: graph {e.get('graph_step_ms')} ms (floor frac {e.get('floor_fraction')}), kernels/step "
              f"{g['kernels_per_step']}, kernel us {g['kernel_us_per_step']}, gaps us {e.get('graph_gaps_us_per_step')}")
    print("growth:", doc.get("growth"))
if (out / "engine-linear-probe-h200.json").exists():
    doc = json.loads((out / "engine-linear-probe-h200.json").read_text())
    lin = doc.get("linears") or {}
    if "error" in lin:
        print("linears error:", lin["error"])
    else:
        tot = {}
        for name, e in lin.items():
            calls = {"head": 1, "attn_qkv": 16, "attn_out": 16}.get(name, 48 if name.startswith("gdn") else 64)
            for m, r in e["rows"].items():
                c, w = tot.get(m, (0.0, 0.0))
                tot[m] = (c + calls * r["cublas_us"], w + calls * r["w12_us"])
            print(name, e["N"], e["K"], {m: r["speedup"] for m, r in e["rows"].items()})
        print("GEMMs of a step, cuBLAS / W12 ms and ratio:",
              {m: (round(c / 1e3, 2), round(w / 1e3, 2), round(c / w, 3)) for m, (c, w) in tot.items()})
doc = json.loads((out / "system-single-h200.json").read_text())
single = doc.get("single", {})
print("single:", single.get("error") or {k: single.get(k) for k in ("T_AR_ms", "weight_floor_ms",
      "stock_verify_1_row_frac_of_floor", "stock_32_over_1", "w12_linears_head_speedup_vs_stock", "errors")})
print("steps:", single.get("steps_ms"))
check = doc.get("check", {})
print("check:", check.get("error") or {d: {k: (v.get("identical_requests"), v.get("requests")) for k, v in r.items()}
                                       for d, r in check.get("by_dtype", {}).items()})
PY
exit $rc
