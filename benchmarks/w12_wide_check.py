"""The decoded-weight wide W12 kernel (csrc/w12_wide_ss.cu) on the GPU in one call: build, bits against the library's
64-rows-a-launch path at every row count and escape fraction, then the five 27B-class shapes at 33-256 rows: cuBLAS,
the committed configs and each candidate setting of the decoded-weight kernel, side by side.

    PYTHONPATH=kernels:. python benchmarks/w12_wide_check.py --out benchmarks/results/w12-wide-ss-h200.json

Method: the device check's (benchmarks/w12_device_check.py): CUDA-graph replay over rotating weight copies larger than
L2, median of its REPLAYS, W12 and cuBLAS (torch.matmul, BF16) timed alike in one process, seeded N(0, 0.02) weights.
A candidate is (tile groups a block, activation slots, decoded slots, largest slab in token tiles) per row range;
each is checked bit for bit against the 64-rows-a-launch path on the timed shape before it is timed.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import asdict, replace

import torch

from benchmarks.w12_device_check import PLAIN, Shape, bits, build, check_bits
from specpilot_kernels.w12.mma import WIDE_BUCKETS, MmaConfig, select_mma_config, w12_mma_gemm, wide_token_tiles
from specpilot_mem.bench.cuda_timing import ClockLog, record_section
from specpilot_mem.bench.runs import log
from specpilot_mem.bench.shapes import SHAPES
from specpilot_mem.provenance import result_header, write_result

TIMED_ROWS = (33, 48, 64, 96, 128, 256)
SMEM_PER_SM = 227 * 1024
# per row range (33-64, 65-128, 129-256): candidate (tile groups, activation slots, decoded slots, largest slab)
CANDIDATES = {
    64: ((4, 4, 2, 8), (4, 3, 2, 8), (2, 4, 3, 8), (2, 4, 2, 8)),
    128: ((2, 4, 2, 16), (2, 3, 2, 16), (1, 2, 2, 16)),
    256: ((1, 2, 2, 32), (1, 2, 3, 32), (2, 3, 2, 16), (2, 4, 2, 16)),
}
# partitions of the bits check (cluster of classes and splits, a workspace, one class, several tile groups, a tail),
# each with decoded-weight settings in every row range
DECODED = ((4, 4, 2, 8, 1, 1), (2, 4, 2, 16, 1, 1), (1, 2, 2, 32, 1, 1))
DECODED_SMALL = ((2, 3, 3, 8, 1, 1), (1, 2, 2, 16, 1, 1), (2, 3, 2, 16, 1, 1))
CHECK_CONFIGS = {
    "n1_k3_s2_cluster6": MmaConfig(1, 3, 2, wide_rows=DECODED),
    "n1_k8_s2_workspace": MmaConfig(1, 8, 2, wide_rows=DECODED_SMALL),
    "n1_k1_s1": MmaConfig(1, 1, 1, wide_rows=DECODED),
    "n1_k3_s1_small": MmaConfig(1, 3, 1, wide_rows=DECODED_SMALL),
    "tail": MmaConfig(1, 2, 1, wgmma=(1, 2, 2), tail_rows=256, tail=(1, 8, 2), wide_rows=DECODED),
}
# --two-mma: two MMA warpgroups a block above 128 rows (two tile groups of a 256-row slab), checked and timed in a
# process of their own (a fault there must not cost the rest)
TWO_MMA_CANDIDATES = {256: ((2, 2, 2, 32),)}
TWO_MMA_CHECK_CONFIGS = {
    "n1_k3_s2_two_mma": MmaConfig(1, 3, 2, wide_rows=(DECODED[0], DECODED[1], (2, 2, 2, 32, 1, 1))),
    "n1_k8_s2_workspace_two_mma": MmaConfig(1, 8, 2, wide_rows=(DECODED[0], DECODED[1], (2, 3, 2, 24, 1, 1))),
}
CHECK_ROWS = (1040,)  # weights of 65 tiles: blocks past the last tile group, and a block with one tile


def groups_built(slab_tiles: int, groups: int) -> int:
    """Tile groups a block that run (csrc/w12_wide_ss.cu wide_ss_groups)."""
    return min(groups, 4 if slab_tiles <= 8 else 2)


def decoded_fits(groups: int, slots: int, stages: int, largest: int, m: int) -> bool:
    """Whether a decoded-weight block's shared memory (csrc/w12_wide_ss.cu ss_smem_bytes) fits a multiprocessor."""
    tiles, _ = wide_token_tiles(m, largest)
    groups = groups_built(tiles, groups)
    loop = slots * tiles * 2048 + stages * groups * 16384 + 4 * groups * 1024 + 16 * (slots + stages)
    return max(loop, groups * 4 * 32 * tiles * 16) <= SMEM_PER_SM


