"""A/B of the certified head's INT8 pass: the working tree (which keeps each row's incumbent) against HEAD's
(.gpu/variants_ch/head), same process, interleaved ABBA rounds, CUDA-graph replay over 2 head copies; the lists'
contents compared. argv: OUT."""
import json, statistics, sys, time
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
from cuda_timing import graph_replay_us
from specpilot_kernels.cuda_extension import load_cuda_extension
from specpilot_kernels.certified_head import quantize_head
from specpilot_kernels.certified_head.cuda_pass import STAGE_FACTOR, _extension, default_cuda_config
from specpilot_kernels.certified_head.fragments import token_tiles
from specpilot_kernels.certified_head.reference import BOUND_SLACK, NORM_INFLATION

new = _extension()
old = load_cuda_extension("ch_head_ab", Path(".gpu/variants_ch/head"), ("binding.cpp", "int8_pass.cu", "exact_head.cu"))

def make_lists(x, cap=4096):
    M, K = x.shape
    d = x.device
    return dict(x16=torch.empty((K // 32, token_tiles(M), 32, 8), dtype=torch.float16, device=d),
                inv=torch.empty(M, device=d), norm=torch.empty(M, device=d), best=torch.empty(M, device=d),
                sc=torch.empty(M, dtype=torch.int32, device=d),
                si=torch.empty((M, STAGE_FACTOR * cap), dtype=torch.int32, device=d),
                su=torch.empty((M, STAGE_FACTOR * cap), device=d), inc=torch.empty(M, dtype=torch.int64, device=d),
                count=torch.empty(M, dtype=torch.int32, device=d), ci=torch.empty((M, cap), dtype=torch.int32, device=d),
                cu=torch.empty((M, cap), device=d))

def run(ext, x, head, L, with_incumbent):
    c = default_cuda_config(x.shape[0])
    pre = (x, L["x16"], L["inv"], L["norm"], head.fragments, head.scale, head.radius_coef, L["best"], L["sc"], L["si"],
           L["su"]) + ((L["inc"],) if with_incumbent else ()) + (L["count"], L["ci"], L["cu"])
    ext.int8_pass(*pre, BOUND_SLACK, NORM_INFLATION, c.tiles_per_warp, c.warps_per_block, c.stages, c.warps_per_sm,
                  c.shared_activations, c.chunks_per_barrier, True)

torch.manual_seed(0)
w = (torch.randn(248320, 5120, device="cuda") * 0.02).bfloat16()
heads = [quantize_head(w), quantize_head(w.clone())]
del w
out = {"date": time.strftime("%Y-%m-%d %H:%M"), "device": torch.cuda.get_device_name(), "rows": {}}
t0 = time.time()
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
while time.time() - t0 < 6:
    a @ a
torch.cuda.synchronize()
del a
for m in (1, 8, 16, 32):
    xs = [torch.randn(m, 5120, device="cuda").bfloat16() for _ in range(2)]
    Ls = [make_lists(x) for x in xs]
    Lo = [make_lists(x) for x in xs]
    run(new, xs[0], heads[0], Ls[0], True)
    run(old, xs[0], heads[0], Lo[0], False)
    torch.cuda.synchronize()
    same = bool(torch.equal(Ls[0]["count"], Lo[0]["count"]) and torch.equal(Ls[0]["best"], Lo[0]["best"]))
    rounds = {"new": [], "head": []}
    for r in range(9):
        for name in (["new", "head"] if r % 2 == 0 else ["head", "new"]):
            ext, L, inc = (new, Ls, True) if name == "new" else (old, Lo, False)
            rounds[name].append(round(graph_replay_us(lambda i: run(ext, xs[i], heads[i], L[i], inc), 2), 2))
    diff = [a - b for a, b in zip(rounds["new"], rounds["head"])]
    out["rows"][m] = {"same_counts_and_bounds": same, "us": rounds, "median_new": statistics.median(rounds["new"]),
                      "median_head": statistics.median(rounds["head"]), "median_paired_diff": statistics.median(diff),
                      "new_faster_rounds": sum(d < 0 for d in diff)}
    print(m, json.dumps(out["rows"][m]), flush=True)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
