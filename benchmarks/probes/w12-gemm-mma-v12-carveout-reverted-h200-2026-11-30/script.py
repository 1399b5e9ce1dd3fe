"""L1/shared carveout of the W12 mma kernel: default vs max-L1 hint vs the least shared memory the resident blocks
need, with each shape's best step plans, at 1/16/32/64 rows, beside cuBLAS (CUDA-graph replay, rotating copies)."""
import json, math, os, sys, time
from dataclasses import replace
import torch
sys.path.insert(0, "benchmarks")
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import to_mma_layout, select_mma_config, w12_mma_gemm

PLANS = {"qkv": ((4, 1), (2, 1), (4, 1)), "o_proj": ((4, 1), (2, 1), (4, 1)), "gate_up": ((4, 1), (4, 1), (2, 2)),
         "down": ((4, 1), (2, 1), (4, 1)), "lm_head": ((4, 1), (2, 2), (2, 2))}
SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408), "lm_head": (248320, 5120)}
MODES = sys.argv[2].split(",") if len(sys.argv) > 2 else ["-1", "0", "auto"]
out = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(), "modes": MODES, "cases": []}
for sname, (n, k) in SHAPES.items():
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * 60 * 2**20 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    wb = [w] + [w.clone() for _ in range(max(2, math.ceil(4 * 60 * 2**20 / (w.numel() * 2))) - 1)]
    p16, p32, p64 = PLANS[sname]
    cfg = replace(select_mma_config(n, k, torch.device("cuda")), plan_16=p16, plan_32=p32, plan_64=p64)
    for m in (1, 16, 32, 64):
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        tc = graph_replay_us(lambda i: torch.matmul(x, wb[i].t(), out=y), len(wb), max(len(wb), 8), 15)
        row = {"shape": sname, "M": m, "config": [cfg.warps_n, cfg.warps_k, cfg.splits, cfg.step_plan(m)], "cublas_us": round(tc, 2)}
        ref = None
        for mode in MODES:
            os.environ["W12_CARVEOUT"] = mode
            try:
                yy = w12_mma_gemm(x, mmas[0], config=cfg)
                ref = yy.clone() if ref is None else ref
                assert torch.equal(yy.view(torch.int16), ref.view(torch.int16))
                t = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies, max(copies, 8), 15)
                row[f"us_{mode}"] = round(t, 2)
                row[f"speedup_{mode}"] = round(tc / t, 3)
            except Exception as exc:
                row[f"error_{mode}"] = repr(exc)[:200]
        out["cases"].append(row)
        print(json.dumps(row), flush=True)
    os.environ["W12_CARVEOUT"] = "-1"
    del mmas, wb
    torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)
