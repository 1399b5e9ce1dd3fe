"""The wide W12 kernel with more warpgroup MMAs in flight: four A register sets (one a 32-column block of a chunk) and
a wait that leaves three commit groups pending, against the library's two sets and one pending group, at 48-128 rows.

    PYTHONPATH=kernels:. python benchmarks/probes/w12-wide-depth-h200-2026-12-02/harness.py --out RESULT.json

Why: the producer-feed probe (w12-wide-feed-h200-2026-12-02.json) found the loop without any copies already far slower
than cuBLAS, growing with the slab's token tiles, so the question is whether the MMAs' issue depth is the limit. The
variant is a textual patch of the library's w12_wide.cu (a slot is then released after the chunk's last block, whose
MMAs the deeper wait guarantees only there). Both builds run side by side; each setting's outputs are compared bit for
bit with the library's choice. Timing as the device check: CUDA-graph replay over rotating copies > L2, median of 12.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
from cuda_timing import graph_replay_us  # noqa: E402

from specpilot_kernels.cuda_extension import load_cuda_extension  # noqa: E402
from specpilot_kernels.w12 import encode  # noqa: E402
from specpilot_kernels.w12 import mma as mma_module  # noqa: E402
from specpilot_kernels.w12.mma import (  # noqa: E402
    CSRC,
    SOURCES,
    MmaConfig,
    select_mma_config,
    to_mma_layout,
    w12_mma_gemm,
)
from specpilot_mem.provenance import result_header, write_result  # noqa: E402

SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "down": (5120, 17408), "gate_up": (34816, 5120)}
ROWS = (48, 64, 128)
LARGEST = (8, 16, 32)  # largest slab (token tiles) a bucket: one slab at every row count, each weight decoded once
# (warpgroups, slots, stages): the same setting in every bucket
SETTINGS = {
    "g1_s2_w2": (1, 2, 2),
    "g1_s3_w2": (1, 3, 2),
    "g1_s4_w3": (1, 4, 3),
    "g2_s2_w2": (2, 2, 2),
    "g2_s3_w2": (2, 3, 2),
    "g2_s4_w2": (2, 4, 2),
}
DEEP = [
    (
        "    uint32_t a[2][1][8];  // two register sets",
        "    uint32_t a[4][1][8];  // four register sets",
    ),
    ("        uint32_t(&set)[1][8] = a[u & 1];", "        uint32_t(&set)[1][8] = a[u];"),
    (
        "        ptx::wgmma_wait<1>();\n        fence_accumulators(d);",
        "        ptx::wgmma_wait<3>();\n        fence_accumulators(d);",
    ),
    (
        "        if (u == 1 && i > 0) {  // chunk i - 1's MMAs are done",
        "        if (u == 3 && i > 0) {  // chunk i - 1's MMAs are done",
    ),
]


def prepare(name: str, patches: list[tuple[str, str]], work: Path) -> Path:
    folder = work / name
    shutil.copytree(CSRC, folder)
    wide = folder / "w12_wide.cu"
    text = wide.read_text()
    for old, new in patches:
        if old not in text:
            raise SystemExit(f"variant {name}: the text to patch is not in w12_wide.cu: {old!r}")
        text = text.replace(old, new)
    wide.write_text(text)
    return folder


def build_in_worker(name: str, folder: Path) -> str:
    try:
        load_cuda_extension(f"w12depth_{name}", folder, SOURCES)
    except Exception as exc:  # noqa: BLE001 - reported when the main process loads it
        return f"{type(exc).__name__}: {exc}"[:300]
    return ""


def with_setting(base: MmaConfig, setting: tuple[int, int, int]) -> MmaConfig:
    return replace(base, wide_rows=tuple((*setting, top) for top in LARGEST))


def timed(fn, copies: int) -> float:
    return graph_replay_us(fn, copies, max(copies, 8), 12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    real_loader = mma_module.load_cuda_extension
    with tempfile.TemporaryDirectory() as work:
        folders = {name: prepare(name, patches, Path(work)) for name, patches in (("as_is", []), ("deep", DEEP))}
        start = time.perf_counter()
        context = multiprocessing.get_context("spawn" if torch.cuda.is_initialized() else "fork")
        with ProcessPoolExecutor(len(folders), mp_context=context) as pool:
            failed = dict(zip(folders, pool.map(build_in_worker, folders, folders.values())))
        doc = {
            **result_header("w12_wide_depth"),
            "method": "CUDA-graph replay over rotating copies >= 4 x 60 MB, median of 12; each setting's outputs "
            "compared bit for bit with the library's choice",
            "build_s": time.perf_counter() - start,
            "build_errors": {k: v for k, v in failed.items() if v},
            "settings": {name: list(s) for name, s in SETTINGS.items()},
            "largest_slab_tiles": list(LARGEST),
            "shapes": {},
        }
        print(f"built in {doc['build_s']:.0f} s", failed, file=sys.stderr, flush=True)
        exts = {
            name: load_cuda_extension(f"w12depth_{name}", folder, SOURCES)
            for name, folder in folders.items()
            if not failed[name]
        }
        device = torch.device("cuda")
        for name, (n, k) in SHAPES.items():
            torch.manual_seed(0)
            w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
            one = to_mma_layout(encode(w))
            copies = max(1, math.ceil(4 * 60 * 2**20 / one.nbytes()))
            mmas = [one] + [
                mma_module.W12MmaTensor(
                    one.shape,
                    one.padded_shape,
                    *(t.clone() for t in (one.view, one.nibbles, one.base, one.esc_tile, one.esc_chunk, one.esc_entry)),
                )
                for _ in range(copies - 1)
            ]
            bf16 = [w.t()] + [w.clone().t() for _ in range(max(1, math.ceil(4 * 60 * 2**20 / (2 * n * k))) - 1)]
            library = select_mma_config(n, k, device)
            entry = {"N": n, "K": k, "w12_bytes": one.nbytes(), "library": asdict(library), "rows": {}}
            doc["shapes"][name] = entry
            for m in ROWS:
                x = torch.randn(m, k, device="cuda").bfloat16()
                y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                mma_module.load_cuda_extension = lambda *a: exts["as_is"]
                ref = w12_mma_gemm(x, mmas[0], config=library)
                row = {
                    "cublas_us": timed(lambda i, x=x, y=y, b=bf16: torch.matmul(x, b[i], out=y), len(bf16)),
                    "library_us": timed(
                        lambda i, x=x, y=y, t=mmas, c=library: w12_mma_gemm(x, t[i], config=c, out=y), copies
                    ),
                    "settings": {},
                }
                for ext_name, ext in exts.items():
                    mma_module.load_cuda_extension = lambda *a, e=ext: e
                    for sname, setting in SETTINGS.items():
                        config = with_setting(library, setting)
                        key = sname if ext_name == "as_is" else f"{ext_name}_{sname}"
                        try:
                            ran = []
                            got = w12_mma_gemm(x, mmas[0], config=config, launched=ran)
                            torch.cuda.synchronize()
                            us = timed(
                                lambda i, x=x, y=y, c=config, t=mmas: w12_mma_gemm(x, t[i], config=c, out=y), copies
                            )
                            result = {"us": us, "vs_cublas": row["cublas_us"] / us, "launched": ran}
                            result["bits_equal_library"] = bool(torch.equal(got, ref))
                        except RuntimeError as exc:
                            result = {"error": str(exc)[:200]}
                        row["settings"][key] = result
                mma_module.load_cuda_extension = real_loader
                entry["rows"][str(m)] = row
                best = min(
                    ((k2, r["us"]) for k2, r in row["settings"].items() if "us" in r and True),
                    key=lambda kv: kv[1],
                    default=("none", float("nan")),
                )
                print(
                    f"{name} {m}: cuBLAS {row['cublas_us']:.1f} library {row['library_us']:.1f} best {best[0]} "
                    f"{best[1]:.1f} ({row['cublas_us'] / best[1]:.2f}x)",
                    flush=True,
                )
                write_result(doc, args.out)
    bad = [
        f"{s} {m} {k2}"
        for s, e in doc["shapes"].items()
        for m, r in e["rows"].items()
        for k2, v in r["settings"].items()
        if v.get("bits_equal_library") is False
    ]
    print(f"bits: {'all equal the library' if not bad else 'MISMATCH ' + ', '.join(bad)}")


if __name__ == "__main__":
    main()
