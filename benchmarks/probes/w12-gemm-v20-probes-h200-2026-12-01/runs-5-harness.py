"""Kernel timeline of W12 GEMM calls under CUDA-graph replay (torch.profiler / CUPTI): per call, each kernel's start
and end relative to the call's first kernel, to see what the launch chain (permute -> first region -> tail) costs.

    PYTHONPATH=kernels:.:benchmarks python3 .gpu/trace.py OUT.json
"""
import json, math, statistics, sys
import torch
from torch.profiler import ProfilerActivity, profile
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

L2 = 60 << 20
res = {}
for name, (n, k), rows in (("gate_up", (34816, 5120), (1, 16, 32)), ("lm_head", (248320, 5120), (32,))):
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    cfg = select_mma_config(n, k, torch.device("cuda"))
    for m in rows:
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        calls = max(copies, 8)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(calls):
                w12_mma_gemm(x, mmas[i % copies], config=cfg, out=y)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for i in range(calls):
                w12_mma_gemm(x, mmas[i % copies], config=cfg, out=y)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()
        ev = sorted([(e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA and "w12" in e.name], key=lambda t: t[0])
        kinds = []
        for s0, e0, nm in ev:
            kind = "permute" if "permute" in nm else "wgmma" if "wgmma" in nm else "per_warp" if "mma_kernel" in nm else nm[:40]
            kinds.append((kind, s0, e0))
        # per kernel kind: durations; gaps from one kernel's end to the next one's start (negative: overlap)
        out = {"kernels": len(kinds), "durations_us": {}, "gaps_us": {}}
        for kind in dict.fromkeys(k for k, _, _ in kinds):
            out["durations_us"][kind] = statistics.median(e - s for kk, s, e in kinds if kk == kind)
        for (k1, s1, e1), (k2, s2, e2) in zip(kinds, kinds[1:]):
            out["gaps_us"].setdefault(f"{k1}->{k2}", []).append(s2 - e1)
        out["gaps_us"] = {a: [statistics.median(b), min(b), max(b), len(b)] for a, b in out["gaps_us"].items()}
        span = (kinds[-1][2] - kinds[0][1]) / (3 * calls)
        out["span_per_call_us"] = span
        out["first_12"] = [(kk, round(s - kinds[0][1], 2), round(e - kinds[0][1], 2)) for kk, s, e in kinds[:12]]
        res[f"{name}_{m}"] = out
        print(name, m, json.dumps(out), flush=True)
    del mmas
    torch.cuda.empty_cache()
json.dump(res, open(sys.argv[1], "w"), indent=1)
