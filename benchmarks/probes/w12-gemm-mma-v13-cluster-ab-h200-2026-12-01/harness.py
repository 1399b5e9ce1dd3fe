"""A/B of W12 mma kernel sources in one process: .gpu/variants/<name>/ (csrc copies) against the current csrc, each
built as its own extension, with each shape's tuned config; CUDA-graph replay over rotating copies; bits compared."""
import json, math, sys, time
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
from cuda_timing import graph_replay_us
from specpilot_kernels.cuda_extension import load_cuda_extension
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import CSRC, to_mma_layout, select_mma_config

exts = {"new": load_cuda_extension("w12ab_new", CSRC, ("binding.cpp", "w12_mma.cu"))}
for d in sorted(Path(".gpu/variants").iterdir()):
    exts[d.name] = load_cuda_extension(f"w12ab_{d.name}", d, ("binding.cpp", "w12_mma.cu"))
print("built", list(exts), flush=True)

import os
EXTRA_PLANS = {}  # W12AB_PLANS="32:4,1;32:2,2": more step plans timed at those row counts
for item in filter(None, os.environ.get("W12AB_PLANS", "").split(";")):
    rows, plan = item.split(":")
    EXTRA_PLANS.setdefault(int(rows), []).append(tuple(int(v) for v in plan.split(",")))

def call(ext, x, mma, cfg, y, ws, plan):
    n, k = mma.shape
    np_, kp = mma.padded_shape
    ext.w12_mma_gemm(x, mma.view, mma.nibbles, mma.base, mma.esc_ptr, mma.esc_loc, mma.esc_val, y, ws, n, np_, kp,
                     cfg.warps_n, cfg.warps_k, cfg.chunks_per_split(kp), *plan, 1, 0)  # plan: blocks, tiles, staged

SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408), "lm_head": (248320, 5120)}
ROWS = [int(r) for r in sys.argv[2].split(",")] if len(sys.argv) > 2 else [1, 16, 32, 64]
out = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(), "variants": list(exts), "cases": []}
for sname, (n, k) in SHAPES.items():
    if os.environ.get("W12AB_SHAPES") and sname not in os.environ["W12AB_SHAPES"].split(","):
        continue
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * 60 * 2**20 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    cfg = select_mma_config(n, k, torch.device("cuda"))
    for m, plan in [(m, p) for m in ROWS for p in [(*cfg.step_plan(m), int(cfg.stages_weights(m)))] + EXTRA_PLANS.get(m, [])]:
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        per = cfg.chunks_per_split(w12.padded_shape[1]); splits = -(-(w12.padded_shape[1] // 128) // per)
        ws = torch.empty(splits * m * n if splits > 1 else 0, device="cuda")
        row = {"shape": sname, "M": m, "config": [cfg.warps_n, cfg.warps_k, cfg.splits, list(plan)]}
        call(exts["new"], x, mmas[0], cfg, y, ws, (*cfg.step_plan(m), 0))  # reference bits: the current csrc, default plan
        ref = y.clone().view(torch.int16)
        for rep in range(2):
            for name, ext in exts.items():
                try:
                    call(ext, x, mmas[0], cfg, y, ws, plan)
                except RuntimeError as error:  # a plan this build does not have
                    row[f"error_{name}"] = str(error).splitlines()[0][:80]
                    continue
                bits = y.clone().view(torch.int16)
                row[f"bits_equal_{name}"] = bool(torch.equal(bits, ref))
                t = graph_replay_us(lambda i: call(ext, x, mmas[i], cfg, y, ws, plan), copies, max(copies, 8), 15)
                row.setdefault(f"us_{name}", []).append(round(t, 2))
        if os.environ.get("W12AB_NOSPLIT") and ws.numel():  # probe: the main kernel alone (no split reduction; wrong y)
            empty = torch.empty(0, device="cuda")
            row["us_main_only"] = [round(graph_replay_us(lambda i: call(exts["new"], x, mmas[i], cfg, y, empty, plan), copies,
                                                         max(copies, 8), 15), 2) for _ in range(2)]
        out["cases"].append(row)
        print(json.dumps(row), flush=True)
    del mmas
    torch.cuda.empty_cache()
    json.dump(out, open(sys.argv[1], "w"), indent=1)
