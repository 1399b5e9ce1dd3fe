"""Where the wide W12 kernel's time goes: the same launches with one part of its main loop taken out at a time.

    PYTHONPATH=kernels:. python benchmarks/probes/w12-wide-breakdown-h200-2026-12-02/harness.py --out RESULT.json

Each variant is the library's csrc/ copied to a temporary folder with one textual patch to w12_wide.cu (below), built
as its own extension and timed like the device check (CUDA-graph replay over rotating copies, median): the variants
compute wrong products on purpose, so only their times mean anything. (Taking out the escape patch or the fence
before each block's MMAs makes ptxas serialize every wgmma, so those two are not variants.) Every variant, the unpatched
one included, is built with the exact-weights instantiations only and the slabs the timed rows use, so the builds are
short and alike; all are built at once in worker processes (torch caches each on disk) before anything is timed.
The unpatched build also times, next to cuBLAS, the library's own choice at each row count (the tuned config: at 33-64
rows the warpgroup kernel 64 rows a launch), so the wide kernel's figures have both references beside them.
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

# the one-wave projections of the device check (27B-class), where the wide kernel is furthest from cuBLAS
SHAPES = {"qkv": (10240, 5120), "o_proj": (5120, 8192), "down": (5120, 17408)}
ROWS = (33, 48, 64, 128, 256)
# the wide kernel on at every row range: a shape's tuned setting where the tune chose the wide kernel, else these
WIDE_ROWS = ((1, 2, 2, 8), (2, 2, 2, 16), (2, 2, 3, 32))
LEAN = [  # every variant: exact weights only, the slabs of ROWS (33 rows: 6 token tiles; 12 and 24 are never launched)
    (
        "#define W12_WIDE_KERNELS(X) X(6) X(8) X(12) X(16) X(24) X(32)",
        "#define W12_WIDE_KERNELS(X) X(6) X(8) X(16) X(32)",
    ),
    (
        "  return low_bits == 0 ? launch_low_bits<0>(args, wide, stream)\n"
        "         : low_bits == 1 ? launch_low_bits<1>(args, wide, stream)\n"
        "                         : launch_low_bits<2>(args, wide, stream);",
        "  return launch_low_bits<0>(args, wide, stream);",
    ),
]
VARIANTS = {
    "as_is": [],
    # the MMAs: their A registers kept live so the decode stays
    "no_mma": [
        (
            "          wide_wgmma<8 * MT>(d, &set[0][4 * s], kDescHi | (desc_lo + (2 * u + s) * "
            "(wide_step_bytes<MT>() >> 4)));",
            '          asm volatile("" ::"r"(set[0][4 * s]), "r"(set[0][4 * s + 1]), "r"(set[0][4 * s + 2]), '
            '"r"(set[0][4 * s + 3]), "r"(desc_lo));',
        )
    ],
    # the weight copies (the stages are read as they are)
    "no_weight_copy": [
        (
            "        stage_step<kBlocksPerChunk, LOW_BITS>(warp_stages + stage * kWideStageBytes, view_next, "
            "nibs_next, lane);",
            "",
        )
    ],
    # the decode: the staged words go to the MMA as they are
    "no_decode": [
        (
            "        decode_block<LOW_BITS>(set[0], v, nb, one.base_lo, one.base_hi);",
            "        set[0][0] = v.x, set[0][1] = v.y, set[0][2] = v.z, set[0][3] = v.w, set[0][4] = nb.x, "
            "set[0][5] = nb.y, set[0][6] = v.x ^ nb.y, set[0][7] = v.y ^ nb.x;",
        )
    ],
    # the wait before each block that frees a register set (MMAs two blocks back done): its sets overwritten early
    "no_mma_wait": [
        (
            "        ptx::wgmma_wait<1>();\n        fence_accumulators(d);\n        if (u == 1 && i > 0) {",
            "        fence_accumulators(d);\n        if (u == 1 && i > 0) {",
        )
    ],
    # last, as the one that may leave the device unusable: the wait for a chunk's activations (the ring still
    # copies and refills; its full barriers are then armed with no one waiting)
    "no_x_wait": [("      ptx::mbarrier_wait(full + 8 * slot, phase);  // the chunk's activations have landed", "")],
}


def prepare(name: str, patches: list[tuple[str, str]], work: Path) -> Path:
    folder = work / name
    shutil.copytree(CSRC, folder)
    wide = folder / "w12_wide.cu"
    text = wide.read_text()
    for old, new in LEAN + patches:
        if old not in text:
            raise SystemExit(f"variant {name}: the text to patch is not in w12_wide.cu (the kernel changed): {old!r}")
        text = text.replace(old, new)
    wide.write_text(text)
    return folder


def build(name: str, folder: Path):
    return load_cuda_extension(f"w12probe_{name}", folder, SOURCES)


def build_in_worker(name: str, folder: Path) -> str:
    """Compile one variant (torch keeps the module on disk, so the main process's load of it only imports)."""
    try:
        build(name, folder)
    except Exception as exc:  # noqa: BLE001 - the main process reports it when it loads this variant
        return f"{type(exc).__name__}: {exc}"[:300]
    return ""


def tuned_wide(config: MmaConfig) -> MmaConfig:
    """The config with the wide kernel on at every row range (its tuned setting where it has one)."""
    rows = config.wide_rows or WIDE_ROWS
    return replace(config, wide_rows=tuple(own if own[0] else forced for own, forced in zip(rows, WIDE_ROWS)))


def timed(fn, copies: int) -> float:
    return graph_replay_us(fn, copies, max(copies, 8), 12)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    real_loader = mma_module.load_cuda_extension
    with tempfile.TemporaryDirectory() as work:
        folders = {variant: prepare(variant, patches, Path(work)) for variant, patches in VARIANTS.items()}
        start = time.perf_counter()
        # forked before this process touches CUDA (the result header queries the device, so it comes after); each
        # worker's ninja runs its variant's sources side by side
        context = multiprocessing.get_context("spawn" if torch.cuda.is_initialized() else "fork")
        with ProcessPoolExecutor(len(folders), mp_context=context) as pool:
            failed = dict(zip(folders, pool.map(build_in_worker, folders, folders.values())))
        build_s = time.perf_counter() - start
        doc = {
            **result_header("w12_wide_breakdown"),
            "method": "CUDA-graph replay over rotating copies >= 4 x 60 MB, "
            "median of 12; variants compute wrong products: times only",
            "shapes": {},
            "reference": {},
            "variants": {},
        }
        doc["build_s"] = build_s
        print(f"built {len(folders)} variants in {build_s:.0f} s", file=sys.stderr, flush=True)
        device = torch.device("cuda")
        shapes, bf16 = {}, {}
        for name, (n, k) in SHAPES.items():
            torch.manual_seed(0)
            w = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
            one = to_mma_layout(encode(w))
            copies = max(1, math.ceil(4 * 60 * 2**20 / one.nbytes()))
            shapes[name] = [one] + [
                mma_module.W12MmaTensor(
                    one.shape,
                    one.padded_shape,
                    *(t.clone() for t in (one.view, one.nibbles, one.base, one.esc_tile, one.esc_chunk, one.esc_entry)),
                )
                for _ in range(copies - 1)
            ]
            bf16[name] = [w.t()] + [w.clone().t() for _ in range(max(1, math.ceil(4 * 60 * 2**20 / (2 * n * k))) - 1)]
            library = select_mma_config(n, k, device)
            doc["shapes"][name] = {
                "N": n,
                "K": k,
                "w12_bytes": one.nbytes(),
                "library": asdict(library),
                "wide": asdict(tuned_wide(library)),
            }
        for variant in VARIANTS:
            if failed[variant]:
                doc["variants"][variant] = {"error": failed[variant]}
                write_result(doc, args.out)
                continue
            ext = build(variant, folders[variant])
            mma_module.load_cuda_extension = lambda *a, e=ext: e  # w12_mma_gemm launches this variant
            times = {}
            for name, mmas in shapes.items():
                n, k = SHAPES[name]
                library = select_mma_config(n, k, device)
                wide = tuned_wide(library)
                for m in ROWS:
                    x = torch.randn(m, k, device="cuda").bfloat16()
                    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                    times[f"{name}_{m}"] = timed(
                        lambda i, x=x, y=y, c=wide, t=mmas: w12_mma_gemm(x, t[i], config=c, out=y), len(mmas)
                    )
                    if variant == "as_is":  # the references, with the unpatched kernels
                        ran = []
                        w12_mma_gemm(x, mmas[0], config=wide, out=y, launched=ran)
                        doc["reference"][f"{name}_{m}"] = {
                            "cublas_us": timed(
                                lambda i, x=x, y=y, w=bf16[name]: torch.matmul(x, w[i], out=y), len(bf16[name])
                            ),
                            "library_us": timed(
                                lambda i, x=x, y=y, c=library, t=mmas: w12_mma_gemm(x, t[i], config=c, out=y), len(mmas)
                            ),
                            "wide_launched": ran,
                        }
            mma_module.load_cuda_extension = real_loader
            doc["variants"][variant] = times
            print(variant, {key: round(t, 1) for key, t in times.items()}, file=sys.stderr, flush=True)
            write_result(doc, args.out)
    as_is = doc["variants"].get("as_is", {})
    for key, ref in doc["reference"].items():
        wide = as_is[key]
        print(
            f"{key}: cuBLAS {ref['cublas_us']:.1f} us, library {ref['library_us']:.1f} us "
            f"({ref['cublas_us'] / ref['library_us']:.2f}x), wide {wide:.1f} us ({ref['cublas_us'] / wide:.2f}x)"
        )


if __name__ == "__main__":
    main()
