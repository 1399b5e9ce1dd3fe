"""A/B: warpgroup-MMA W12 kernel vs the per-warp kernel (bits and time), one process."""
import json, math, os, sys, time
from dataclasses import asdict, replace
sys.path[:0] = ["kernels", "benchmarks", "."]
import torch
from cuda_timing import graph_replay_us
from specpilot_kernels.w12 import encode
from specpilot_kernels.w12.mma import MmaConfig, select_mma_config, to_mma_layout, w12_mma_gemm
from specpilot_kernels.w12.reference import gemm_reference

OUT = os.environ.get("OUT", "/tmp")
res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M")}
def log(*a): print(*a, flush=True)
def save(): json.dump(res, open(os.path.join(OUT, "wg_ab.json"), "w"), indent=1)

# 1. correctness: escapes beyond a window, rows past m, K splits in a cluster and through the workspace, Q pass
torch.manual_seed(1)
n, k = 1000, 1536
w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
w[5, 7] = 0; w[9, 100] = 1e-39; w[300, 700] = 3.0e-8; w[480:496, 256:900] = 0
w[700, :] = (torch.randn(k, device="cuda") * 1e-39).bfloat16()
w12 = encode(w); mma = to_mma_layout(w12)
corr = {}
for cfg in ((MmaConfig(4, 1, 1), MmaConfig(2, 4, 3), MmaConfig(1, 8, 2), MmaConfig(1, 3, 1), MmaConfig(1, 2, 6),
            MmaConfig(2, 2, 1, (2, 2), (2, 2))) if os.environ.get("CORRECTNESS", "1") == "1" else ()):
    for wg, st in (((1, 1, 1), 0), ((2, 2, 2), 0), ((1, 1, 1), 2), ((1, 1, 1), 3), ((2, 2, 1), 4), ((3, 3, 1), 3)):
        if 4 * max(wg) * cfg.warps_k > 32:
            continue
        key = f"n{cfg.warps_n}k{cfg.warps_k}s{cfg.splits}_wg{wg}_st{st}"
        try:
            ok, errs = True, {}
            for lb in ("exact", "truncated", "midpoint"):
                for m in (9, 16, 17, 24, 32, 33, 64):
                    x = torch.randn(m, k, device="cuda").bfloat16()
                    a = w12_mma_gemm(x, mma, config=cfg, low_bits=lb)
                    b = w12_mma_gemm(x, mma, config=replace(cfg, wgmma=wg, wgmma_stages=st), low_bits=lb)
                    same = torch.equal(a.view(torch.int16), b.view(torch.int16))
                    ok &= same
                    if lb == "exact":
                        ref = gemm_reference(x, w12).float()
                        errs[m] = ((b.float() - ref).norm() / ref.norm()).item()
                    if not same:
                        errs[f"{lb}{m}_mismatch"] = int((a.view(torch.int16) != b.view(torch.int16)).sum())
            corr[key] = {"bits_equal": ok, "rel_err": errs}
        except Exception as exc:
            corr[key] = {"error": repr(exc)[:300]}
        log(key, corr[key])
res["correctness"] = corr
save()

# 2. timing on the shapes
SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "gate_up": (34816, 5120), "down": (5120, 17408),
          "lm_head": (248320, 5120)}
L2 = 60 * 2**20
bw_buf = torch.randn(2**31, device="cuda", dtype=torch.bfloat16)
for _ in range(3): bw_buf.sum(dtype=torch.float32)
ts = []
for _ in range(10):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); bw_buf.sum(dtype=torch.float32); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) / 1e3)
read_bw = bw_buf.numel() * 2 / sorted(ts)[5]; del bw_buf
res["read_bw_TBps"] = read_bw / 1e12
rows_list = [int(r) for r in os.environ.get("ROWS", "16,32,64").split(",")]
variants = [tuple(map(int, v.split(":"))) for v in os.environ.get("VARIANTS", "1:0,1:2,1:3,1:4,2:3").split(",")]
timing = {}
for name in os.environ.get("SHAPES", "qkv,o_proj,gate_up,down,lm_head").split(","):
    N, K = SHAPES[name]
    torch.manual_seed(0)
    wt = (torch.randn(N, K, device="cuda") * 0.02).bfloat16()
    t0 = encode(wt, check=False)
    copies = max(2, math.ceil(4 * L2 / t0.nbytes()))
    mmas = [to_mma_layout(t0)] + [to_mma_layout(encode(wt, check=False)) for _ in range(copies - 1)]
    floor_us = t0.nbytes() / read_bw * 1e6
    del t0
    cfg = select_mma_config(N, K, torch.device("cuda"))
    out = {"config": asdict(cfg), "floor_us": floor_us}
    for m in rows_list:
        x = torch.randn(m, K, device="cuda").bfloat16()
        y = torch.empty(m, N, device="cuda", dtype=torch.bfloat16)
        def t(c):
            return graph_replay_us(lambda i: w12_mma_gemm(x, mmas[i], config=c, out=y), copies, max(copies, 8), 15)
        base = t(cfg)
        ref = w12_mma_gemm(x, mmas[0], config=cfg).view(torch.int16)
        row = {"per_warp_us": base}
        slot = 0 if m <= 16 else 1 if m <= 32 else 2
        for g, st in variants:
            if 4 * g * cfg.warps_k > 32:
                continue
            wg = [0, 0, 0]; wg[slot] = g
            c = replace(cfg, wgmma=tuple(wg), wgmma_stages=st)
            key = f"wg{g}_st{st}"
            try:
                row[f"{key}_us"] = t(c)
                row[f"{key}_bits_equal"] = torch.equal(w12_mma_gemm(x, mmas[0], config=c).view(torch.int16), ref)
            except Exception as exc:
                row[f"{key}_error"] = repr(exc)[:200]
        row["per_warp_again_us"] = t(cfg)
        out[m] = row
        log(name, m, row, "floor", floor_us)
    timing[name] = out
    res["timing"] = timing
    save()
    del mmas
    torch.cuda.empty_cache()
