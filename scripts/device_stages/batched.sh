# ~150 s on an H200: the batched figures to commit as current (issue 28's batched rows, issue 32's never-below-AR).
# 1. system_bench batched,speedup: 4B-like and 8B-like at 1/8/16/32/64 requests: T_AR, stock (one static block
#    for the range: the stock of the claim; its default 16-chain; its best block per batch size), SpecPilot (the
#    budget planner's rows, AR among them; drafter block = the smallest reaching its trees' nodes).
# (batched_costs.sh: the engine-timed steps of issue 32's closed loop, 4B-like and 27B-like.)
# Needs .sglang_gdn (see system.sh). CPU dry run:
#   BATCHED_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/batched.sh
set -uo pipefail
export MAX_JOBS=$(nproc)
test -f .sglang_gdn/sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py || {
    echo "missing .sglang_gdn: run python -m specpilot_mem.engine.sglang_kernels prepare .sglang_gdn first" >&2; exit 2; }
mkdir -p "$RESULTS"
rc=0
if [ "${BATCHED_DRY:-0}" = 1 ]; then
    system_args="--device cpu --smoke --batched-shapes qwen3.5-4b-like"
else
    system_args="--batches 1,8,16,32,64 --iters 5"
fi
python3 benchmarks/system_bench.py --sections batched,speedup $system_args --out "$RESULTS/system-batched-h200.json" \
    >/dev/null || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import json, sys
r = sys.argv[1]
d = json.load(open(f"{r}/system-batched-h200.json"))
print(d.get("headline"))
for shape, table in d["speedup"].get("batched", {}).items():
    for b, row in table.items():
        print(shape, b, "T_AR", row["T_AR_ms"], {k: row.get(k, {}).get("speedup_over_ar") for k in
              ("stock_static", "stock", "stock_tuned", "specpilot")}, row.get("stock_static", {}).get("block"),
              row.get("specpilot", {}).get("plan"))
print("errors:", {k: v.get("errors") for k, v in d["batched"].items() if isinstance(v, dict)}, d["speedup"].get("error"))
PY
exit $rc
