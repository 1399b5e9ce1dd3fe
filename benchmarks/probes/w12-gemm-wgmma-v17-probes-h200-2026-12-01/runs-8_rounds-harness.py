"""Does the warpgroup kernel lose to rounding its blocks into waves? Time gate_up's and the LM head's partitions at
32 rows on N cut to a whole number of waves, beside the real N (per-weight time compared).

    PYTHONPATH=kernels:.:benchmarks python .gpu/rounds.py OUT.json
"""
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

L2 = 60 << 20
K = 5120
# (name, real N, config's N, groups, N values): gate_up G1 (2 K classes, 8-warp blocks, 2 a multiprocessor: 264 slots
# of 64 rows), LM head G2 (8-warp blocks of 128 rows, 2 a multiprocessor)
CASES = [("gate_up", 34816, 1, [34816, 33792, 33792 + 2048, 16896, 16896 + 4096]),
         ("lm_head", 248320, 2, [248320, 236544, 270336, 202752])]
out = sys.argv[1]
result = {"device": torch.cuda.get_device_name(), "cases": {}}
for name, n_real, groups, ns in CASES:
    base = select_mma_config(n_real, K, torch.device("cuda"))
    cfg = replace(base, wgmma=(0, groups, 0))
    plain = replace(base, wgmma=(0, 0, 0))
    rows = {}
    for n in ns:
        torch.manual_seed(0)
        w = (torch.randn(n, K, device="cuda") * 0.02).bfloat16()
        w12 = encode(w, check=False)
        copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
        mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
        x = torch.randn(32, K, device="cuda").bfloat16()
        y = torch.empty(32, n, device="cuda", dtype=torch.bfloat16)
        t = {}
        for label, c in (("wgmma", cfg), ("per_warp", plain)):
            t[label] = min(graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=c, out=y), copies, max(copies, 8), 15)
                           for _ in range(2))
        rows[n] = {**t, **{f"{k}_us_per_mweight": v / (n * K / 1e6) for k, v in t.items()}}
        print(name, n, {k: round(v, 4) for k, v in rows[n].items()}, flush=True)
        del mmas, w, w12
        torch.cuda.empty_cache()
    result["cases"][name] = {"config": str(cfg), "rows": rows}
    Path(out).write_text(json.dumps(result, indent=1))
