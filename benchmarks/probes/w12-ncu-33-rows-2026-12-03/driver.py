"""The launches ncu profiles (w12ncu33.sh): attn_out 5120 x 6144 with its committed config at 32 rows (the per-warp
shared-activation kernel, one round of 128 blocks) and 33 rows (the warpgroup kernel, 160 blocks of 12 warps), three
calls each so that --launch-skip can step over the first (occupancy queries, lazy loading)."""

import sys

import torch

from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

rows = int(sys.argv[1])
torch.manual_seed(0)
w = (torch.randn(5120, 6144, device="cuda") * 0.02).bfloat16()
mma = to_mma_layout(encode(w))
config = select_mma_config(5120, 6144, torch.device("cuda"))
x = torch.randn(rows, 6144, device="cuda").bfloat16()
launched = []
for _ in range(3):
    w12_mma_gemm(x, mma, config=config, launched=launched)
torch.cuda.synchronize()
print("rows", rows, "config", config.warps_n, config.warps_k, config.splits, "warpgroups launched", launched)
