"""Whole rounds plus a finer tail: gate_up and the LM head as two launches on row regions, the first a whole number
of rounds of the tuned partition, the rest with more K classes (shorter chains), against the one-launch partition.

    PYTHONPATH=kernels:.:benchmarks python .gpu/tail.py OUT.json
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
from specpilot_kernels.w12.mma import W12MmaTensor, select_mma_config, to_mma_layout, w12_mma_gemm

L2 = 60 << 20
K = 5120
# (name, N, split row, tail partitions (warps_n, warps_k, splits, wgmma groups at 17-32/33-64))
CASES = [("gate_up", 34816, 33792, [(1, 8, 1, 1), (1, 4, 1, 2), (1, 4, 2, 1), (1, 2, 2, 2), (1, 2, 1, 2)]),
         ("lm_head", 248320, 236544, [(4, 2, 1, 2), (4, 4, 1, 2), (2, 2, 1, 2), (1, 4, 1, 2), (4, 1, 2, 2)])]
ROWS = (1, 8, 16, 32, 64)


def region(mma, t0, t1):
    chunks = mma.padded_shape[1] // 128
    e0, e1 = int(mma.esc_ptr[t0 * chunks]), int(mma.esc_ptr[t1 * chunks])
    return W12MmaTensor((16 * (t1 - t0), mma.shape[1]), (16 * (t1 - t0), mma.padded_shape[1]), mma.view[t0:t1],
                        mma.nibbles[t0:t1], mma.base[16 * t0:16 * t1],
                        (mma.esc_ptr[t0 * chunks:t1 * chunks + 1] - e0).contiguous(), mma.esc_loc[e0:e1],
                        mma.esc_val[e0:e1])


out = sys.argv[1]
result = {"device": torch.cuda.get_device_name(), "cases": {}}
side = torch.cuda.Stream()
t_start = time.time()
for name, n, n0, tails in CASES:
    torch.manual_seed(0)
    w = (torch.randn(n, K, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    t0 = n0 // 16
    mains = [region(m, 0, t0) for m in mmas]
    rests = [region(m, t0, n // 16) for m in mmas]
    tuned = select_mma_config(n, K, torch.device("cuda"))
    entry = result["cases"][name] = {"tuned": asdict(tuned), "split_row": n0, "rows": {}}
    for m in ROWS:
        x = torch.randn(m, K, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        y0 = torch.empty(m, n0, device="cuda", dtype=torch.bfloat16)
        y1 = torch.empty(m, n - n0, device="cuda", dtype=torch.bfloat16)
        t = lambda f: min(graph_replay_us(f, copies, max(copies, 8), 15) for _ in range(2))  # noqa: E731
        row = {"one_launch": t(lambda i: w12_mma_gemm(x, mmas[i], config=tuned, out=y)),
               "main_only": t(lambda i: w12_mma_gemm(x, mains[i], config=tuned, out=y0))}
        mains_cfgs = [("", tuned)]
        if m == 32 and not tuned.wgmma[1]:
            mains_cfgs.append(("mainG1 ", replace(tuned, wgmma=(0, 1, tuned.wgmma[2]))))
            row["mainG1_only"] = t(lambda i: w12_mma_gemm(x, mains[i], config=mains_cfgs[1][1], out=y0))
        for (prefix, main_cfg), (wn, wk, sp, g) in [(mc, tc) for mc in mains_cfgs for tc in tails]:
            cfg = replace(tuned, warps_n=wn, warps_k=wk, splits=sp, shared_x_32=(0, 0),
                          wgmma=(0, g if main_cfg.wgmma[1] else 0, g))
            label = f"{prefix}{wn},{wk},{sp},g{g}"
            try:
                if not prefix:
                    row[label + " tail_only"] = t(lambda i: w12_mma_gemm(x, rests[i], config=cfg, out=y1))
                row[label + " seq"] = t(lambda i: (w12_mma_gemm(x, mains[i], config=main_cfg, out=y0),
                                                   w12_mma_gemm(x, rests[i], config=cfg, out=y1)))

                def both(i):
                    side.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(side):
                        w12_mma_gemm(x, rests[i], config=cfg, out=y1)
                    w12_mma_gemm(x, mains[i], config=main_cfg, out=y0)
                    torch.cuda.current_stream().wait_stream(side)
                row[label + " concurrent"] = t(both)
                if m == 32 and not prefix:  # bits: every row at 32 rows equals the same row alone, and main rows equal one launch
                    w12_mma_gemm(x, rests[0], config=cfg, out=y1)
                    w12_mma_gemm(x, mains[0], config=tuned, out=y0)
                    w12_mma_gemm(x, mmas[0], config=tuned, out=y)
                    alone = torch.cat([w12_mma_gemm(x[r:r + 1], rests[0], config=cfg) for r in range(0, 32, 7)])
                    row[label + " bits"] = {
                        "tail_rows_equal_alone": bool(torch.equal(alone.view(torch.int16), y1[0:32:7].view(torch.int16))),
                        "main_equal_one_launch": bool(torch.equal(y0.view(torch.int16), y[:, :n0].view(torch.int16))),
                        "tail_rows_differing_from_one_launch": float((y1 != y[:, n0:]).float().mean())}
            except Exception as exc:  # noqa: BLE001
                row[label + " error"] = repr(exc)[:300]
        entry["rows"][m] = row
        best = min((v, k) for k, v in row.items() if isinstance(v, float) and ("seq" in k or "concurrent" in k))
        print(name, m, "one", round(row["one_launch"], 1), "main", round(row["main_only"], 1), "best", best,
              round(time.time() - t_start), flush=True)
        Path(out).write_text(json.dumps(result, indent=1))
    del mmas, mains, rests, w, w12
    torch.cuda.empty_cache()
