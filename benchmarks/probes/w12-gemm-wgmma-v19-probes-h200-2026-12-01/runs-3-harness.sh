#!/bin/bash
# tails re-swept with staged warpgroup weights (gate_up, LM head), then the bench on the merged configs
cd "$(dirname "$0")/.."
export PYTHONPATH=kernels:.:benchmarks
cp kernels/specpilot_kernels/w12/mma_configs.json $OUT/mma_configs.json
timeout 320 python3 benchmarks/w12_gemm_bench.py --variants mma --tune none --tails --shapes gate_up,lm_head \
  --write-configs $OUT/mma_configs.json --out $OUT/tails.json 2> $OUT/tails.log
echo tails rc $?
grep -v -i warn $OUT/tails.log | grep -i "tail\|chose\|best" | tail -20
cp $OUT/mma_configs.json kernels/specpilot_kernels/w12/mma_configs.json
timeout 200 python3 benchmarks/w12_gemm_bench.py --variants mma --tune none --shapes qkv,o_proj,gate_up,down,lm_head \
  --out $OUT/final.json 2> $OUT/final.log
echo final rc $?
python3 - <<'PY'
import json, os
d = json.load(open(os.environ["OUT"] + "/final.json"))
print(d["read_bw_Bps"] / 1e12, json.dumps(d["summary"]))
for s in ("gate_up", "lm_head"):
    for r in d["shapes"][s]["rows"]:
        print(s, r["M"], round(r["mma_us"], 2), round(r["mma_speedup"], 3), round(r["mma_frac_floor"], 3))
PY
