"""One gate_up launch at 32 rows on the committed v19 kernel (built from .gpu/v19csrc), for ncu's stall breakdown."""
import sys
from pathlib import Path
sys.path[:0] = ["kernels", "."]
import torch
from specpilot_kernels.cuda_extension import load_cuda_extension
from specpilot_kernels.w12 import mma as M
from specpilot_kernels.w12 import encode
ext = load_cuda_extension("w12_v19", Path(".gpu/v19csrc").resolve(), ("binding.cpp", "w12_mma.cu"))
M.load_cuda_extension = lambda *a, **k: ext
n, k = 34816, 5120
torch.manual_seed(0)
mma = M.to_mma_layout(encode((torch.randn(n, k, device="cuda") * 0.02).bfloat16(), check=False))
x = torch.randn(32, k, device="cuda").bfloat16()
for _ in range(3):
    M.w12_mma_gemm(x, mma)
torch.cuda.synchronize()
