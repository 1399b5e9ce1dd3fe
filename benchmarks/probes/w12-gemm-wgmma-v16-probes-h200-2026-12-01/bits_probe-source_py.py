"""Probe: wgmma (A regs, B smem) vs mma.sync bits; which descriptor offsets are right."""
import json, os, sys, time
import torch
from torch.utils.cpp_extension import load
here = os.path.dirname(os.path.abspath(__file__))
ext = load(name="wg_probe", sources=[os.path.join(here, "wg_probe.cu")],
           extra_cuda_cflags=["-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a"], verbose=False)
torch.manual_seed(0)
blocks, K = 4096, 256
def rnd(*shape, spread):
    m = torch.randn(*shape, dtype=torch.float64)
    e = torch.randint(-spread, spread + 1, shape).double()
    return (m * torch.exp2(e)).to(torch.bfloat16)
results = {}
for spread in (0, 8, 30):
    A = rnd(blocks, 64, K, spread=spread).cuda()
    B = rnd(blocks, 32, K, spread=spread).cuda()
    ref = torch.einsum("bmk,bnk->bmn", A.double(), B.double())
    for kh_outer, lbo, sbo in ((1, 512, 128),):
        out = ext.run(A, B, kh_outer, lbo, sbo)
        torch.cuda.synchronize()
        mma, wg = out[0], out[1]
        err_w = ((wg.double() - ref).abs() / ref.abs().clamp_min(1e-30)).median().item()
        err_m = ((mma.double() - ref).abs() / ref.abs().clamp_min(1e-30)).median().item()
        same = (mma.view(torch.int32) == wg.view(torch.int32)).double().mean().item()
        results[f"spread{spread}_khouter{kh_outer}_lbo{lbo}_sbo{sbo}"] = dict(
            bits_equal_fraction=same, median_rel_err_wgmma=err_w, median_rel_err_mma=err_m)
        print(spread, kh_outer, lbo, sbo, same, err_w, err_m, flush=True)
out = os.environ.get("OUT", "/tmp")
json.dump(results, open(os.path.join(out, "wg_probe.json"), "w"), indent=1)
