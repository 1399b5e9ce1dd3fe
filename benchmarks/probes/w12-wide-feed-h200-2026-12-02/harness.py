"""The wide W12 kernel's activation feed: the block's first thread refilling on release (as tuned) against a
producer warp (whole-, half- or quarter-chunk slots, with or without multicast), across warpgroups, slots and stages, at
48-256 rows.

    PYTHONPATH=kernels:. python benchmarks/probes/w12-wide-feed-h200-2026-12-02/harness.py --out RESULT.json

The library's csrc/ is built as it is (every variant below is a launch setting of it, none changes a bit: each one's
outputs are compared with the library's own choice, bit for bit) and once more with the producer's copies and the MMA
warps' waits for them taken out ("no_ring", wrong products, three producer settings: its times say what the ring
costs), and a third time without the weight copies either ("no_feed": decode, escapes and MMAs alone). Both builds run side
by side in worker processes before anything is timed. Timing as the device check: CUDA-graph replay over rotating
copies > L2, median of 12, cuBLAS BF16 beside each.
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
    WIDE_FEEDS,
    MmaConfig,
    select_mma_config,
    to_mma_layout,
    w12_mma_gemm,
)
from specpilot_mem.provenance import result_header, write_result  # noqa: E402

SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "down": (5120, 17408), "gate_up": (34816, 5120)}
ROWS = (48, 64, 128, 256)
LARGEST = (8, 16, 32)  # largest slab (token tiles) a bucket: one slab at every row count, each weight decoded once
COPIER, PRODUCER = WIDE_FEEDS["copier"], WIDE_FEEDS["producer"]
HALVES, QUARTERS = WIDE_FEEDS["producer_halves"], WIDE_FEEDS["producer_quarters"]
# (warpgroups, slots, stages, multicast, feed): the same setting in every bucket
SETTINGS = {
    "copier_g2_s2_w2": (2, 2, 2, 1, COPIER),
    "producer_g2_s2_w2": (2, 2, 2, 1, PRODUCER),
    "producer_g2_s3_w2": (2, 3, 2, 1, PRODUCER),
    "producer_g4_s3_w2": (4, 3, 2, 1, PRODUCER),
    "halves_g2_s4_w2": (2, 4, 2, 1, HALVES),
    "halves_g2_s6_w2": (2, 6, 2, 1, HALVES),
    "halves_g4_s4_w2": (4, 4, 2, 1, HALVES),
    "halves_g2_s4_w3": (2, 4, 3, 1, HALVES),
    "halves_g1_s4_w3": (1, 4, 3, 1, HALVES),
    "halves_g2_s4_w2_mc2": (2, 4, 2, 2, HALVES),
    "halves_g2_s4_w2_mc4": (2, 4, 2, 4, HALVES),
    "halves_g2_s4_w4": (2, 4, 4, 1, HALVES),
    "halves_g2_s4_w3_mc2": (2, 4, 3, 2, HALVES),
    "quarters_g2_s6_w3": (2, 6, 3, 1, QUARTERS),
    "quarters_g2_s6_w2_mc2": (2, 6, 2, 2, QUARTERS),
}
NO_RING_SETTINGS = ("producer_g2_s2_w2", "halves_g2_s4_w2", "halves_g4_s4_w2")
NO_RING = [
    ("    if (lane == 0 && count > 0) {\n      const uint4* image", "    if (false) {\n      const uint4* image"),
    ("      ptx::mbarrier_wait(full + 8 * wait_slot, wait_phase);\n", ""),
]
# ... and the weight copies too: what is left is the decode, the escape stream and the MMAs
NO_FEED = NO_RING + [
    (
        "        stage_step<kBlocksPerChunk, LOW_BITS>(warp_stages + stage * kWideStageBytes, view_next, nibs_next, "
        "lane);\n",
        "",
    )
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
        load_cuda_extension(f"w12feed_{name}", folder, SOURCES)
    except Exception as exc:  # noqa: BLE001 - reported when the main process loads it
        return f"{type(exc).__name__}: {exc}"[:300]
    return ""


def with_setting(base: MmaConfig, setting: tuple[int, int, int, int, int]) -> MmaConfig:
    groups, slots, stages, multicast, feed = setting
    return replace(base, wide_rows=tuple((groups, slots, stages, top, multicast, feed) for top in LARGEST))


def timed(fn, copies: int) -> float:
    return graph_replay_us(fn, copies, max(copies, 8), 12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    real_loader = mma_module.load_cuda_extension
    with tempfile.TemporaryDirectory() as work:
        folders = {
            name: prepare(name, patches, Path(work))
            for name, patches in (("as_is", []), ("no_ring", NO_RING), ("no_feed", NO_FEED))
        }
        start = time.perf_counter()
        context = multiprocessing.get_context("spawn" if torch.cuda.is_initialized() else "fork")
        with ProcessPoolExecutor(len(folders), mp_context=context) as pool:
            failed = dict(zip(folders, pool.map(build_in_worker, folders, folders.values())))
        doc = {
            **result_header("w12_wide_feed"),
            "method": "CUDA-graph replay over rotating copies >= 4 x 60 MB, median of 12; each setting's outputs "
            "compared bit for bit with the library's choice (no_ring, no_feed: times only)",
            "build_s": time.perf_counter() - start,
            "build_errors": {k: v for k, v in failed.items() if v},
            "settings": {name: list(s) for name, s in SETTINGS.items()},
            "largest_slab_tiles": list(LARGEST),
            "shapes": {},
        }
        print(f"built in {doc['build_s']:.0f} s", failed, file=sys.stderr, flush=True)
        exts = {
            name: load_cuda_extension(f"w12feed_{name}", folder, SOURCES)
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
                        if ext_name != "as_is" and sname not in NO_RING_SETTINGS:
                            continue
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
                            if ext_name == "as_is":
                                result["bits_equal_library"] = bool(torch.equal(got, ref))
                        except RuntimeError as exc:
                            result = {"error": str(exc)[:200]}
                        row["settings"][key] = result
                mma_module.load_cuda_extension = real_loader
                entry["rows"][str(m)] = row
                best = min(
                    ((k2, r["us"]) for k2, r in row["settings"].items() if "us" in r and not k2.startswith("no_")),
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
