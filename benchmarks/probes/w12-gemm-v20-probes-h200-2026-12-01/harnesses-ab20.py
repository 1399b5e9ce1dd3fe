"""A/B on the H200: W12 kernel versions (source dirs) through the same Python path (regions, tails, tuned configs),
one process, interleaved twice; bits compared row for row. Also gate_up's two row regions timed alone, and each
measurement's wall-clock window (to match against an nvidia-smi clock log).

    PYTHONPATH=kernels:.:benchmarks python3 .gpu/ab20.py OUT.json VERSIONS SHAPE:ROWS[;SHAPE:ROWS...]
    VERSIONS: name=dir,... (dir '-' = the working tree)
"""
import json, math, sys, time
from dataclasses import asdict
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
VERSIONS = dict(v.split("=") for v in sys.argv[2].split(","))
REPS = int(sys.argv[4]) if len(sys.argv) > 4 else 2
plan = [(s.split(":")[0], [int(r) for r in s.split(":")[1].split(",")]) for s in sys.argv[3].split(";")]
t0 = time.time()
exts = {v: load_cuda_extension("w12_" + v, Path(d).resolve(), ("binding.cpp", "w12_mma.cu")) if d != "-" else
        load_cuda_extension("specpilot_w12_mma", M.CSRC, ("binding.cpp", "w12_mma.cu")) for v, d in VERSIONS.items()}
real_loader = M.load_cuda_extension
res = {"build_s": time.time() - t0, "device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M"),
       "versions": VERSIONS, "shapes": {}}
print("built", res["build_s"], flush=True)


def use(version):
    M.load_cuda_extension = lambda *a, **k: exts[version]


def timed(fn, copies):
    start = time.time()
    us = graph_replay_us(fn, copies, max(copies, 8), 15)
    return round(us, 2), [round(start, 2), round(time.time(), 2)]


bw_buf = torch.randn(2**31, device="cuda", dtype=torch.bfloat16)
ts = []
for _ in range(12):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); bw_buf.sum(dtype=torch.float32); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
read_bw = bw_buf.numel() * 2 / sorted(ts)[6]; del bw_buf
res["read_bw_TBps"] = read_bw / 1e12

for name, rows_list in plan:
    n, k = SHAPES[name]
    torch.manual_seed(0)
    w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w[3, 5] = 0; w[40, 1000] = 1e-39; w[n - 5, 77] = 3e-8  # escapes, one in a tail
    w12 = encode(w, check=False)
    copies = max(2, math.ceil(4 * L2 / w12.nbytes()))
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(w, check=False)) for _ in range(copies - 1)]
    wts = [w.t()] + [w.clone().t() for _ in range(max(2, math.ceil(4 * L2 / (n * k * 2))) - 1)]
    base = select_mma_config(n, k, torch.device("cuda"))
    regions = base.regions(n)
    entry = {"config": asdict(base), "floor_us": w12.nbytes() / read_bw * 1e6, "rows": {}}
    res["shapes"][name] = entry
    for m in rows_list:
        x = torch.randn(m, k, device="cuda").bfloat16()
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        row = {}
        row["cublas_us"], row["cublas_window"] = timed(lambda i: torch.matmul(x, wts[i], out=y), len(wts))
        outs = {}
        order = list(VERSIONS)
        for rep in range(REPS):
            for version in order[rep % len(order):] + order[:rep % len(order)]:  # each version first once
                use(version)
                outs[version] = w12_mma_gemm(x, mmas[0], config=base).view(torch.int16)
                t, window = timed(lambda i: w12_mma_gemm(x, mmas[i], config=base, out=y), copies)
                row.setdefault(f"{version}_us", []).append(t)
                row.setdefault(f"{version}_window", []).append(window)
                if len(regions) > 1:  # each row region alone
                    for r, (a, b, cfg) in enumerate(regions):
                        yr = torch.empty(m, b - a, device="cuda", dtype=torch.bfloat16)
                        parts = [mm.rows(a, b) for mm in mmas]
                        t, _ = timed(lambda i: w12_mma_gemm(x, parts[i], config=cfg, out=yr), copies)
                        row.setdefault(f"{version}_region{r}_us", []).append(t)
        first = next(iter(VERSIONS))
        row["bits_equal"] = all(torch.equal(outs[first], o) for o in outs.values())
        row["floor_pct"] = {v: round(100 * entry["floor_us"] / min(row[f"{v}_us"]), 1) for v in VERSIONS}
        row["speedup"] = {v: round(row["cublas_us"] / min(row[f"{v}_us"]), 3) for v in VERSIONS}
        entry["rows"][m] = row
        print(name, m, json.dumps({k2: v2 for k2, v2 in row.items() if "window" not in k2}), flush=True)
        Path(out_path).write_text(json.dumps(res, indent=1))
    del mmas, wts
    torch.cuda.empty_cache()
M.load_cuda_extension = real_loader
