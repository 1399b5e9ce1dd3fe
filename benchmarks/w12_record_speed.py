"""Time the W12 encode path with its version 3 record on the weight's device: encode (checked bit for bit), the
stats (which size the record), the record write and its checked read back, on the 27B-class shapes.

    PYTHONPATH=kernels:. python benchmarks/w12_record_speed.py [--device cuda] [--shapes qkv,down] [--out R.json]

Weights are seeded N(0, 0.02) BF16 with 1e-4 of them set to outliers (zeros, tiny and huge values) so the escape
and base streams are exercised. The 27B figure is the measured seconds per weight over all shapes times 27e9.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specpilot_kernels.w12 import decode, encode, from_canonical, to_canonical  # noqa: E402
from specpilot_mem.bench.shapes import SHAPES  # noqa: E402
from specpilot_mem.provenance import result_header, write_result  # noqa: E402

OUTLIER_FRACTION = 1e-4


def timed(device: torch.device, fn):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    value = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return value, time.perf_counter() - start


def shape_speed(n: int, k: int, device: torch.device) -> dict:
    gen = torch.Generator(device=device).manual_seed(n + k)
    w = (torch.randn(n, k, device=device, generator=gen) * 0.02).bfloat16()
    where = torch.randperm(n * k, device=device, generator=gen)[: int(OUTLIER_FRACTION * n * k)]
    pool = torch.tensor([0.0, 1e-30, 3e4, -2e-25], device=device).bfloat16()
    w.view(-1)[where] = pool[torch.arange(where.numel(), device=device) % pool.numel()]
    w12, encode_s = timed(device, lambda: encode(w, check=True))
    stats, stats_s = timed(device, w12.stats)
    record, write_s = timed(device, lambda: to_canonical(w12))
    back, read_s = timed(device, lambda: from_canonical(record))
    same = bool(torch.equal(decode(back).view(torch.int16), w.view(torch.int16)))
    total = encode_s + stats_s + write_s
    return {
        "shape": [n, k],
        "encode_checked_s": encode_s,
        "stats_s": stats_s,
        "record_write_s": write_s,
        "record_read_s": read_s,
        "encode_path_s": total,
        "weights_per_s": n * k / total,
        "record_roundtrip_bit_exact": same,
        "bits_per_weight": stats["bits_per_weight"],
        "memory_bits_per_weight": stats["memory_bits_per_weight"],
        "escape_fraction": stats["escape_fraction"],
        "record_bytes": stats["record_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--scale", type=float, default=1.0, help="shrink every shape (CPU dry runs)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    doc = {**result_header("w12_record_speed"), "outlier_fraction": OUTLIER_FRACTION, "shapes": {}}
    encode(torch.ones(128, 128, device=device).bfloat16())  # first-call setup out of the timings
    for name in args.shapes.split(","):
        n, k = (max(1, int(d * args.scale)) for d in SHAPES[name])
        doc["shapes"][name] = shape_speed(n, k, device)
        print(f"{name} {n}x{k}: {doc['shapes'][name]}", file=sys.stderr)
    weights = sum(s["shape"][0] * s["shape"][1] for s in doc["shapes"].values())
    seconds = sum(s["encode_path_s"] for s in doc["shapes"].values())
    doc["seconds_per_27e9_weights"] = 27e9 * seconds / weights
    doc["all_bit_exact"] = all(s["record_roundtrip_bit_exact"] for s in doc["shapes"].values())
    # the record is a function of the weight alone: the device's bytes equal the CPU encoder's
    gen = torch.Generator(device=device).manual_seed(1)
    w = (torch.randn(1024, 2048, device=device, generator=gen) * 0.02).bfloat16()
    w[::7, ::13] = 0.0
    here = to_canonical(encode(w))["record"].cpu()
    doc["record_equals_cpu_encode"] = bool(torch.equal(here, to_canonical(encode(w.cpu()))["record"]))
    print(
        f"27B encode path (encode checked + stats + v3 record): {doc['seconds_per_27e9_weights']:.1f} s; "
        f"bit exact: {doc['all_bit_exact']}; record equals the CPU encoder's: {doc['record_equals_cpu_encode']}",
        file=sys.stderr,
    )
    if args.out:
        write_result(doc, args.out)


if __name__ == "__main__":
    main()
