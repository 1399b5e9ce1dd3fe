# ~100 s on one H200 (each fused kernel vs its torch reference at the 27B-like sizes, bf16, ~10 s; 27B-like synthetic weights on the GPU ~10 s; Triton builds of the fused ops and SGLang's GDN kernel
# ~30 s; per row count a capture, 40 timed steps and two profiled runs ~10 s): where the stock verify step's time goes,
# per kernel and per engine part (eager launches attributed by profiler ranges, graph replays apportioned by name),
# for the AR step and 1, 17, 33 rows at a 1,024-token context. ENGINE_PROBE_ARGS: e.g. "--rows 1,64 --linears w12".
# CPU dry run: RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 ENGINE_PROBE_ARGS="--device cpu --smoke" \
#     bash scripts/device_stages/engine_probe.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, it travels).
set -euo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
python3 benchmarks/system_kernel_probe.py --out "$RESULTS/system-kernel-probe-h200.json" ${ENGINE_PROBE_ARGS:-} >/dev/null
python3 - "$RESULTS/system-kernel-probe-h200.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
print("floor", doc["weight_floor_ms"], "ms; weights", doc["weights_s"], "s; total", doc["total_s"], "s")
print("kernel check (max abs error vs the torch references, bf16):", doc.get("kernel_check"))
for rows, e in doc["by_rows"].items():
    if "error" in e:
        print(f"rows {rows}: {e['error']}")
        continue
    g = e["graph"]
    print(f"rows {rows}: graph {e.get('graph_step_ms')} ms, eager {e.get('eager_step_ms')} ms, kernels/step "
          f"{g['kernels_per_step']}, kernel us {g['kernel_us_per_step']}, gaps us {e.get('graph_gaps_us_per_step')}")
    for part, v in g.get("by_part_apportioned", {}).items():
        print(f"    {part:16s} {v['launches']:8.1f} launches {v['us']:10.1f} us")
    for k in g["by_kernel"][:12]:
        print(f"    {k['us']:9.1f} us {k['count']:7.1f}x  {k['name'][:90]}")
PY
