"""The wide W12 kernel with its weights carried in the activation slots (0 weight stages) against cuBLAS and the library.

    PYTHONPATH=kernels:. python benchmarks/probes/w12-wide-carried-h200-2026-12-02/harness.py --out RESULT.json
        [--shapes qkv,o_proj,down,gate_up] [--budget 150]

First the bits: the device check's bit test (every row count 1-256, every escape fraction, one-hot rows, the Q pass;
against the per-warp kernel 64 rows a launch) on carried settings over several partitions. Then, per shape and
row range (33-64, 65-128, 129-256), every carried setting that fits a multiprocessor, timed at the range's rows like
the device check (CUDA-graph replay over rotating copies > L2, median), beside cuBLAS BF16 and the library's current
choice; a candidate whose bits differ from the per-warp kernel's at those rows is timed and marked, never chosen. The result
names, per range, the fastest candidate and its speedups over cuBLAS, so the winners can go into mma_configs.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))
import w12_device_check as check  # noqa: E402
from specpilot_mem.bench.cuda_timing import record_section  # noqa: E402

from specpilot_kernels.w12.mma import MmaConfig, select_mma_config, w12_mma_gemm  # noqa: E402
from specpilot_mem.provenance import result_header, write_result  # noqa: E402

BUCKETS = {"33-64": (33, 48, 64), "65-128": (96, 128), "129-256": (192, 256)}
# (warpgroups, slots, weight stages, largest slab in token tiles) per range, likeliest first; stages 0: a slot holds a
# chunk's activations and weights, 1: half a chunk's
CANDIDATES = {
    "33-64": [(4, 3, 0, 8), (4, 6, 1, 8), (4, 2, 0, 8), (4, 4, 1, 8), (2, 4, 1, 8), (2, 2, 0, 8), (1, 4, 1, 8)],
    "65-128": [(4, 2, 0, 16), (4, 4, 1, 16), (4, 5, 1, 16), (2, 3, 1, 16), (4, 6, 1, 8), (2, 2, 0, 16)],
    "129-256": [(4, 4, 1, 16), (4, 5, 1, 16), (4, 2, 0, 16), (2, 3, 1, 32), (2, 4, 1, 32), (4, 6, 1, 8)],
}
# partitions the bits are checked on, each with carried settings at every range (whole and half-chunk slots)
BIT_CONFIGS = {
    "n1_k3_s1_g4": MmaConfig(1, 3, 1, wide_rows=((4, 3, 0, 8), (4, 2, 0, 16), (4, 2, 0, 16))),
    "n1_k3_s1_g4_half": MmaConfig(1, 3, 1, wide_rows=((4, 6, 1, 8), (4, 4, 1, 16), (2, 3, 1, 32))),
    "n1_k3_s2_g2": MmaConfig(1, 3, 2, wide_rows=((2, 2, 0, 8), (2, 2, 0, 16), (2, 2, 0, 32))),
    "n1_k8_s2_workspace_g1_half": MmaConfig(1, 8, 2, wide_rows=((1, 2, 1, 8), (1, 3, 1, 16), (1, 2, 0, 32))),
    "n2_k4_s3_g2": MmaConfig(2, 4, 3, wide_rows=((2, 4, 1, 8), (2, 2, 0, 8), (2, 2, 1, 16))),
    "n1_k1_s1_g4": MmaConfig(1, 1, 1, wide_rows=((4, 2, 0, 8), (4, 5, 1, 16), (2, 2, 0, 32))),
}


def with_setting(base: MmaConfig, bucket: str, setting: tuple) -> MmaConfig:
    index = list(BUCKETS).index(bucket)
    rows = list(base.wide_rows or tuple((*base.wide, 16) for _ in BUCKETS))
    rows[index] = setting
    return replace(base, wide_rows=tuple(rows))


def time_shape(name: str, deadline: float) -> dict:
    shape = check.Shape(name, *check.SHAPES[name])
    mmas = shape.mma(0.0)
    base = select_mma_config(shape.n, shape.k, torch.device("cuda"))
    plain = replace(base, **check.PLAIN)
    x = torch.randn(256, shape.k, device="cuda").bfloat16()
    out = {"N": shape.n, "K": shape.k, "library": asdict(base), "w12_bytes": mmas[0].nbytes(), "buckets": {}}
    for bucket, rows in BUCKETS.items():
        reference = {m: check.bits(w12_mma_gemm(x[:m], mmas[0], config=plain)) for m in rows}
        entry = {"cublas_us": {m: shape.cublas_us(m) for m in rows}, "library_us": {}, "candidates": {}}
        entry["library_us"] = {m: shape.w12_us(m, config=base) for m in rows}
        best = None
        for setting in CANDIDATES[bucket]:
            label = str(setting)
            if time.monotonic() > deadline:
                entry["candidates"][label] = "budget spent"
                continue
            groups, slots, stages, slab = setting
            if not check.wide_fits(groups, slots, stages, slab, rows[-1]):
                entry["candidates"][label] = "shared memory does not fit"
                continue
            option = with_setting(base, bucket, setting)
            try:
                ran = []
                w12_mma_gemm(x[: rows[-1]], mmas[0], config=option, launched=ran)
                if ran[:1] != [groups]:
                    entry["candidates"][label] = {"fell_back": ran}
                    continue
                bad = [
                    m
                    for m in rows
                    if not torch.equal(check.bits(w12_mma_gemm(x[:m], mmas[0], config=option)), reference[m])
                ]
                times = {m: shape.w12_us(m, config=option) for m in rows}  # timed even if wrong: is it worth fixing
            except Exception as exc:  # noqa: BLE001 - a launch that fails is a result; go on with the others
                entry["candidates"][label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            speedups = {m: entry["cublas_us"][m] / t for m, t in times.items()}
            score = math.exp(sum(map(math.log, times.values())) / len(times))
            entry["candidates"][label] = {"w12_us": times, "speedup": speedups, "score": score}
            if bad:  # never the best
                entry["candidates"][label]["bits_differ_at"] = bad
                continue
            if best is None or score < best[1]:
                best = (label, score)
        if best:
            entry["best"] = best[0]
            entry["best_speedup"] = entry["candidates"][best[0]]["speedup"]
        entry["library_speedup"] = {m: entry["cublas_us"][m] / t for m, t in entry["library_us"].items()}
        out["buckets"][bucket] = entry
        print(
            name,
            bucket,
            "library",
            {m: round(s, 2) for m, s in entry["library_speedup"].items()},
            "best",
            entry.get("best"),
            {m: round(s, 2) for m, s in entry.get("best_speedup", {}).items()},
            file=sys.stderr,
            flush=True,
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--shapes", default="qkv,o_proj,down,gate_up,lm_head")
    parser.add_argument("--budget", type=float, default=150.0, help="seconds the timing may take over all shapes")
    args = parser.parse_args()
    doc = {
        **result_header("w12_wide_carried"),
        "method": "CUDA-graph replay over rotating copies >= 4 x 60 MB, "
        f"median of {check.REPLAYS}; candidates = (warpgroups, slots, weight stages, largest slab)",
        "shapes": {},
    }
    record_section(doc, "build", check.build, args.out)
    record_section(doc, "bits", lambda: check.check_bits(BIT_CONFIGS), args.out)
    deadline = time.monotonic() + args.budget
    for name in args.shapes.split(","):
        record_section(doc["shapes"], name, lambda n=name: time_shape(n, deadline), None)
        write_result(doc, args.out)
        torch.cuda.empty_cache()
    summary = {}
    for name, shape in doc["shapes"].items():
        for bucket, entry in shape.get("buckets", {}).items():
            if "best_speedup" in entry:
                summary[f"{name} {bucket}"] = {
                    "best": entry["best"],
                    "min_speedup": min(entry["best_speedup"].values()),
                    "library_min": min(entry["library_speedup"].values()),
                }
    doc["summary"] = {"bits_ok": doc.get("bits", {}).get("all_ok"), **summary}
    write_result(doc, args.out)
    print(doc["summary"])


if __name__ == "__main__":
    main()
