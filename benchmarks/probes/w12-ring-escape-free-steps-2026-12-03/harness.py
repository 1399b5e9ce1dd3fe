"""A/B on the H200, one process: the ring kernel (csrc/w12_shared_x.cu, 17-32 rows) and the per-warp kernel's staged
launches (csrc/w12_warp.cu, 1-16 rows) with a chunk's escape-free steps as their own branch-free code (the working
tree) against the files before that change (w12_shared_x_before.cu, csrc/w12_shared_x.cu at commit 40bcd21, and
w12_warp_before.cu, csrc/w12_warp.cu at b4e519c, beside this harness at 72c96c3: `git show 40bcd21:kernels/specpilot_kernels/w12/csrc/w12_shared_x.cu`
recreates one; built as a second extension from a copy of csrc/), on each shape's committed config at
1-32 rows, escape-free and at 1e-2 escapes. Bits of the two must be equal. Method of benchmarks/w12_device_check.py
(CUDA-graph replay over rotating copies > L2, median of 12), the two extensions timed alternately.

    PYTHONPATH=kernels:. python benchmarks/probes/w12-ring-escape-free-steps-2026-12-03/harness.py OUT.json

Ran in call 2 of 2026-12-03 (the lead's tree 4f0252b, this branch's 72c96c3, whose working tree held the branch-free
variant; reverted after it, so run it at that commit): the variant 1-3% slower on every shape and row count, result
benchmarks/archive/results/w12-ring-escape-free-steps-call2-h200-2026-12-03.json.
"""

import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.w12_device_check import Shape, bits, shape_dims
from specpilot_kernels.cuda_extension import load_cuda_extension
from specpilot_kernels.w12 import mma as M
from specpilot_mem.provenance import result_header, write_result

HERE = Path(__file__).parent
SHAPES = sys.argv[2].split(",") if len(sys.argv) > 2 else ["5120x6144", "down", "qkv", "o_proj"]
ROWS = (1, 8, 17, 24, 25, 32)  # 1-8: the staged per-warp kernel, 17-32: the ring kernel
ESCAPE_ROWS = (8, 24, 32)

start = time.perf_counter()
new = load_cuda_extension("specpilot_w12_mma", M.CSRC, M.SOURCES)
before_dir = Path(tempfile.mkdtemp()) / "csrc_before"
shutil.copytree(M.CSRC, before_dir)
shutil.copy(HERE / "w12_shared_x_before.cu", before_dir / "w12_shared_x.cu")
shutil.copy(HERE / "w12_warp_before.cu", before_dir / "w12_warp.cu")
before = load_cuda_extension("w12_ring_before", before_dir, M.SOURCES)
exts = {"escape_free_steps": new, "before": before}
doc = {**result_header("w12_ring_escape_free_steps"), "build_s": time.perf_counter() - start, "shapes": {}}


def use(name: str) -> None:
    M.load_cuda_extension = lambda *args, **kwargs: exts[name]  # w12_mma_gemm asks for its extension at each call


for name in SHAPES:
    shape = Shape(name, *shape_dims(name))
    config = M.select_mma_config(shape.n, shape.k, torch.device("cuda"))
    entry = {"config": asdict(config), "rows": {}, "escapes_0.01": {}, "bits_equal": True}
    x = torch.randn(32, shape.k, device="cuda").bfloat16()
    for fraction in (0.0, 0.01):
        mma = shape.mma(fraction)[0]
        for m in ROWS:
            out = {}
            for ext in exts:
                use(ext)
                out[ext] = bits(M.w12_mma_gemm(x[:m], mma, config=config))
            entry["bits_equal"] &= bool(torch.equal(out["before"], out["escape_free_steps"]))
        for m in ROWS if fraction == 0 else ESCAPE_ROWS:
            times = {}
            for _ in range(2):  # alternate, keep each one's best
                for ext in exts:
                    use(ext)
                    t = shape.w12_us(m, fraction, config)
                    times[ext] = min(times.get(ext, t), t)
            key = "rows" if fraction == 0 else "escapes_0.01"
            entry[key][m] = {**times, "ratio": times["escape_free_steps"] / times["before"]}
            print(name, key, m, {k: round(v, 2) for k, v in entry[key][m].items()}, flush=True)
    entry["cublas_us"] = {m: shape.cublas_us(m) for m in ROWS}
    doc["shapes"][name] = entry
    write_result(doc, Path(sys.argv[1]))
    del shape
    torch.cuda.empty_cache()
write_result(doc, Path(sys.argv[1]))
