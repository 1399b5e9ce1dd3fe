"""Where a class-split launch's time goes (w12split2.sh): torch.profiler's CUDA kernel times of the image permute, the
class-split kernel and the sums kernel, per shape and row count, with the committed configs; eager launches (the
profiler serializes them, so the kernels' times add up to more than the graph-replayed launch). Writes argv[1]."""

import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

CASES = ((5120, 6144, 33), (5120, 6144, 64), (10240, 5120, 64), (16480, 5120, 48), (5120, 17408, 33))
out = {}
for n, k, rows in CASES:
    torch.manual_seed(0)
    mma = to_mma_layout(encode((torch.randn(n, k, device="cuda") * 0.02).bfloat16()))
    config = select_mma_config(n, k, torch.device("cuda"))
    x = torch.randn(rows, k, device="cuda").bfloat16()
    for _ in range(3):
        w12_mma_gemm(x, mma, config=config)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            w12_mma_gemm(x, mma, config=config)
        torch.cuda.synchronize()
    kernels = {
        e.key[:80]: round(e.device_time_total / e.count, 2) for e in prof.key_averages() if e.device_time_total > 0
    }
    out[f"{n}x{k}@{rows}"] = {"wide_rows": config.wide_launch(rows), "kernel_us": kernels}
    print(n, k, rows, kernels, flush=True)
    del mma
json.dump(out, open(sys.argv[1], "w"), indent=1)
