import sys, os
sys.path[:0] = ["kernels", "."]
import torch
from dataclasses import replace
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm
for name, (N, K) in {"gate_up": (34816, 5120), "lm_head": (248320, 5120)}.items():
    torch.manual_seed(0)
    w = (torch.randn(N, K, device="cuda") * 0.02).bfloat16()
    mma = to_mma_layout(encode(w, check=False)); del w
    cfg = select_mma_config(N, K, torch.device("cuda"))
    x = torch.randn(32, K, device="cuda").bfloat16()
    for c in (cfg, replace(cfg, wgmma=(0, 1, 0)), replace(cfg, wgmma=(0, 1, 0), wgmma_stages=2)):
        for _ in range(1):
            w12_mma_gemm(x, mma, config=c)
    torch.cuda.synchronize()
    del mma; torch.cuda.empty_cache()
