# ~115 s on one H200 (the W12 CUDA build, ~60 s, runs beside the sweep): the 27B-like single-request step's
# non-GEMM rest after the engine's launch cuts (issue 28). (1) engine_linear_probe's tree attention sweep at 8 then 1
# rows (the table's tile, then a coordinate descent; 20 s budget; the last sweep reached only 17 and 33 rows);
# (2) system_bench single for stock and W12 linears + head at 1,8,17,32,33 rows, side by side in one process;
# (3) system_kernel_probe of the W12 linears + head step at 8 rows (per kernel: what the step spends besides its
# GEMMs); (4) if under 100 s were used, (2) at 8 and 17 rows with SPECPILOT_PDL_WAVES=4 (fused ops of up to 4
# programs an SM launched with PDL: whether 8-17-row grids gain from it).
# CPU dry run: ENGINE_REST_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/engine_rest.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, it travels).
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
if [ "${ENGINE_REST_DRY:-0}" = 1 ]; then
    dev="--device cpu --smoke"; rows="1,5"; probe_rows="5"; ab_rows="5"
else
    dev=""; rows="1,8,17,32,33"; probe_rows="8"; ab_rows="8,17"
fi
rc=0
build=""
if [ "${ENGINE_REST_DRY:-0}" != 1 ]; then  # the W12 CUDA build overlaps the sweeps (torch's build lock)
    python3 -c "from specpilot_kernels.w12 import mma; mma.load_cuda_extension('specpilot_w12_mma', mma.CSRC, mma.SOURCES)" \
        >"$RESULTS/w12-build.log" 2>&1 &
    build=$!
fi
python3 benchmarks/engine_linear_probe.py $dev --sections attention --attention-rows 8,1 --budget-s 20 \
    --replays 10 --out "$RESULTS/engine-tiles-1-8-h200.json" >/dev/null 2>"$RESULTS/tiles.log" || rc=1
[ -z "$build" ] || wait "$build" || echo "W12 build failed: see w12-build.log" >&2
python3 benchmarks/system_bench.py $dev --sections single --rows "$rows" --single-options stock,w12_linears_head \
    --out "$RESULTS/system-single-rest-h200.json" >/dev/null 2>"$RESULTS/single.log" || rc=1
python3 benchmarks/system_kernel_probe.py $dev --rows "$probe_rows" --linears w12 --lm-head w12 --eager-steps 1 \
    --graph-steps 3 --out "$RESULTS/system-kernel-probe-w12-8rows-h200.json" >/dev/null 2>"$RESULTS/probe-w12.log" || rc=1
if [ "$SECONDS" -lt 100 ] || [ "${ENGINE_REST_DRY:-0}" = 1 ]; then
    SPECPILOT_PDL_WAVES=4 python3 benchmarks/system_bench.py $dev --sections single --rows "$ab_rows" \
        --single-options stock,w12_linears_head --out "$RESULTS/system-single-pdl4-h200.json" >/dev/null \
        2>"$RESULTS/single-pdl4.log" || rc=1
else
    echo "skipped the SPECPILOT_PDL_WAVES=4 run: ${SECONDS} s used" >&2
fi
python3 - "$RESULTS" <<'PY' || rc=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
tiles = out / "engine-tiles-1-8-h200.json"
if tiles.exists():
    doc = json.loads(tiles.read_text())
    att = doc.get("attention") or {}
    if "error" in att:
        print("attention sweep:", att["error"])
    else:
        for rows, e in att.items():
            print(f"attention {rows} rows:", {k: e.get(k) for k in ("folded_rows", "table", "best", "gain")})
probe = out / "system-kernel-probe-w12-8rows-h200.json"
if probe.exists():
    doc = json.loads(probe.read_text())
    for rows, e in doc["by_rows"].items():
        if "error" in e:
            print(f"w12 probe {rows} rows: {e['error']}")
            continue
        g = e["graph"]
        by = {}
        for k in g["by_kernel"]:
            name = k["name"]
            cls = "gemm" if name.startswith(("nvjet", "void w12::", "void cublasLt", "cutlass")) else name[:40]
            by[cls] = round(by.get(cls, 0.0) + k["us"], 1)
        print(f"w12 probe {rows} rows: graph {e.get('graph_step_ms')} ms, kernels {g['kernels_per_step']}, kernel us "
              f"{g['kernel_us_per_step']}, gaps us {e.get('graph_gaps_us_per_step')}")
        print("  us by kernel:", dict(sorted(by.items(), key=lambda kv: -kv[1])[:24]))
for name in ("system-single-rest-h200.json", "system-single-pdl4-h200.json"):
    path = out / name
    if not path.exists():
        continue
    single = json.loads(path.read_text()).get("single", {})
    print(name, single.get("error") or {k: single.get(k) for k in ("steps_ms", "stock_32_over_1",
          "stock_verify_1_row_frac_of_floor", "w12_linears_head_speedup_vs_stock", "errors")})
PY
exit $rc
