"""The INT8 Q-pass copy's memory at the 27B-like shape (the ``tlv`` entry's ``--specpilot-tlv-qpass int8``): the bytes
one ``int8_copy`` and one W12 record (``W12MmaTensor``, what the exact pass keeps) hold for each of the shape's linear
kinds, summed over the layers that have it, plus the LM head; against the 8-bit view, which costs nothing on top.

Each kind's weight is a seeded N(0, 0.02) BF16 tensor; its first ``--sample-rows`` rows (all, for smaller kinds) are
encoded and copied once on the CPU and the objects' own ``nbytes`` scaled to the kind's rows (both forms are per row
apart from W12's escapes and headers, which the sample's rate stands for).

    PYTHONPATH=kernels:. python benchmarks/tlv_int8_copy_memory.py [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.provenance import print_result, result_header  # noqa: E402


def main(argv=None) -> int:
    from specpilot_kernels.w12 import encode, to_mma_layout
    from specpilot_kernels.w12.int8_copy import int8_copy

    from specpilot_mem.engine.shapes import get_shape

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3.8-27b-like")
    ap.add_argument("--sample-rows", type=int, default=2048)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    started = time.perf_counter()
    shape = get_shape(args.shape, False)
    dims = {**shape.linear_shapes(), "lm_head": (shape.vocab_size, shape.d_model)}
    counts = Counter(name for kind in shape.layer_types for name in shape.layer_linears(kind))
    counts["lm_head"] = 1
    kinds, totals = {}, Counter()
    for name, (n, k) in dims.items():
        torch.manual_seed(0)
        rows = min(n, args.sample_rows)
        weight = (torch.randn(rows, k) * 0.02).bfloat16()
        sizes = {
            "bf16": n * k * weight.element_size(),
            "w12": round(to_mma_layout(encode(weight)).nbytes() * n / rows),
            "int8_copy": round(int8_copy(weight).nbytes() * n / rows),
        }
        kinds[name] = {"N": n, "K": k, "count": counts[name], "sampled_rows": rows, **sizes}
        for key, value in sizes.items():
            totals[key] += counts[name] * value
        del weight
    weights = sum(counts[name] * n * k for name, (n, k) in dims.items())
    result = {
        **result_header("tlv_int8_copy_memory"),
        "shape": args.shape,
        "weights": weights,
        "kinds": kinds,
        "total_bytes": dict(totals),
        "int8_copy_bits_per_weight": 8 * totals["int8_copy"] / weights,
        "w12_bits_per_weight": 8 * totals["w12"] / weights,
        "int8_copy_over_w12": totals["int8_copy"] / totals["w12"],
        "view_extra_bytes": 0,
    }
    result["headline"] = (
        f"INT8 Q-pass copy at {args.shape}: +{totals['int8_copy'] / 1e9:.1f} GB "
        f"({result['int8_copy_bits_per_weight']:.2f} bits a weight) on top of W12's {totals['w12'] / 1e9:.1f} GB "
        f"(+{100 * result['int8_copy_over_w12']:.0f}%); the 8-bit view: +0"
    )
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
