"""gate_up's tail partitions with shorter K chains (down to one chunk a warp) against (1, 8, 2): 1, 16, 32 rows,
interleaved reps; each tail's launched warpgroups recorded.

    PYTHONPATH=kernels:.:benchmarks python3 .gpu/tails20.py OUT.json
"""
import json, math, sys, time
from dataclasses import asdict, replace
from pathlib import Path
import torch
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

L2 = 60 << 20
n, k = 34816, 5120
torch.manual_seed(0)
w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
w12 = encode(w, check=False)
copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
base = select_mma_config(n, k, torch.device("cuda"))
TAILS = [(1, 8, 2), (1, 8, 3), (1, 8, 4), (1, 16, 2), (2, 8, 2), (1, 16, 1), (1, 4, 4)]
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"), "config": asdict(base), "rows": {}}
for m, reps in ((32, 4), (16, 2), (1, 2)):
    x = torch.randn(m, k, device="cuda").bfloat16()
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ref = x.float() @ w.float().t()
    row = {}
    for rep in range(reps):
        for tail in TAILS[rep % len(TAILS):] + TAILS[:rep % len(TAILS)]:
            cfg = replace(base, tail=tail)
            key = ",".join(map(str, tail))
            if f"{key}_error" in row:
                continue
            try:
                if rep == 0:
                    launched = []
                    out = w12_mma_gemm(x, mmas[0], config=cfg, launched=launched).float()
                    row[f"{key}_launched"] = launched
                    row[f"{key}_max_rel_err"] = float(((out - ref).abs().max() / ref.abs().max()))
                t = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies, max(copies, 8), 15)
            except RuntimeError as exc:
                row[f"{key}_error"] = str(exc)[:120]
                continue
            row.setdefault(f"{key}_us", []).append(round(t, 2))
    res["rows"][m] = row
    print(m, json.dumps(row), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
