"""gate_up with one K class (40-chunk chains) on whole rounds plus a tail, against the committed two-class partition
with its tail: one round of long chains instead of two rounds of half-length ones.

    PYTHONPATH=kernels:.:benchmarks python .gpu/onepass.py OUT.json
"""
import json
import math
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

N, K, L2 = 34816, 5120, 60 << 20
torch.manual_seed(0)
w = (torch.randn(N, K, device="cuda") * 0.02).bfloat16()
w12 = encode(w, check=False)
copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
on_file = select_mma_config(N, K, torch.device("cuda"))
options = {"on_file": on_file}
for wn in (1, 4):
    for g in (1, 2, 4):
        for tail in ((1, 8, 2), (1, 4, 2)):
            options[f"({wn},1,1) g{g} tail{tail}"] = replace(on_file, warps_n=wn, warps_k=1, wgmma=(0, g, g), tail=tail)
    options[f"({wn},1,1) g2 no tail"] = replace(on_file, warps_n=wn, warps_k=1, wgmma=(0, 2, 2), tail_rows=0, tail=(0, 0, 0))
result = {"device": torch.cuda.get_device_name(), "configs": {k: asdict(v) for k, v in options.items()}, "us": {}}
for m in (1, 8, 16, 32, 64):
    x = torch.randn(m, K, device="cuda").bfloat16()
    y = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
    for name, cfg in options.items():
        launched = []
        w12_mma_gemm(x, mmas[0], config=cfg, out=y, launched=launched)
        t = min(graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies, max(copies, 8), 15)
                for _ in range(2))
        result["us"].setdefault(name, {})[m] = {"us": t, "launched": launched}
    print(m, {k: round(v[m]["us"], 1) for k, v in result["us"].items()}, flush=True)
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
