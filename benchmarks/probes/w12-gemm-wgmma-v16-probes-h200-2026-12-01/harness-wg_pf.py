"""A/B in one process: the committed warpgroup kernel vs a variant built from .gpu/variants/<name> (bits and time)."""
import json, math, os, sys
from dataclasses import replace
from pathlib import Path
sys.path[:0] = ["kernels", "benchmarks", "."]
import torch
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12 import mma as mma_module
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

VARIANT = os.environ.get("VARIANT", "pf")
real = mma_module.load_cuda_extension
use_variant = [False]
mma_module.load_cuda_extension = lambda name, csrc, sources: (
    real(name + "_" + VARIANT, Path(".gpu/variants") / VARIANT, sources) if use_variant[0] else real(name, csrc, sources))

def call(*a, variant=False, **k):
    use_variant[0] = variant
    try:
        return w12_mma_gemm(*a, **k)
    finally:
        use_variant[0] = False

SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408),
          "lm_head": (248320, 5120)}
res = {"variant": VARIANT, "diff": open(f".gpu/variants/{VARIANT}.diff").read() if os.path.exists(f".gpu/variants/{VARIANT}.diff") else None}
L2 = 60 * 2**20
for name in os.environ.get("SHAPES", "qkv,o_proj,gate_up,down,lm_head").split(","):
    N, K = SHAPES[name]
    torch.manual_seed(0)
    w = (torch.randn(N, K, device="cuda") * 0.02).bfloat16()
    t0 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / t0.nbytes()))
    mmas = [to_mma_layout(t0)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    del t0, w
    cfg = select_mma_config(N, K, torch.device("cuda"))
    out = {}
    for m in [int(r) for r in os.environ.get("ROWS", "16,32,64").split(",")]:
        slot = 0 if m <= 16 else 1 if m <= 32 else 2
        wg = replace(cfg, wgmma=tuple(1 if i == slot else 0 for i in range(3)))
        plain = replace(cfg, wgmma=(0, 0, 0))
        x = torch.randn(m, K, device="cuda").bfloat16()
        y = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        t = lambda c, v: graph_replay_us(lambda i: call(x, mmas[i], config=c, out=y, variant=v), copies, max(copies, 8), 15)
        row = {"per_warp": t(plain, False), "wgmma": t(wg, False), "wgmma_variant": t(wg, True),
               "wgmma_again": t(wg, False), "wgmma_variant_again": t(wg, True)}
        row["bits_equal"] = all(torch.equal(call(x, mmas[0], config=wg, low_bits=lb, variant=True).view(torch.int16),
                                            call(x, mmas[0], config=plain, low_bits=lb).view(torch.int16))
                                for lb in ("exact", "midpoint"))
        out[m] = row
        print(name, m, {k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    res[name] = out
    json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), f"wg_{VARIANT}.json"), "w"), indent=1)
    del mmas
    torch.cuda.empty_cache()
