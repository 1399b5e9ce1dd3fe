# ~200 s on an H200: the batched figures to commit as current (issue 28's batched rows, issue 32's never-below-AR).
# 0. batched_attention_probe (one setting, ~15 s): the batched kernels' bits on the GPU (attention at 32 x 5 rows,
#    commit_kv_rows, row_topk: the drafter's top-8 a position that system_bench's tree drafts run).
# 1. system_bench batched,speedup: 4B-like and 8B-like at 1/8/16/32/64 requests: T_AR, stock (one static block
#    for the range: the stock of the claim; its default 16-chain; its best block per batch size), SpecPilot (the
#    budget planner's rows, AR among them; drafter block = the smallest reaching its trees' nodes).
# (batched_costs.sh: the engine-timed steps of issue 32's closed loop, 4B-like and 27B-like.)
# Needs .sglang_gdn (see system.sh). CPU dry run:
#   BATCHED_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/batched.sh
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
rc=0
if [ "${BATCHED_DRY:-0}" = 1 ]; then
    system_args="--device cpu --smoke"
    shapes="qwen3.5-4b-like"
    probe_args="--device cpu --smoke --shapes qwen3.5-4b-like:3:5"
else
    system_args="--batches 1,8,16,32,64 --iters 5"
    shapes="qwen3.5-4b-like llama-3.1-8b-like"
    probe_args="--shapes qwen3.5-4b-like:32:5"
fi
python3 benchmarks/batched_attention_probe.py $probe_args --out "$RESULTS/batched-kernels-check-h200.json" >/dev/null \
    || rc=1
# one process a shape, 4B-like first: a run cut short keeps the shape it finished
for shape in $shapes; do
    python3 benchmarks/system_bench.py --sections batched,speedup --batched-shapes "$shape" $system_args \
        --out "$RESULTS/system-batched-$shape-h200.json" >/dev/null || rc=1
done
python3 - "$RESULTS" <<'PY' || rc=1
import glob, json, sys
r = sys.argv[1]
check = json.load(open(f"{r}/batched-kernels-check-h200.json"))
print(check["headline"], check.get("row_topk"))
for f in sorted(glob.glob(f"{r}/system-batched-*-h200.json")):
    d = json.load(open(f))
    print(d.get("headline"))
    for shape, table in d["speedup"].get("batched", {}).items():
        for b, row in table.items():
            print(shape, b, "T_AR", row["T_AR_ms"], {k: row.get(k, {}).get("speedup_over_ar") for k in
                  ("stock_static", "stock", "stock_tuned", "specpilot")}, row.get("stock_static", {}).get("block"),
                  row.get("specpilot", {}).get("plan"))
    print("errors:", {k: v.get("errors") for k, v in d["batched"].items() if isinstance(v, dict)},
          d["speedup"].get("error"))
PY
exit $rc
