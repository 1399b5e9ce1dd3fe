"""Partitions for gate_up and the LM head now that 17-64 rows can run as warpgroup MMAs: per-warp at 1, 8, 16 rows
(staged up to 8 or 16 rows, the faster), the best of per-warp / wgmma G1 / G2 / G4 at 32 and 64 rows, cuBLAS beside.

    PYTHONPATH=kernels:.:benchmarks python .gpu/parts.py OUT.json
"""
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import MmaConfig, select_mma_config, to_mma_layout, w12_mma_gemm

L2 = 60 << 20
SHAPES = {"gate_up": ((34816, 5120), [(1, 2, 1), (1, 2, 2), (1, 2, 4), (1, 4, 1), (1, 4, 2), (1, 2, 3), (1, 1, 4),
                                      (2, 2, 2)]),
          "lm_head": ((248320, 5120), [(4, 1, 1), (4, 1, 2), (2, 1, 2), (4, 2, 1), (2, 2, 1), (4, 1, 3)])}
out = sys.argv[1]
result = {"device": torch.cuda.get_device_name(), "shapes": {}}
t0 = time.time()
for name, ((n, k), parts) in SHAPES.items():
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    wts = [w.t()] + [w.clone().t() for _ in range(max(2, math.ceil(4 * L2 / (n * k * 2))) - 1)]
    on_file = select_mma_config(n, k, torch.device("cuda"))
    entry = result["shapes"][name] = {"on_file": asdict(on_file), "cublas": {}, "parts": {}}

    def t(cfg, m):
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies, max(copies, 8), 15)

    for m in (1, 8, 16, 32, 64):
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        entry["cublas"][m] = graph_replay_us(lambda i: torch.matmul(x, wts[i], out=y), len(wts), max(len(wts), 8), 15)
    for wn, wk, sp in parts:
        base = replace(on_file, warps_n=wn, warps_k=wk, splits=sp, shared_x_32=(0, 0), wgmma=(0, 0, 0))
        row = {}
        try:
            for m in (1, 8, 16):
                row[m] = {f"staged{r}": t(replace(base, staged_rows=r), m) for r in (0, 8, 16)}
            for m, slot in ((32, 1), (64, 2)):
                row[m] = {"per_warp": t(base, m)}
                for g in (1, 2, 4):
                    if 4 * g * wk <= 32:
                        row[m][f"g{g}"] = t(replace(base, wgmma=tuple(g if i == slot else 0 for i in range(3))), m)
        except Exception as exc:  # noqa: BLE001
            row["error"] = repr(exc)[:300]
        entry["parts"][f"{wn},{wk},{sp}"] = row
        best = {m: min(v.values()) for m, v in row.items() if isinstance(v, dict)}
        print(name, (wn, wk, sp), {m: (round(b, 1), round(entry["cublas"][m] / b, 3)) for m, b in best.items()},
              flush=True)
        Path(out).write_text(json.dumps(result, indent=1))
    del mmas, wts, w, w12
    torch.cuda.empty_cache()
result["total_s"] = time.time() - t0
Path(out).write_text(json.dumps(result, indent=1))
