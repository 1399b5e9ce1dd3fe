# ~90 s on one H200 (the W12 CUDA build ~60 s unless built; then ~30 s): the 27B-like engine across the verify row
# range of issues 28/29 on the committed tables. (1) engine_linear_probe: each fused linear, cuBLAS BF16 vs W12, at
# ROWS; (2) system_bench single: stock vs W12 linears + head steps at the same rows, side by side in one process.
# CPU dry run: ENGINE_ROWS_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/engine_rows.sh
# Needs .sglang_gdn (python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn; untracked, carry it).
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
if [ "${ENGINE_ROWS_DRY:-0}" = 1 ]; then
    dev="--device cpu --smoke"; rows="1,5"
else
    dev=""; rows=${ROWS:-1,8,17,24,32,33,48,64}
fi
rc=0
python3 benchmarks/engine_linear_probe.py $dev --sections linears --rows "$rows" --replays 10 \
    --out "$RESULTS/engine-linear-probe-h200.json" >/dev/null 2>"$RESULTS/linears.log" || rc=1
python3 benchmarks/system_bench.py $dev --sections single --rows "$rows" --single-options stock,w12_linears_head \
    --out "$RESULTS/system-single-rows-h200.json" >/dev/null 2>"$RESULTS/single.log" || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
probe = out / "engine-linear-probe-h200.json"
if probe.exists():
    for name, e in json.loads(probe.read_text()).get("linears", {}).items():
        print(name, e["N"], e["K"], " ".join(f"{r}:{x['cublas_us']:.1f}/{x['w12_us']:.1f}" for r, x in e["rows"].items()))
single = out / "system-single-rows-h200.json"
if single.exists():
    s = json.loads(single.read_text()).get("single", {})
    print(s.get("error") or {k: s.get(k) for k in ("steps_ms", "w12_linears_head_speedup_vs_stock", "errors")})
PY
exit $rc
