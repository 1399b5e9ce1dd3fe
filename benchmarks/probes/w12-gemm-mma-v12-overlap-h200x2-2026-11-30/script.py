"""Programmatic dependent launch of the W12 mma kernel, on vs off, with each shape's tuned partition and step plans,
at 1-64 rows beside cuBLAS (CUDA-graph replay over rotating copies: consecutive calls, as in a decoder)."""
import json, math, sys, time
from dataclasses import replace
import torch
sys.path.insert(0, "benchmarks")
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import to_mma_layout, select_mma_config, w12_mma_gemm

PLANS = {"qkv": ((2, 1), (4, 1)), "o_proj": ((2, 1), (4, 1)), "gate_up": ((2, 2), (2, 2)),
         "down": ((2, 1), (4, 1)), "lm_head": ((2, 2), (2, 2))}
SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408), "lm_head": (248320, 5120)}
out = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(), "cases": []}
for sname, (n, k) in SHAPES.items():
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * 60 * 2**20 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    wb = [w] + [w.clone() for _ in range(max(2, math.ceil(4 * 60 * 2**20 / (w.numel() * 2))) - 1)]
    p32, p64 = PLANS[sname]
    cfg = replace(select_mma_config(n, k, torch.device("cuda")), plan_32=p32, plan_64=p64)
    for m in (1, 2, 4, 8, 16, 32, 48, 64):
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        tc = graph_replay_us(lambda i: torch.matmul(x, wb[i].t(), out=y), len(wb), max(len(wb), 8), 15)
        row = {"shape": sname, "M": m, "config": [cfg.warps_n, cfg.warps_k, cfg.splits, cfg.step_plan(m)], "cublas_us": round(tc, 2)}
        a = w12_mma_gemm(x, mmas[0], config=cfg, overlap_prior=False)
        b = w12_mma_gemm(x, mmas[0], config=cfg, overlap_prior=True)
        row["bits_equal"] = torch.equal(a.view(torch.int16), b.view(torch.int16))
        for ov in (False, True, False, True):
            t = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y, overlap_prior=ov), copies, max(copies, 8), 15)
            row.setdefault(f"us_overlap_{int(ov)}", []).append(round(t, 2))
        row["speedup_off"] = round(tc / min(row["us_overlap_0"]), 3)
        row["speedup_on"] = round(tc / min(row["us_overlap_1"]), 3)
        out["cases"].append(row)
        print(json.dumps(row), flush=True)
    del mmas, wb
    torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)
