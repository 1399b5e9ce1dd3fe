"""Step plans of the W12 mma kernel side by side: for each shape's tuned partition (and other warps_n, which change
no bit), every built plan at 16/32/48/64 rows, timed by CUDA-graph replay over rotating copies beside cuBLAS."""
import json, math, sys, time
from dataclasses import replace
import torch
sys.path.insert(0, "benchmarks")
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import STEP_PLANS, MmaConfig, to_mma_layout, select_mma_config, w12_mma_gemm

out = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(), "cases": []}
SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408), "lm_head": (248320, 5120)}
ROWS = [int(r) for r in sys.argv[2].split(",")] if len(sys.argv) > 2 else [16, 32, 64]
for sname, (n, k) in SHAPES.items():
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * 60 * 2**20 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    wb = [w] + [w.clone() for _ in range(max(2, math.ceil(4 * 60 * 2**20 / (w.numel() * 2))) - 1)]
    tuned = select_mma_config(n, k, torch.device("cuda"))
    for m in ROWS:
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        tc = graph_replay_us(lambda i: torch.matmul(x, wb[i].t(), out=y), len(wb), max(len(wb), 8), 15)
        key = 16 if m <= 16 else 32 if m <= 32 else 64
        base_cfg = replace(tuned, **{f"plan_{key}": (4, 1, 0)})
        ref = w12_mma_gemm(x, mmas[0], config=base_cfg).clone()
        for plan in STEP_PLANS[key]:
            for wn in sorted({tuned.warps_n, 1}):
                if wn * tuned.warps_k > 16:
                    continue
                cfg = replace(tuned, warps_n=wn, **{f"plan_{key}": plan})
                try:
                    yy = w12_mma_gemm(x, mmas[0], config=cfg)
                    same = torch.equal(yy.view(torch.int16), ref.view(torch.int16))
                    t = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies, max(copies, 8), 15)
                    row = {"shape": sname, "M": m, "warps_n": wn, "warps_k": cfg.warps_k, "splits": cfg.splits,
                           "plan": plan, "us": round(t, 2), "cublas_us": round(tc, 2), "speedup": round(tc / t, 3),
                           "bits_equal": same}
                except Exception as exc:
                    row = {"shape": sname, "M": m, "warps_n": wn, "plan": plan, "error": repr(exc)[:300]}
                out["cases"].append(row)
                print(json.dumps(row), flush=True)
    del mmas, wb
    torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)
