# ~100 s on an H200: where the batched step's time goes after the batched attention kernel and the one-launch
# KV move, and the batched speedup table at 8-64 requests (4B-like).
# 1. batched_attention_probe: batched_ops.batched_tree_attention vs fused_ops.tree_attention, 4B-like and 8B-like
#    attention at 1-64 requests x 1 and 17 rows, bits against the torch reference (bf16) and time per call.
# 2. system_kernel_probe: the 4B-like stock step per kernel at 8 and 32 requests (AR, 17-row chains), and
#    SpecPilot's (path verify, trees: the commit's KV move) at 32 requests x 5 rows.
# 3. system_bench batched,speedup: 4B-like at 8/32/64 requests, AR / stock (16-chain, best block per batch, one
#    static block for the range) / SpecPilot (the planner's rows, AR among them).
# Needs .sglang_gdn (see system.sh). CPU dry run:
#   BATCHED_DRY=1 RESULTS=/tmp/r PYTHONPATH=kernels:. TRITON_INTERPRET=1 bash scripts/device_stages/batched_attn.sh
set -uo pipefail
source scripts/device_stages/_common.sh
need_sglang_gdn
mkdir -p "$RESULTS"
rc=0
if [ "${BATCHED_DRY:-0}" = 1 ]; then
    dev="--device cpu --smoke"
    attn_args="--shapes qwen3.5-4b-like:1,3:1,5"
    probe_args="--eager-steps 1 --graph-steps 1 --time-steps 1"
    batches="1,3"
    small=2 large=3
else
    dev=""
    attn_args="--shapes qwen3.5-4b-like:1,8,32,64:1,17;llama-3.1-8b-like:32:1,17"
    probe_args="--eager-steps 1 --graph-steps 3 --time-steps 10"
    batches="8,32,64"
    small=8 large=32
fi
python3 benchmarks/batched_attention_probe.py $dev $attn_args --out "$RESULTS/batched-attention-probe-h200.json" \
    >/dev/null || rc=1
for spec in "$small ar,17 chain snapshot" "$large ar,17 chain snapshot" "$large 5 best-first path"; do
    set -- $spec
    python3 benchmarks/system_kernel_probe.py $dev --shape qwen3.5-4b-like --batch "$1" --rows "$2" --tree "$3" \
        --gdn-verify "$4" $probe_args --out "$RESULTS/system-kernel-probe-batched-b$1-$3-h200.json" >/dev/null || rc=1
done
python3 benchmarks/system_bench.py $dev --sections batched,speedup --batched-shapes qwen3.5-4b-like \
    --batches "$batches" --iters 5 --out "$RESULTS/system-batched-h200.json" >/dev/null || rc=1
python3 - "$RESULTS" <<'PY' || rc=1
import glob, json, sys
r = sys.argv[1]
print(json.load(open(f"{r}/batched-attention-probe-h200.json"))["headline"])
for f in sorted(glob.glob(f"{r}/system-kernel-probe-batched-*.json")):
    d = json.load(open(f))
    for rows, e in d["by_rows"].items():
        top = [(k["name"][:40], k["us"]) for k in e.get("graph", {}).get("by_kernel", [])[:6]]
        print(f.split("/")[-1], "B", d["batch"], rows, e.get("graph_step_ms"), e.get("error"), top)
d = json.load(open(f"{r}/system-batched-h200.json"))
print(d.get("headline"))
for shape, table in d["speedup"].get("batched", {}).items():
    for b, row in table.items():
        print(shape, b, "T_AR", row["T_AR_ms"], {k: row.get(k, {}).get("speedup_over_ar") for k in
              ("stock", "stock_static", "stock_tuned", "specpilot")}, row.get("specpilot", {}).get("plan"))
print("errors:", {k: v.get("errors") for k, v in d["batched"].items() if isinstance(v, dict)}, d["speedup"].get("error"))
PY
exit $rc
