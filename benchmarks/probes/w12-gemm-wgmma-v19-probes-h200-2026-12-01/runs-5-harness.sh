#!/bin/bash
# gate_up's tails re-swept with 1-2-warp tail blocks (which fit beside the staged warpgroup blocks), then gate_up timed
# on the merged config
cd "$(dirname "$0")/.."
export PYTHONPATH=kernels:.:benchmarks
cp kernels/specpilot_kernels/w12/mma_configs.json $OUT/mma_configs.json
timeout 300 python3 benchmarks/w12_gemm_bench.py --variants mma --tune none --tails --shapes gate_up \
  --write-configs $OUT/mma_configs.json --out $OUT/tails2.json 2> $OUT/tails2.log
echo tails rc $?
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/tails2.json"))
e = d["shapes"]["gate_up"]
for t in sorted([t for t in e["tail_us"] if "score" in t], key=lambda t: t["score"])[:10]:
    print(t["tail_rows"], t["tail"], t["wgmma"], round(t["score"], 2), round(t["t1_us"], 1), round(t["t16_us"], 1), round(t["t32_us"], 2))
print("chosen", e["best"]["mma"])
print([(r["M"], round(r["mma_us"], 1), round(r["mma_speedup"], 3), round(r["mma_frac_floor"], 3)) for r in e["rows"]])
PY