def with_setting(base: MmaConfig, bucket: int, setting: tuple) -> MmaConfig:
    """``base`` with the decoded-weight ``setting`` in ``bucket``'s row range, the library's choices elsewhere."""
    rows = [(*base.wide_launch(top), 0) for top in WIDE_BUCKETS]
    rows[WIDE_BUCKETS.index(bucket)] = (*setting, 1, 1)
    return replace(base, wide_rows=tuple(rows))


def bucket_of(m: int) -> int:
    return next(top for top in WIDE_BUCKETS if m <= top)


def time_shape(name: str, deadline: float, candidates: dict) -> dict:
    n, k = SHAPES[name]
    shape = Shape(name, n, k)
    mmas = shape.mma(0.0)
    library = select_mma_config(n, k, torch.device("cuda"))
    plain = replace(library, **PLAIN)
    x = torch.randn(max(TIMED_ROWS), k, device="cuda").bfloat16()
    alone = bits(w12_mma_gemm(x[:1], mmas[0], config=plain))
    out = {"N": n, "K": k, "library_config": asdict(library), "rows": [], "candidates": {}}
    for m in (m for m in TIMED_ROWS if bucket_of(m) in candidates):
        row = {"M": m, "cublas_us": shape.cublas_us(m), "library_us": shape.w12_us(m, config=library)}
        row["library_speedup"] = row["cublas_us"] / row["library_us"]
        reference = bits(w12_mma_gemm(x[:m], mmas[0], config=plain))
        for setting in candidates[bucket_of(m)]:
            key = "g{}_s{}_d{}_t{}".format(*setting)
            if not decoded_fits(*setting, m) or time.monotonic() > deadline:
                continue
            config = with_setting(library, bucket_of(m), setting)
            try:
                y = bits(w12_mma_gemm(x[:m], mmas[0], config=config))
                same = torch.equal(y, reference) and torch.equal(y[:1], alone)
                us = shape.w12_us(m, config=config)
                row[key] = {"us": us, "speedup": row["cublas_us"] / us, "bits_equal_library": same}
            except Exception as exc:  # noqa: BLE001 - record and go on with the other candidates
                row[key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        timed = {kk: v for kk, v in row.items() if isinstance(v, dict) and "speedup" in v and v["bits_equal_library"]}
        if timed:
            best = max(timed, key=lambda kk: timed[kk]["speedup"])
            row["best"] = best
            row["best_speedup"] = timed[best]["speedup"]
        out["rows"].append(row)
        log(name, m, {kk: (v if not isinstance(v, dict) else v.get("speedup", v)) for kk, v in row.items()})
    del shape
    torch.cuda.empty_cache()
    return out


def summarize(shapes: dict) -> dict:
    def geomean(v):
        return math.exp(sum(map(math.log, v)) / len(v)) if v else None

    best = {"33-64": [], "65-256": []}
    library = {"33-64": [], "65-256": []}
    for shape in shapes.values():
        for row in shape.get("rows", []):
            key = "33-64" if row["M"] <= 64 else "65-256"
            library[key].append(row["library_speedup"])
            best[key].append(max(row.get("best_speedup", 0.0), row["library_speedup"]))
    return {
        f"{what}_{rng}_{stat}": f(values[rng]) if values[rng] else None
        for what, values in (("library", library), ("with_decoded", best))
        for rng in values
        for stat, f in (("geomean", geomean), ("min", min))
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--sections", default="build,bits,timing", help="build, bits, timing (in this order)")
    parser.add_argument("--budget", type=float, default=40.0, help="seconds the candidates' timing may take")
    parser.add_argument(
        "--two-mma", action="store_true", help="check and time the two-MMA-warpgroup settings (129-256 rows) alone"
    )
    args = parser.parse_args()
    candidates = TWO_MMA_CANDIDATES if args.two_mma else CANDIDATES
    checked = TWO_MMA_CHECK_CONFIGS if args.two_mma else CHECK_CONFIGS
    os.environ.setdefault("MAX_JOBS", str(os.cpu_count() or 8))
    doc = {
        **result_header("w12_wide_check"),
        "method": "CUDA-graph replay over rotating copies >= 4 x 60 MB (benchmarks/w12_device_check.py)",
        "candidates": {str(b): c for b, c in candidates.items()},
        "shapes": {},
    }
    sections = args.sections.split(",")
    if "build" in sections:
        record_section(doc, "build", build, args.out)
    if "bits" in sections:
        record_section(
            doc,
            "bits",
            lambda: {f"n{n}": check_bits(checked, n) for n in CHECK_ROWS},
            args.out,
        )
    if "timing" in sections:
        deadline = time.monotonic() + args.budget
        with ClockLog():
            for name in args.shapes.split(","):
                record_section(doc["shapes"], name, lambda nm=name: time_shape(nm, deadline, candidates), None)
                doc["summary"] = summarize(doc["shapes"])
                write_result(doc, args.out)
    doc["summary"] = summarize(doc["shapes"])
    write_result(doc, args.out)
    log(doc["summary"])


if __name__ == "__main__":
    main()
