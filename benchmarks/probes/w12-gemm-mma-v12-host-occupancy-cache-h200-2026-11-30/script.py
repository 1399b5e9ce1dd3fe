"""Host time of eager W12 mma launches (the runtime's occupancy query per launch vs cached), base vs current
source, each built as its own extension: a launch-bound loop of 2000 calls on a small weight."""
import json, sys, time
from pathlib import Path
import torch
from specpilot_kernels.cuda_extension import load_cuda_extension
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import CSRC, MmaConfig, to_mma_layout

exts = {"new": load_cuda_extension("w12host_new", CSRC, ("binding.cpp", "w12_mma.cu")),
        "base": load_cuda_extension("w12host_base", Path(".gpu/variants/base"), ("binding.cpp", "w12_mma.cu"))}
torch.manual_seed(0)
mma = to_mma_layout(encode((torch.randn(1024, 4096, device="cuda") * 0.02).bfloat16()))
out = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(), "cases": []}
for m, cfg in ((1, MmaConfig(1, 8, 1)), (32, MmaConfig(1, 8, 1, (2, 1))), (64, MmaConfig(8, 2, 1))):
    x = torch.randn(m, 4096, device="cuda").bfloat16()
    y = torch.empty(m, 1024, device="cuda", dtype=torch.bfloat16)
    ws = torch.empty(0, device="cuda")
    row = {"M": m, "config": [cfg.warps_n, cfg.warps_k, cfg.splits, cfg.step_plan(m)]}
    for rep in range(3):
        for name, ext in exts.items():
            call = lambda: ext.w12_mma_gemm(x, mma.view, mma.nibbles, mma.base, mma.esc_ptr, mma.esc_loc, mma.esc_val, y, ws,
                                            1024, 1024, 4096, cfg.warps_n, cfg.warps_k, cfg.chunks_per_split(4096),
                                            *cfg.step_plan(m), 0, 0)
            for _ in range(50):
                call()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(2000):
                call()
            host = (time.perf_counter() - t0) / 2000 * 1e6
            torch.cuda.synchronize()
            row.setdefault(f"host_us_per_call_{name}", []).append(round(host, 2))
    out["cases"].append(row)
    print(json.dumps(row), flush=True)
json.dump(out, open(sys.argv[1], "w"), indent=1)
