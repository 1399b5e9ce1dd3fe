"""The Q pass against the exact pass at the 27B-like shapes, one request (a tree of M = 1, 16, 32 token rows).

Per shape and row count, in one process under CUDA-graph replay (``cuda_timing.graph_replay_us``, rotating weight
copies larger than L2): the exact W12 pass (the mma.sync/wgmma CUDA kernels, the fast path), cuBLAS BF16, the W12
CUDA kernels' own Q-pass mode, the Triton Q pass over the same records (``w12_qpass_gemm``: midpoint, and truncated
for comparison) and the INT8 copy variant (``int8_qpass_gemm``, with its memory cost). ``pass`` sums the shapes as
one forward pass does: ``--layers`` x (qkv + o_proj + gate_up + down) + lm_head.

Correctness first (each Q-pass kernel against the fp32 reference of its weights); ``--device cpu`` runs the same
code on tiny shapes under the Triton interpreter (a dry run: no timing).

    PYTHONPATH=kernels:. python benchmarks/tlv_qpass_bench.py [--rows 1,16,32] [--out FILE]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402


from specpilot_kernels.w12 import encode, to_mma_layout, w12_mma_gemm  # noqa: E402
from specpilot_kernels.w12.int8_copy import int8_copy, int8_qpass_gemm, int8_weight_reference  # noqa: E402
from specpilot_kernels.w12.qpass import (  # noqa: E402
    QpassConfig,
    qpass_gemm_reference,
    select_qpass_config,
    w12_qpass_gemm,
)
from specpilot_kernels.w12.reference import qpass_weight_reference  # noqa: E402
from specpilot_mem.bench.cuda_timing import graph_replay_us, record_section  # noqa: E402
from specpilot_mem.bench.runs import log  # noqa: E402
from specpilot_mem.bench.shapes import PROJECTIONS, SHAPES  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

TINY_SHAPES = {"qkv": (320, 256), "down": (128, 640)}
L2_BYTES = 60 * 2**20


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return ((y.float() - ref.float()).norm() / ref.float().norm()).item()


def candidates(n: int, k: int, device: torch.device) -> list[QpassConfig]:
    """The default partition and neighbours: 32 rows a program, 128 rows a program, more K splits, longer steps."""
    base = select_qpass_config(n, k, device)
    return list(
        dict.fromkeys(
            (
                base,
                QpassConfig(tiles=2, blocks=2, splits=2 * base.splits, num_stages=4),
                QpassConfig(tiles=8, blocks=2, splits=max(1, base.splits // 2), num_stages=2),
                QpassConfig(tiles=4, blocks=2, splits=2 * base.splits, num_stages=3),
                QpassConfig(tiles=2, blocks=2, splits=4 * base.splits, num_stages=3),
                QpassConfig(tiles=4, blocks=4, splits=base.splits, num_stages=3),
            )
        )
    )


def correctness(shapes: dict, device: str) -> dict:
    out = {}
    for name, (n, k) in shapes.items():
        torch.manual_seed(0)
        w = (torch.randn(n, k, device=device) * 0.02).bfloat16()
        w12 = encode(w)
        mma = to_mma_layout(w12)
        x = torch.randn(16, k, device=device).bfloat16()
        entry = {}
        for low_bits in ("midpoint", "truncated"):
            ref = qpass_gemm_reference(x, w12, low_bits)
            y = w12_qpass_gemm(x, mma, low_bits)
            entry[f"triton_{low_bits}_rel_err"] = rel_err(y, ref)
            if device == "cuda":
                entry[f"cuda_{low_bits}_rel_err"] = rel_err(w12_mma_gemm(x, mma, low_bits=low_bits), ref)
        if device == "cuda":
            # the PTX conversion against the plain-op twin; a row's bits at 1 row and at 16; one-hot rows
            plain = w12_qpass_gemm(x, mma, config=QpassConfig(use_asm=False))
            entry["ptx_equals_plain_ops"] = torch.equal(plain.view(torch.int16), y_mid(x, mma).view(torch.int16))
            two, all_rows = y_mid(x[:2], mma), y_mid(x, mma)[:2]  # 2 rows: not Triton's specialization for 1
            entry["row_bits_independent_of_rows"] = torch.equal(two.view(torch.int16), all_rows.view(torch.int16))
            entry["rows_2_vs_16_differing"] = int((two.view(torch.int16) != all_rows.view(torch.int16)).sum())
            entry["rows_2_vs_16_max_rel_diff"] = (
                (two.float() - all_rows.float()).abs().max() / all_rows.float().abs().max()
            ).item()
            cols = torch.arange(0, k, max(1, k // 16), device=device)[:16]
            onehot = torch.zeros(cols.numel(), k, device=device, dtype=torch.bfloat16)
            onehot[torch.arange(cols.numel(), device=device), cols] = 1.0
            expected = qpass_weight_reference(w12, "midpoint")[:, cols].t().contiguous()
            got = w12_qpass_gemm(onehot, mma)
            entry["one_hot_rows_bit_exact"] = torch.equal(got.view(torch.int16), expected.view(torch.int16))
            # the view's zero code reads as a signed zero in the reference; a sum of +0 and -0 products is +0
            entry["one_hot_rows_equal_values"] = torch.equal(got.float(), expected.float())
            entry["one_hot_differing_nonzero"] = int((got.float() != expected.float()).sum())
        copy = int8_copy(w)
        entry["int8_rel_err"] = rel_err(int8_qpass_gemm(x, copy), x.float() @ int8_weight_reference(copy).t())
        # how far each Q-pass weight set is from the exact product
        exact = x.float() @ w.float().t()
        entry["midpoint_vs_exact_rel_err"] = rel_err(qpass_gemm_reference(x, w12, "midpoint"), exact)
        entry["truncated_vs_exact_rel_err"] = rel_err(qpass_gemm_reference(x, w12, "truncated"), exact)
        entry["int8_vs_exact_rel_err"] = rel_err(x.float() @ int8_weight_reference(copy).t(), exact)
        out[name] = entry
        log(name, entry)
    return out


def y_mid(x: torch.Tensor, mma) -> torch.Tensor:
    return w12_qpass_gemm(x, mma, "midpoint", config=QpassConfig(use_asm=True))


def wall_us(fn_for_copy, copies: int, replays: int) -> float:
    """The CPU dry run's stand-in for graph replay: one call's wall time (interpreter: not a figure)."""
    start = time.perf_counter()
    fn_for_copy(0)
    return (time.perf_counter() - start) * 1e6


def bench_shape(name: str, n: int, k: int, rows: list[int], replays: int, device: str = "cuda") -> dict:
    torch.manual_seed(0)
    cuda = device == "cuda"
    w = (torch.randn(n, k, device=device) * 0.02).bfloat16()
    w12 = encode(w)
    w12_bytes = w12.nbytes()
    copies = max(2, math.ceil(2 * L2_BYTES / (n * k))) if cuda else 1
    fresh = [(torch.randn(n, k, device=device) * 0.02).bfloat16() for _ in range(copies - 1)]
    mmas = [to_mma_layout(w12)] + [to_mma_layout(encode(f)) for f in fresh]
    del w12
    int8s = [int8_copy(w)] + [int8_copy(f) for f in fresh]
    bf16s = [w] + fresh
    xs = {m: torch.randn(m, k, device=device).bfloat16() for m in rows}
    entry = {
        "N": n,
        "K": k,
        "copies": copies,
        "w12_bytes": w12_bytes,
        "view_bytes": mmas[0].view.numel(),
        "int8_copy_bytes": int8s[0].nbytes(),
        "bf16_bytes": 2 * n * k,
        "int8_copy_extra_bits_per_weight": 8.0 * int8s[0].nbytes() / (n * k),
    }
    clock = graph_replay_us if cuda else wall_us

    def timed(fn):
        return clock(fn, copies=copies, replays=replays)

    configs = candidates(n, k, torch.device(device))
    tune_m = 16 if 16 in rows else rows[0]
    tune = {str(c): timed(lambda i, c=c: w12_qpass_gemm(xs[tune_m], mmas[i], config=c)) for c in configs}
    best = min(tune, key=tune.get)
    config = next(c for c in configs if str(c) == best)
    entry["tune_us_at_rows"] = {"rows": tune_m, "us": tune, "best": best}
    entry["rows"] = []
    for m in rows:
        x = xs[m]
        row = {
            "M": m,
            "exact_w12_us": timed(lambda i, x=x: w12_mma_gemm(x, mmas[i])) if cuda else None,
            "cublas_bf16_us": timed(lambda i, x=x: torch.nn.functional.linear(x, bf16s[i])),
            "cuda_qpass_midpoint_us": timed(lambda i, x=x: w12_mma_gemm(x, mmas[i], low_bits="midpoint"))
            if cuda
            else None,
            "triton_qpass_midpoint_us": timed(lambda i, x=x: w12_qpass_gemm(x, mmas[i], "midpoint", config=config)),
            "int8_copy_us": timed(lambda i, x=x: int8_qpass_gemm(x, int8s[i])),
        }
        if m == rows[0]:
            row["triton_qpass_truncated_us"] = timed(
                lambda i, x=x: w12_qpass_gemm(x, mmas[i], "truncated", config=config)
            )
        exact = row["exact_w12_us"] or row["cublas_bf16_us"]
        row["qpass_over_exact"] = row["triton_qpass_midpoint_us"] / exact
        row["int8_over_exact"] = row["int8_copy_us"] / exact
        entry["rows"].append(row)
        log(name, row)
    return entry


def summarize(shapes: dict, layers: int) -> dict:
    summary = {}
    present = [s for s in shapes.values() if isinstance(s, dict) and "rows" in s]
    if not present:
        return summary
    for i, row in enumerate(present[0]["rows"]):
        m = row["M"]
        totals = {}
        for key in (
            "exact_w12_us",
            "triton_qpass_midpoint_us",
            "cuda_qpass_midpoint_us",
            "int8_copy_us",
            "cublas_bf16_us",
        ):
            values = [
                (name, shape["rows"][i][key])
                for name, shape in shapes.items()
                if isinstance(shape, dict) and "rows" in shape
            ]
            totals[key] = (
                None
                if any(v is None for _, v in values)
                else sum((layers if name in PROJECTIONS else 1) * v for name, v in values)
            )
        if totals["exact_w12_us"] is None:  # the CPU dry run: no exact CUDA pass to compare with
            summary[f"M={m}"] = {"pass_us": totals}
            continue
        summary[f"M={m}"] = {
            "pass_us": totals,
            "qpass_over_exact": totals["triton_qpass_midpoint_us"] / totals["exact_w12_us"],
            "cuda_qpass_over_exact": totals["cuda_qpass_midpoint_us"] / totals["exact_w12_us"],
            "int8_over_exact": totals["int8_copy_us"] / totals["exact_w12_us"],
            "target_qpass_over_exact": 0.75,
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--rows", default="1,16,33", help="token rows (33: a 32-node tree and its root)")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--layers", type=int, default=64, help="projection layers a pass (27B-like: 64)")
    parser.add_argument("--replays", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    result = {
        **result_header("tlv_qpass_bench"),
        "device_used": args.device,
        "layers": args.layers,
        "weights": "synthetic: seeded N(0, 0.02) BF16",
        "method": "CUDA-graph replay over rotating copies >= 2x60 MB, median of --replays; pass = layers x "
        "projections + lm_head",
    }
    if args.device == "cpu":
        result["dry_run"] = "CPU, Triton interpreter, tiny shapes: correctness only, no timing"
        record_section(result, "correctness", lambda: correctness(TINY_SHAPES, "cpu"), args.out)
        result["shapes"] = {name: bench_shape(name, n, k, rows, 1, "cpu") for name, (n, k) in TINY_SHAPES.items()}
        result["summary"] = summarize(result["shapes"], args.layers)
        print_result(result, args.out)
        return
    result["gpu"] = torch.cuda.get_device_name()
    started = time.monotonic()
    record_section(
        result, "correctness", lambda: correctness({"qkv": SHAPES["qkv"], "down": SHAPES["down"]}, "cuda"), args.out
    )
    result["shapes"] = {}
    for name in args.shapes.split(","):
        record_section(
            result["shapes"], name, lambda name=name: bench_shape(name, *SHAPES[name], rows, args.replays), None
        )
        torch.cuda.empty_cache()
    result["summary"] = summarize(result["shapes"], args.layers)
    result["headline"] = (
        "; ".join(
            f"Q pass / exact W12 pass {key}: {value['qpass_over_exact']:.2f}x (INT8 copy "
            f"{value['int8_over_exact']:.2f}x)"
            for key, value in result["summary"].items()
            if "qpass_over_exact" in value
        )
        + " (target <= 0.75)"
    )
    result["wall_s"] = time.monotonic() - started
    print_result(result, args.out)


if __name__ == "__main__":
    main()
