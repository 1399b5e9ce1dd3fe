# ~100 s on one H200 (W12 CUDA build ~60 s when not cached, Triton builds ~20 s): why the composed step's W12 gain
# falls at 17-33 rows and where stock's step grows from 1 to 32 rows, at the 27B-like shape.
# (1) benchmarks/engine_linear_probe.py: every fused linear of the engine (gdn_in, gdn_out, attn_qkv, attn_out,
#     gate_up, down, head) alone, cuBLAS vs W12 at 1-33 rows (launches, tuned or default partition), and the tree
#     attention's split settings at 1/17/33 rows (~25 s);
# (2) benchmarks/system_kernel_probe.py --linears w12 --lm-head w12 at 17 and 32 rows: the W12 step per kernel
#     class in the captured graph (~40 s);
# (3) the same probe, stock, at the 4B-like shape with 32 requests: AR and the 16-chain (17 rows a request), where
#     the batched stock step's time goes after the launch cuts (~30 s).
# CPU dry run: STOCK28_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/stock28_probe.sh
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
if [ "${STOCK28_DRY:-0}" = 1 ]; then
    dev="--device cpu --smoke"; rows="1,5"; batch="--batch 2 --rows ar,3"
else
    dev=""; rows="17,32"; batch="--batch 32 --rows ar,17"
fi
rc=0
python3 benchmarks/engine_linear_probe.py $dev --out "$RESULTS/engine-linear-probe-h200.json" >/dev/null \
    2>"$RESULTS/engine-linear-probe.log" || rc=1
python3 benchmarks/system_kernel_probe.py $dev --rows "$rows" --linears w12 --lm-head w12 --eager-steps 1 \
    --graph-steps 3 --out "$RESULTS/system-kernel-probe-w12-h200.json" >/dev/null 2>"$RESULTS/probe-w12.log" || rc=1
python3 benchmarks/system_kernel_probe.py $dev --shape qwen3.5-4b-like $batch --eager-steps 1 --graph-steps 3 \
    --out "$RESULTS/system-kernel-probe-batched-h200.json" >/dev/null 2>"$RESULTS/probe-batched.log" || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
doc = json.loads((out / "engine-linear-probe-h200.json").read_text())
for name, e in (doc.get("linears") or {}).items():
    if name == "error":
        print("linears error:", e)
        continue
    print(name, e["N"], e["K"], "tuned" if e["tuned"] else "default",
          {m: (r["cublas_us"], r["w12_us"], r["speedup"], r["w12_launches"]) for m, r in e["rows"].items()})
for T, e in (doc.get("attention") or {}).items():
    print("attention", T, {k: v.get("us", v.get("error", "")[:60]) for k, v in e.items()})
for tag, name in (("w12", "system-kernel-probe-w12-h200.json"), ("batched", "system-kernel-probe-batched-h200.json")):
    doc = json.loads((out / name).read_text())
    for rows, e in doc["by_rows"].items():
        if "error" in e:
            print(f"{tag} rows {rows}: {e['error']}")
            continue
        g = e["graph"]
        print(f"{tag} rows {rows}: graph {e.get('graph_step_ms')} ms, kernels/step {g['kernels_per_step']}, "
              f"kernel us {g['kernel_us_per_step']}, gaps us {e.get('graph_gaps_us_per_step')}")
        print("    ", {p: v["us"] for p, v in g.get("by_part_apportioned", {}).items()})
        for k in g["by_kernel"][:14]:
            print(f"    {k['us']:9.1f} us {k['count']:7.1f}x  {k['name'][:90]}")
PY
exit $rc
