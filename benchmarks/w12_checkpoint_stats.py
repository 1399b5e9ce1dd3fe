"""Encode every weight matrix of real checkpoints as W12 (format v2), check each bit for bit, report sizes.

    PYTHONPATH=kernels:. python benchmarks/w12_checkpoint_stats.py CHECKPOINT [CHECKPOINT ...] [--device cuda]
        [--out benchmarks/results/w12-v2-checkpoint-stats-cpu.json]

A checkpoint is a .safetensors file or an .onnx model (its initializers and Constant nodes). Every floating tensor of 2 or more
dimensions is a weight matrix: [out, in] as is, conv kernels [out, in, kh, kw] as the [out, in * kh * kw] matrix an
im2col GEMM multiplies. Float32 / float16 weights are rounded to BF16 first (round to nearest even, torch's
``.to(torch.bfloat16)``; reported as the source dtype). Per tensor: bits per weight of its W12 form (planes with
padding, bases, escapes, pointers, header) under the v2 window and, for comparison, v1's; the escape fraction; and the
per-tensor choice (``encode_or_keep``): kept as BF16 where W12 does not pay, which stores it at 16 bits. Totals per
checkpoint and per tensor class (the name's last component before ``weight``), both with that choice.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specpilot_kernels.w12 import encode, encode_or_keep  # noqa: E402
from specpilot_mem.provenance import result_header, write_result  # noqa: E402


def weight_matrices(path: str):
    """(name, source dtype, matrix) of every floating tensor with >= 2 dimensions, matrices as described above."""
    if path.endswith(".onnx"):
        import onnx
        from onnx import numpy_helper

        graph = onnx.load(path).graph
        # weights are initializers, or (exported that way) the values of Constant nodes
        named = [(init.name, init) for init in graph.initializer]
        named += [
            (node.output[0], attr.t)
            for node in graph.node
            if node.op_type == "Constant"
            for attr in node.attribute
            if attr.name == "value"
        ]
        for name, proto in named:
            array = numpy_helper.to_array(proto)
            if array.ndim >= 2 and array.dtype.kind == "f":
                t = torch.from_numpy(array.copy())
                yield name, str(t.dtype).removeprefix("torch."), t.reshape(t.shape[0], -1)
        return
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            if t.dim() >= 2 and t.is_floating_point():
                yield name, str(t.dtype).removeprefix("torch."), t.reshape(t.shape[0], -1)


def tensor_class(name: str) -> str:
    parts = [p for p in re.split(r"[./:]", name) if p and p not in ("weight", "weights", "kernel") and not p.isdigit()]
    return parts[-1] if parts else name


def checkpoint_stats(path: str, device: str = "cpu") -> dict:
    tensors, classes = {}, {}
    weights = stored_w12_only = stored_choice = 0
    for name, dtype, matrix in weight_matrices(path):
        w = matrix.to(device=device, dtype=torch.bfloat16)
        w12, report = encode_or_keep(w, name=name)
        v2 = encode(w, check=w12 is None, name=name).stats() if w12 is None else w12.stats()  # checked either way
        v1 = encode(w, check=True, name=name, version=1).stats()
        entry = {
            **v2,
            "source_dtype": dtype,
            "v1_bits_per_weight": v1["bits_per_weight"],
            "v1_escape_fraction": v1["escape_fraction"],
            "kept_bf16": report["kept_bf16"],
            "stored_bits_per_weight": 16.0 if report["kept_bf16"] else v2["bits_per_weight"],
        }
        if report["kept_bf16"]:
            entry["kept_reason"] = report["reason"]
        tensors[name] = entry
        count = w.numel()
        weights += count
        stored_w12_only += v2["bytes"]
        stored_choice += count * entry["stored_bits_per_weight"] / 8
        cls = classes.setdefault(
            tensor_class(name),
            {
                "tensors": 0,
                "weights": 0,
                "stored_bits": 0.0,
                "kept_bf16": 0,
                "escapes": 0,
                "max_stored_bits_per_weight": 0.0,
            },
        )
        cls["tensors"] += 1
        cls["weights"] += count
        cls["stored_bits"] += count * entry["stored_bits_per_weight"]
        cls["kept_bf16"] += int(report["kept_bf16"])
        cls["escapes"] += v2["escapes"]
        cls["max_stored_bits_per_weight"] = max(cls["max_stored_bits_per_weight"], entry["stored_bits_per_weight"])
    for cls in classes.values():
        cls["bits_per_weight"] = cls.pop("stored_bits") / cls["weights"]
        cls["escape_fraction"] = cls.pop("escapes") / cls["weights"]
    return {
        "checkpoint": path,
        "tensors": tensors,
        "classes": classes,
        "weights": weights,
        "bits_per_weight": 8.0 * stored_choice / max(weights, 1),
        "bits_per_weight_all_w12": 8.0 * stored_w12_only / max(weights, 1),
        "escape_fraction": sum(s["escapes"] for s in tensors.values()) / max(weights, 1),
        "max_stored_bits_per_weight": max((s["stored_bits_per_weight"] for s in tensors.values()), default=0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    parser.add_argument("--label", action="append", default=[], help="NAME=what the checkpoint is (repeatable)")
    args = parser.parse_args()
    labels = dict(item.split("=", 1) for item in args.label)
    doc = {**result_header("w12_checkpoint_stats"), "checkpoints": []}
    for path in args.checkpoints:
        stats = checkpoint_stats(path, args.device)
        stats["what"] = labels.get(Path(path).name, "")
        doc["checkpoints"].append(stats)
        print(
            f"{path}: {stats['bits_per_weight']:.4f} bits/weight with the per-tensor choice "
            f"({stats['bits_per_weight_all_w12']:.4f} all W12), escapes {stats['escape_fraction']:.2e}, "
            f"max {stats['max_stored_bits_per_weight']:.2f}",
            file=sys.stderr,
        )
        if args.out:
            write_result(doc, args.out)
    if not args.out:
        import json

        print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
