"""A/B on the H200: the working tree's W12 kernel (v19) against HEAD's (v18, built from .gpu/v18csrc), through the
same Python path (regions, tails), one process; bits compared row for row.

    PYTHONPATH=kernels:.:benchmarks python3 .gpu/ab19.py OUT.json [shapes] [rows]
"""
import json, math, sys, time
from dataclasses import asdict, replace
from pathlib import Path
import torch
from cuda_timing import graph_replay_us
from specpilot_kernels.cuda_extension import load_cuda_extension
from specpilot_kernels.w12 import mma as M
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import select_mma_config, to_mma_layout, w12_mma_gemm

SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408),
          "lm_head": (248320, 5120)}
L2 = 60 << 20
out_path = sys.argv[1]
shapes = sys.argv[2].split(",") if len(sys.argv) > 2 else list(SHAPES)
rows_list = [int(r) for r in sys.argv[3].split(",")] if len(sys.argv) > 3 else [16, 32, 48, 64]
t0 = time.time()
VERSIONS = {"v18": ".gpu/v18csrc", "v19": None}  # None: the working tree
exts = {v: load_cuda_extension("w12_" + v, Path(d).resolve(), ("binding.cpp", "w12_mma.cu")) if d else
        load_cuda_extension("specpilot_w12_mma", M.CSRC, ("binding.cpp", "w12_mma.cu")) for v, d in VERSIONS.items()}
real_loader = M.load_cuda_extension
res = {"build_s": time.time() - t0, "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
       "shapes": {}}
print("built", res["build_s"], flush=True)

def use(version):
    M.load_cuda_extension = lambda *a, **k: exts[version]

bw_buf = torch.randn(2**31, device="cuda", dtype=torch.bfloat16)
ts = []
for _ in range(12):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); bw_buf.sum(dtype=torch.float32); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
read_bw = bw_buf.numel() * 2 / sorted(ts)[6]; del bw_buf
res["read_bw_TBps"] = read_bw / 1e12

for name in shapes:
    n, k = SHAPES[name]
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w[3, 5] = 0; w[40, 1000] = 1e-39; w[n - 5, 77] = 3e-8  # escapes, one in a tail
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    wts = [w.t()] + [w.clone().t() for _ in range(max(2, math.ceil(4 * L2 / (n * k * 2))) - 1)]
    base = select_mma_config(n, k, torch.device("cuda"))
    entry = {"config": asdict(base), "floor_us": w12.nbytes() / read_bw * 1e6, "rows": {}}
    res["shapes"][name] = entry
    for m in rows_list:
        slot = 0 if m <= 16 else 1 if m <= 32 else 2
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        row = {"cublas_us": graph_replay_us(lambda i: torch.matmul(x, wts[i], out=y), len(wts), max(len(wts), 8), 15)}
        options = {"per_warp": replace(base, wgmma=(0, 0, 0))}
        for g in (1, 2, 4):
            if 4 * g * base.warps_k <= 32:
                options[f"wg{g}"] = replace(base, wgmma=tuple(g if i == slot else 0 for i in range(3)))
        for key, cfg in options.items():
            outs = {}
            for rep in range(2):
                for version in (VERSIONS if key != "per_warp" else ("v18",)):
                    use(version)
                    launched = []
                    outs[version] = w12_mma_gemm(x, mmas[0], config=cfg, launched=launched).view(torch.int16)
                    t = graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=cfg, out=y), copies, max(copies, 8), 15)
                    row.setdefault(f"{key}_{version}_us", []).append(round(t, 2))
                    row[f"{key}_{version}_launched"] = launched
            row[f"{key}_bits_equal"] = all(torch.equal(outs["v18"], o) for o in outs.values())
        # the per-warp kernel is the same in every version
        best = {v: min([min(row["per_warp_v18_us"])] + [min(row[f"{key}_{v}_us"]) for key in options
                                                       if f"{key}_{v}_us" in row]) for v in VERSIONS}
        row["best"] = best
        row["floor_pct"] = {v: round(100 * entry["floor_us"] / best[v], 1) for v in best}
        row["speedup"] = {v: round(row["cublas_us"] / best[v], 3) for v in best}
        entry["rows"][m] = row
        print(name, m, json.dumps(row), flush=True)
        Path(out_path).write_text(json.dumps(res, indent=1))
    del mmas, wts
    torch.cuda.empty_cache()
M.load_cuda_extension = real_loader
