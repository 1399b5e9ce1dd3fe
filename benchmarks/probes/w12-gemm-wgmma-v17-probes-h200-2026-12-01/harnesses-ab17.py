"""A/B on the H200: v17 warpgroup kernel (working tree) vs v16 (HEAD, built from .gpu/v16csrc) vs per-warp, bits + times.

    PYTHONPATH=kernels:.:benchmarks python .gpu/ab17.py OUT.json [shapes] [rows]
"""
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from cuda_timing import graph_replay_us
from specpilot_kernels.cuda_extension import load_cuda_extension
from specpilot_kernels.w12 import mma as mma_module
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.format import STEP_K
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408),
          "lm_head": (248320, 5120)}
L2 = 60 << 20
out_path = sys.argv[1]
shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SHAPES)
rows_list = [int(r) for r in sys.argv[3].split(",")] if len(sys.argv) > 3 else [16, 32, 48, 64]
alt_dirs = (sys.argv[4] if len(sys.argv) > 4 else ".gpu/v16csrc").split(",")

t0 = time.time()
alts = {Path(d).name: load_cuda_extension("w12_alt_" + Path(d).name, Path(d).resolve(), ("binding.cpp", "w12_mma.cu"))
        for d in alt_dirs}
ext17 = load_cuda_extension("specpilot_w12_mma", mma_module.CSRC, ("binding.cpp", "w12_mma.cu"))
result = {"alts": alt_dirs, "build_s": time.time() - t0, "device": torch.cuda.get_device_name(), "shapes": {}}
print("built", result["build_s"], flush=True)


def alt_call(name, x, y, m12, cfg, groups):
    n, k = m12.shape
    np_, kp = m12.padded_shape
    per_split = cfg.chunks_per_split(kp)
    splits = -(-(kp // STEP_K) // per_split)
    ws = torch.empty(splits * x.shape[0] * n if splits > 1 else 0, dtype=torch.float32, device="cuda")
    extra = ()
    if "v17" in name:  # the binding takes x_image
        m = x.shape[0]
        extra = (torch.empty((kp // STEP_K) * max(16, 1 << (m - 1).bit_length()) * STEP_K, dtype=torch.bfloat16,
                             device="cuda"),)
    alts[name].w12_mma_gemm(x, m12.view, m12.nibbles, m12.base, m12.esc_ptr, m12.esc_loc, m12.esc_val, y, ws, n, np_, kp,
                       cfg.warps_n, cfg.warps_k, per_split, *cfg.step_plan(x.shape[0]), 0, 0, 0, groups, *extra, 1, 0)


def save():
    Path(out_path).write_text(json.dumps(result, indent=1))


for name in shapes:
    n, k = SHAPES[name]
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    wts = [w.t()] + [w.clone().t() for _ in range(max(2, math.ceil(4 * L2 / (n * k * 2))) - 1)]
    base = select_mma_config(n, k, torch.device("cuda"))
    plain = replace(base, wgmma=(0, 0, 0))
    entry = {"config": str(base), "rows": {}}
    result["shapes"][name] = entry
    for m in rows_list:
        slot = 0 if m <= 16 else 1 if m <= 32 else 2
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = w12_mma_gemm(x, mmas[0], config=plain)
        row = {"bits_equal": {}}
        row["cublas_us"] = graph_replay_us(lambda i: torch.matmul(x, wts[i], out=y), len(wts), max(len(wts), 8), 15)
        row["per_warp_us"] = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=plain, out=y), copies,
                                             max(copies, 8), 15)
        for g in (1, 2, 4):
            if 4 * g * base.warps_k > 32:
                continue
            cfg = replace(base, wgmma=tuple(g if i == slot else 0 for i in range(3)))
            try:
                got = w12_mma_gemm(x, mmas[0], config=cfg)
                row["bits_equal"][f"v17_g{g}"] = bool(torch.equal(got.view(torch.int16), ref.view(torch.int16)))
                row[f"v17_g{g}_us"] = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies,
                                                      max(copies, 8), 15)
            except Exception as exc:  # noqa: BLE001
                row[f"v17_g{g}_error"] = repr(exc)
            for alt in alts:
                try:
                    y16 = torch.empty_like(y)
                    alt_call(alt, x, y16, mmas[0], cfg, g)
                    row["bits_equal"][f"{alt}_g{g}"] = bool(torch.equal(y16.view(torch.int16), ref.view(torch.int16)))
                    row[f"{alt}_g{g}_us"] = graph_replay_us(lambda i: alt_call(alt, x, y, mmas[i], cfg, g), copies,
                                                            max(copies, 8), 15)
                except Exception as exc:  # noqa: BLE001
                    row[f"{alt}_g{g}_error"] = repr(exc)
        entry["rows"][m] = row
        print(name, m, {kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}, flush=True)
        save()
    del mmas, wts, w, w12
    torch.cuda.empty_cache()
result["total_s"] = time.time() - t0
save()
