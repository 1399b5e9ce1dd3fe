"""Even shares of the warpgroups' K chains against one block a tile group, per-warp beside; bits compared.

    PYTHONPATH=kernels:.:benchmarks python .gpu/even.py OUT.json [shapes] [rows]
"""
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import torch

from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408),
          "lm_head": (248320, 5120)}
L2 = 60 << 20
out = sys.argv[1]
shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["gate_up", "lm_head"]
rows_list = [int(r) for r in sys.argv[3].split(",")] if len(sys.argv) > 3 else [16, 32, 64]
result = {"device": torch.cuda.get_device_name(), "shapes": {}}
for name in shapes:
    n, k = SHAPES[name]
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    base = select_mma_config(n, k, torch.device("cuda"))
    plain = replace(base, wgmma=(0, 0, 0))
    entry = result["shapes"][name] = {"config": str(base), "rows": {}}
    for m in rows_list:
        slot = 0 if m <= 16 else 1 if m <= 32 else 2
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = w12_mma_gemm(x, mmas[0], config=plain)
        row = {"bits_equal": {}}
        options = {"per_warp": plain}
        for g in (1, 2, 4):
            if 4 * g * base.warps_k <= 32:
                cfg = replace(base, wgmma=tuple(g if i == slot else 0 for i in range(3)))
                options[f"g{g}"] = cfg
                options[f"even_g{g}"] = replace(cfg, even_shares=True)
        for label, cfg in options.items():
            try:
                row["bits_equal"][label] = bool(torch.equal(w12_mma_gemm(x, mmas[0], config=cfg).view(torch.int16),
                                                            ref.view(torch.int16)))
                row[label] = min(graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies,
                                                 max(copies, 8), 15) for _ in range(2))
            except Exception as exc:  # noqa: BLE001
                row[label + "_error"] = repr(exc)[:300]
        entry["rows"][m] = row
        print(name, m, {kk: (round(v, 1) if isinstance(v, float) else v) for kk, v in row.items()}, flush=True)
        Path(out).write_text(json.dumps(result, indent=1))
    del mmas, w, w12
    torch.cuda.empty_cache()
