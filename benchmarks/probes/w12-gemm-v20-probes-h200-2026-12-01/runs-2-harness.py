"""LM head (and gate_up) at 32 / 64 rows: warpgroups a block (20 warps a multiprocessor with 5), interleaved reps,
bits compared with the per-warp kernel; launched groups recorded.

    PYTHONPATH=kernels:.:benchmarks python3 .gpu/groups.py OUT.json
"""
import json, math, sys, time
from dataclasses import asdict, replace
from pathlib import Path
import torch
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

L2 = 60 << 20
out_path = sys.argv[1]
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "shapes": {}}
CASES = {"lm_head": ((248320, 5120), {32: (2, 3, 4, 5), 64: (2, 3)}), "o_proj": ((5120, 8192), {32: (1, 2, 3)})}
for name, ((n, k), plan) in CASES.items():
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w[3, 5] = 0; w[40, 1000] = 1e-39; w[n - 5, 77] = 3e-8
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    base = select_mma_config(n, k, torch.device("cuda"))
    entry = res["shapes"][name] = {"config": asdict(base), "rows": {}}
    for m, groups in plan.items():
        slot = 1 if m <= 32 else 2
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = w12_mma_gemm(x, mmas[0], config=replace(base, wgmma=(0, 0, 0))).view(torch.int16)
        row = {}
        for rep in range(4):
            for g in groups[rep % len(groups):] + groups[:rep % len(groups)]:
                cfg = replace(base, wgmma=tuple(g if i == slot else base.wgmma[i] for i in range(3)))
                launched = []
                out = w12_mma_gemm(x, mmas[0], config=cfg, launched=launched).view(torch.int16)
                row[f"g{g}_bits_equal"] = bool(torch.equal(out, ref))
                row[f"g{g}_launched"] = launched
                t0 = time.time()
                t = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies, max(copies, 8), 15)
                row.setdefault(f"g{g}_us", []).append(round(t, 2))
                row.setdefault(f"g{g}_window", []).append([round(t0, 2), round(time.time(), 2)])
        entry["rows"][m] = row
        print(name, m, json.dumps({a: b for a, b in row.items() if "window" not in a}), flush=True)
        Path(out_path).write_text(json.dumps(res, indent=1))
    del mmas
    torch.cuda.empty_cache()
