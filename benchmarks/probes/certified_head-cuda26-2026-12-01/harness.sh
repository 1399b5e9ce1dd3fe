#!/bin/bash
# Engineer B, certified head at 32 rows, call 4 (<= 90 s): the rescore with half a weight row in flight per warp
# (10 pieces a lane: 75 registers) at 3 blocks per multiprocessor (CH_RESCORE_SPLIT=1) or 2 (=2), against the
# committed rescore (a whole row, 120 registers, 2 blocks), all in the committed fused path (the rescore compacts the
# pass's lists); the summation order is the same (lane l: pieces l, l + 32, ... in order). Interleaved ABBA rounds
# after a warm-up, traces at 32, the exact-head GPU tests with and without the switch, 131,072 adversarial rows.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=kernels:.
mkdir -p "$OUT/B"
{
date -u
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
T0=$(date +%s)
timeout 60 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_certified_head_exact_cuda.py \
  || echo "TESTS FAILED rc=$?"
echo "tests (incl. build) took $(( $(date +%s) - T0 )) s"
CH_RESCORE_SPLIT=1 timeout 20 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_certified_head_exact_cuda.py \
  || echo "SPLIT TESTS FAILED rc=$?"
echo "split tests done at $(( $(date +%s) - T0 )) s"
timeout $(( 88 - ($(date +%s) - T0) )) python3 - <<'EOF'
import datetime, json, os, statistics, sys, traceback
import torch
sys.path.insert(0, "benchmarks")
import certified_head_bench as B
from cuda_timing import graph_replay_us
from specpilot_kernels.certified_head import certified_argmax_graphable, int8_pass, quantize_head
from specpilot_kernels.certified_head.adversarial import adversarial_head
from specpilot_kernels.certified_head.exact_cuda import rescore_cuda

out = {"note": "session 8 call 4 (engineer B): fused = the committed path (6724e15: prologue, pass, the rescore "
               "compacting the stage lists itself); split3 / split2 = its rescore with 10 pieces a lane in flight "
               "(half a 5120-wide row, 75 registers) at 3 / 2 blocks per multiprocessor (CH_RESCORE_SPLIT=1 / 2)",
       "date": datetime.datetime.now(datetime.UTC).isoformat(), "device": torch.cuda.get_device_name(),
       "command": "bash gpu_B.sh (call 4 harness, interleaved ABBA rounds of graph replays, 2 weight copies)"}
path = os.path.join(os.environ["OUT"], "B", "ab.json")
def save():
    json.dump(out, open(path, "w"), indent=1)
gen = torch.Generator(device="cuda").manual_seed(0)
out["read_bandwidth_TBps"] = B.read_bandwidth() / 1e12
g = (torch.randn(B.VOCAB, B.HIDDEN, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
heads = [quantize_head(g), quantize_head(g.clone())]
print("heads ready", out["read_bandwidth_TBps"], flush=True)
VARS = {"fused": (True, "0"), "split3": (True, "1"), "split2": (True, "2")}
def switch(v):
    os.environ["CH_RESCORE_SPLIT"] = VARS[v][1]
def call_for(fused, xs):
    if fused:
        return lambda i: certified_argmax_graphable(xs[i], heads[i])
    return lambda i: rescore_cuda(xs[i], heads[i].weight, *int8_pass(xs[i], heads[i], backend="cuda"))
out["rounds"] = {}
warm = [torch.randn(32, B.HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2)]
t_warm = datetime.datetime.now()
while (datetime.datetime.now() - t_warm).total_seconds() < 4:  # the clocks up to their working point first
    graph_replay_us(call_for(True, warm), 2)
for m, rounds in ((32, 16), (16, 6), (8, 4), (1, 4)):
    try:
        xs = [torch.randn(m, B.HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2)]
        runs = {v: [] for v in VARS}
        names = list(VARS)
        for r in range(rounds):
            for v in names[:: -1 if r % 2 else 1]:
                switch(v)
                runs[v].append(graph_replay_us(call_for(VARS[v][0], xs), 2))
        res = {v: {"median_us": statistics.median(us), "runs_us": us} for v, us in runs.items()}
        for v in names[1:]:
            diffs = [a - b for a, b in zip(runs[v], runs["fused"])]
            res[v]["paired_diff_median_us"] = statistics.median(diffs)
            res[v]["rounds_faster"] = sum(d < 0 for d in diffs)
        out["rounds"][m] = res
        print(f"M={m}: " + ", ".join(f"{v} {r['median_us']:.1f} ({r.get('paired_diff_median_us', 0):+.1f}, "
                                      f"{r.get('rounds_faster', '-')}/{rounds})" for v, r in res.items()), flush=True)
        if m == 32:
            out["traces_32"] = {}
            for v in names:
                switch(v)
                out["traces_32"][v] = B.kernel_trace(call_for(VARS[v][0], xs), 2)
                print(v, json.dumps(out["traces_32"][v]), flush=True)
    except Exception:
        out.setdefault("errors", []).append(traceback.format_exc())
        traceback.print_exc()
    save()
heads = g = None
torch.cuda.empty_cache()
try:
    switch("split3")
    weight, pairs = adversarial_head(B.VOCAB, B.HIDDEN, gen)
    t0 = datetime.datetime.now()
    out["property_check_split3"] = B.property_check(quantize_head(weight), pairs, 131072, gen, None)
    out["property_check_split3"]["seconds"] = (datetime.datetime.now() - t0).total_seconds()
    print(json.dumps(out["property_check_split3"]), flush=True)
except Exception:
    out.setdefault("errors", []).append(traceback.format_exc())
    traceback.print_exc()
save()
EOF
echo "all done at $(( $(date +%s) - T0 )) s"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
} 2>&1 | tee "$OUT/B/log"
