"""Probe: does the K imbalance between a block's warps (40 chunks over 3 warps: 14/13/13) cost time? Time the same
partition at K of 39, 40, 41, 42 chunks (N = 10240, and o_proj-like N = 5120 with 2 splits) and compare with bytes."""
import json, math, sys
import torch
sys.path.insert(0, "benchmarks")
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import MmaConfig, to_mma_layout, w12_mma_gemm

out = []
for n, chunks_list, cfg in [(10240, (39, 40, 41, 42, 36), MmaConfig(1, 3, 1, plan_32=(2, 1), staged_rows=16)),
                            (5120, (62, 64, 66, 60), MmaConfig(1, 3, 2, plan_32=(2, 1), staged_rows=16))]:
    for chunks in chunks_list:
        k = chunks * 128
        torch.manual_seed(0)
        w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
        w12 = encode(w, check=False)
        copies = max(2, math.ceil(4 * 60 * 2**20 / w12.nbytes()))
        mmas = [to_mma_layout(encode(w, check=False)) for _ in range(copies)]
        row = {"N": n, "K": k, "chunks": chunks, "config": [cfg.warps_n, cfg.warps_k, cfg.splits], "bytes": w12.nbytes()}
        for m in (1, 8, 16, 32):
            x = torch.randn(m, k, device="cuda").bfloat16()
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            row[f"us_{m}"] = min(graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies,
                                                 max(copies, 8), 15) for _ in range(2))
        print(json.dumps(row), flush=True)
        out.append(row)
        del mmas
        torch.cuda.empty_cache()
json.dump(out, open(sys.argv[1], "w"), indent=1)
