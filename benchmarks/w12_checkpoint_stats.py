"""Encode every 2-D weight of a safetensors checkpoint as W12, check each bit for bit, report sizes.

Prints JSON: per tensor the bits per weight (planes, padding, bases, escapes, pointers and header
included) and the escape fraction, plus totals. Float32 tensors are rounded to BF16 first (reported).

    PYTHONPATH=kernels:. python benchmarks/w12_checkpoint_stats.py models/target.safetensors [--device cuda]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys

import torch
from safetensors import safe_open

from specpilot_kernels.w12 import encode


def checkpoint_stats(path: str, device: str = "cpu") -> dict:
    tensors, weights, stored = {}, 0, 0
    with safe_open(path, framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dim() != 2 or not t.is_floating_point():
                continue
            w = t.to(device=device, dtype=torch.bfloat16)
            stats = encode(w, check=True, name=name).stats()  # raises W12Error on any differing bit
            stats["source_dtype"] = str(t.dtype).removeprefix("torch.")
            tensors[name] = stats
            weights += w.numel()
            stored += stats["bytes"]
    return {"tensors": tensors, "weights": weights, "bits_per_weight": 8.0 * stored / max(weights, 1),
            "escape_fraction": sum(s["escapes"] for s in tensors.values()) / max(weights, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    doc = {"benchmark": "w12_checkpoint_stats", "checkpoint": args.checkpoint,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "PYTHONPATH=kernels:. python benchmarks/w12_checkpoint_stats.py " + " ".join(sys.argv[1:]),
           **checkpoint_stats(args.checkpoint, args.device)}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
