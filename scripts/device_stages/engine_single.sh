# ~200 s on one H200 (Triton builds of the fused ops ~30 s; W12 / certified-head CUDA builds up to ~60 s when not cached):
# the 27B-like single-request step after the launch cuts. (1) engine_probe's kernel check and per-kernel profile at
# AR, 1, 17, 33 rows (~40 s); (2) the same at 1 and 33 rows with SPECPILOT_PDL=0 (the fused ops launched without
# programmatic dependent launch, ~15 s); (3) system_bench check (the trained pair through every option set vs the
# engine's AR, bf16 and fp32, ~20 s) and single for stock, W12 linears + head and GDN path at 1,8,17,32,33,64 rows (~80 s).
# ENGINE_SINGLE_QUICK=1 (~100 s): only (1) at 1,17,33 rows and (3)'s single for stock and W12 linears + head at
# 1,8,17,32,33 rows, no check.
# CPU dry run: ENGINE_SINGLE_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/engine_single.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, it travels).
set -uo pipefail
export MAX_JOBS=$(nproc)
test -f .sglang_gdn/sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py || {
    echo "missing .sglang_gdn: run python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn first" >&2; exit 2; }
mkdir -p "$RESULTS"
if [ "${ENGINE_SINGLE_DRY:-0}" = 1 ]; then
    dev="--device cpu --smoke"; rows="1,5"
else
    dev=""; rows="1,8,17,32,33,64"
fi
probe_rows="ar,1,17,33"; sections="check,single"; options="stock,w12_linears_head,gdn_path"
if [ "${ENGINE_SINGLE_QUICK:-0}" = 1 ]; then
    probe_rows="1,17,33"; sections="single"; options="stock,w12_linears_head"
    [ "${ENGINE_SINGLE_DRY:-0}" = 1 ] || rows="1,8,17,32,33"
fi
rc=0
python3 benchmarks/system_kernel_probe.py $dev --rows "$probe_rows" --out "$RESULTS/system-kernel-probe-h200.json" \
    >/dev/null 2>"$RESULTS/probe.log" || rc=1
if [ "${ENGINE_SINGLE_QUICK:-0}" != 1 ]; then
    SPECPILOT_PDL=0 python3 benchmarks/system_kernel_probe.py $dev --rows 1,33 \
        --out "$RESULTS/system-kernel-probe-nopdl-h200.json" >/dev/null 2>"$RESULTS/probe-nopdl.log" || rc=1
fi
python3 benchmarks/system_bench.py $dev --sections "$sections" --rows "$rows" \
    --single-options "$options" --out "$RESULTS/system-single-h200.json" >/dev/null \
    2>"$RESULTS/system-single.log" || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("system-kernel-probe-h200.json", "system-kernel-probe-nopdl-h200.json"):
    if not (out / name).exists():
        continue
    doc = json.loads((out / name).read_text())
    print(name, "kernel check:", doc.get("kernel_check"))
    for rows, e in doc["by_rows"].items():
        if "error" in e:
            print(f"  rows {rows}: {e['error']}")
            continue
        g = e["graph"]
        print(f"  rows {rows}: graph {e.get('graph_step_ms')} ms (floor frac {e.get('floor_fraction')}), kernels/step "
              f"{g['kernels_per_step']}, kernel us {g['kernel_us_per_step']}, gaps us {e.get('graph_gaps_us_per_step')}")
        print("    ", {p: v["us"] for p, v in g.get("by_part_apportioned", {}).items()})
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
