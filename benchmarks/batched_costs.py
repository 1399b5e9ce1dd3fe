"""c(R) of the batched benchmark's shapes on the GPU: one target layer's GEMMs (qkv, o, gate-up, down)
and the LM head at every row count of ``batching.costs.ROW_GRID``, bf16 cuBLAS, CUDA-graph replay over
weight copies larger than L2 (each read cold, as in a real step). Prints one JSON document that
``StepCosts.from_measurement`` reads (``--costs`` of ``benchmarks/batched_bench.py``).

    PYTHONPATH=kernels:. python3 benchmarks/batched_costs.py --out benchmarks/results/batched-costs-h200.json
    PYTHONPATH=kernels:. python3 benchmarks/batched_costs.py --device cpu --scale 32 --rows 1,16,64   # dry run

``--scale`` divides every dimension (CPU dry runs only: the shapes are then not the named ones).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.batching.costs import ROW_GRID, SHAPES  # noqa: E402
from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402

L2_BYTES = 60 * 2**20
WEIGHT_SET_BYTES = 400 * 2**20  # the rotating weight copies exceed L2 several times over


def time_ms(fn_for_copy, copies: int, device: torch.device) -> float:
    """Median ms per call of ``fn_for_copy(i)`` over the copies: CUDA-graph replay on the GPU, wall clock on the CPU."""
    if device.type == "cuda":
        from specpilot_mem.bench.cuda_timing import graph_replay_us

        return graph_replay_us(fn_for_copy, copies=copies, replays=15) / 1e3
    samples = []
    for _ in range(3):
        start = time.perf_counter()
        for i in range(copies):
            fn_for_copy(i)
        samples.append((time.perf_counter() - start) * 1e3 / copies)
    return statistics.median(samples)


@torch.no_grad()
def measure_shape(name: str, rows: list[int], device: torch.device, dtype: torch.dtype, scale: int) -> dict:
    shape = SHAPES[name]
    linears = [(i // scale, o // scale) for i, o in shape.linears]
    d, vocab = shape.d_model // scale, shape.vocab // scale
    elt = torch.finfo(dtype).bits // 8
    layer_bytes = sum(i * o for i, o in linears) * elt
    copies = max(1, -(-WEIGHT_SET_BYTES // layer_bytes)) if device.type == "cuda" else 1
    layer = [[torch.randn(o, i, device=device, dtype=dtype) * 0.02 for i, o in linears] for _ in range(copies)]
    head = torch.randn(vocab, d, device=device, dtype=dtype) * 0.02
    widest = max(i for i, _ in linears)
    x = torch.randn(max(rows), widest, device=device, dtype=dtype)
    out = {
        "rows": rows,
        "layer_ms": [],
        "lm_head_ms": [],
        "copies": copies,
        "scale": scale,
        "linears": [list(p) for p in linears],
        "vocab": vocab,
        "d_model": d,
    }

    def layer_pass(xm):
        return lambda c: [F.linear(xm[:, :i], w) for w, (i, _) in zip(layer[c], linears)]

    def head_pass(xm):
        return lambda c: F.linear(xm[:, :d], head)

    for m in rows:
        out["layer_ms"].append(time_ms(layer_pass(x[:m]), copies, device))
        out["lm_head_ms"].append(time_ms(head_pass(x[:m]), 1, device))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="4b,27b")
    ap.add_argument("--rows", help="comma-separated row counts (default: batching.costs.ROW_GRID)")
    ap.add_argument("--scale", type=int, default=1, help="divide every dimension (CPU dry runs)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rows = [int(r) for r in args.rows.split(",")] if args.rows else list(ROW_GRID)
    doc = {
        **result_header("batched_costs"),
        "synthetic": True,
        "dtype": str(dtype).replace("torch.", ""),
        "what": "target layer GEMMs and LM head at R rows (random weights at the named shapes)",
        "shapes": {},
    }
    if device.type == "cuda":
        doc["device_name"] = torch.cuda.get_device_name(device)
    for name in args.shapes.split(","):
        started = time.perf_counter()
        try:
            doc["shapes"][name] = measure_shape(name, rows, device, dtype, args.scale)
        except Exception as exc:  # keep the other shape's figures
            doc["shapes"][name] = {"error": f"{type(exc).__name__}: {exc}"}
        doc["shapes"][name]["seconds"] = round(time.perf_counter() - started, 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{name}: {doc['shapes'][name]['seconds']} s", file=sys.stderr, flush=True)
        if args.out:
            write_result(doc, args.out)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
