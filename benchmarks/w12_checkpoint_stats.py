"""Encode every weight matrix of real checkpoints as W12 (format v3), check each bit for bit, report sizes.

    PYTHONPATH=kernels:. python benchmarks/w12_checkpoint_stats.py CHECKPOINT [CHECKPOINT ...] [--device cuda]
        [--out benchmarks/results/w12-v3-checkpoint-stats-cpu.json]

A checkpoint is a .safetensors file or an .onnx model (its initializers and Constant nodes). Every floating tensor of 2 or more
dimensions is a weight matrix: [out, in] as is, conv kernels [out, in, kh, kw] as the [out, in * kh * kw] matrix an
im2col GEMM multiplies. Float32 / float16 weights are rounded to BF16 first (round to nearest even, torch's
``.to(torch.bfloat16)``; reported as the source dtype). Per tensor: bits per weight of its stored W12 record (every
byte of the version 3 record, each section apart: header, view and nibble planes, bases, base exceptions, escape bits
and gaps), of its kernel layout in memory (planes padded to 128 x 128, a base byte a row, bucketed escapes: what
version 2's stats counted); the escape fraction; and the per-tensor choice on disk (``encode_for_storage``): kept as
BF16 where the record does not pay, which stores it at 16 bits, and whether a stored record loads as BF16 (the W12
GEMM would not pay in memory). Every record is written, read back and decoded bit for bit. Totals per checkpoint and
per tensor class (the name's last component before ``weight``), both with that choice, the bits of each record section
per class, and the bits held in memory after loading (kernel layout, or 16 where a tensor runs as BF16).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specpilot_kernels.w12 import check_roundtrip, encode, from_canonical, to_canonical  # noqa: E402
from specpilot_kernels.w12.codec import encode_for_storage  # noqa: E402
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


SECTIONS = ("header", "view", "nibbles", "base", "base_exceptions", "escape_bits", "escape_gaps")


def checkpoint_stats(path: str, device: str = "cpu") -> dict:
    tensors, classes = {}, {}
    weights = stored_w12_only = stored_choice = loaded = 0
    sections = dict.fromkeys(SECTIONS, 0)
    for name, dtype, matrix in weight_matrices(path):
        w = matrix.to(device=device, dtype=torch.bfloat16)
        w12, report = encode_for_storage(w, name=name)
        if w12 is None:
            w12 = encode(w, check=True, name=name)
        record = to_canonical(w12)
        check_roundtrip(w, from_canonical(record, name=name), name)  # what is written decodes bit for bit
        stats = w12.stats()
        assert stats["bytes"] == record["record"].numel()
        entry = {
            **stats,
            "source_dtype": dtype,
            "kept_bf16": report["kept_bf16"],
            "stored_bits_per_weight": 16.0 if report["kept_bf16"] else stats["bits_per_weight"],
            "loads_as_bf16": report.get("loads_as_bf16", True),
        }
        entry["loaded_bits_per_weight"] = 16.0 if entry["loads_as_bf16"] else stats["memory_bits_per_weight"]
        if report["kept_bf16"]:
            entry["kept_reason"] = report["reason"]
        elif report["loads_as_bf16"]:
            entry["load_reason"] = report["load_reason"]
        tensors[name] = entry
        count = w.numel()
        weights += count
        stored_w12_only += stats["bytes"]
        stored_choice += count * entry["stored_bits_per_weight"] / 8
        loaded += count * entry["loaded_bits_per_weight"] / 8
        cls = classes.setdefault(
            tensor_class(name),
            {
                "tensors": 0,
                "weights": 0,
                "stored_bits": 0.0,
                "kept_bf16": 0,
                "kept_bf16_weights": 0,
                "loads_as_bf16": 0,
                "escapes": 0,
                "max_stored_bits_per_weight": 0.0,
                "sections": dict.fromkeys(SECTIONS, 0),
            },
        )
        cls["tensors"] += 1
        cls["weights"] += count
        cls["stored_bits"] += count * entry["stored_bits_per_weight"]
        cls["kept_bf16"] += int(report["kept_bf16"])
        cls["loads_as_bf16"] += int(entry["loads_as_bf16"] and not report["kept_bf16"])
        cls["escapes"] += stats["escapes"]
        cls["max_stored_bits_per_weight"] = max(cls["max_stored_bits_per_weight"], entry["stored_bits_per_weight"])
        if report["kept_bf16"]:
            cls["kept_bf16_weights"] += count
        else:
            for key, size in stats["record_bytes"].items():
                cls["sections"][key] += size
                sections[key] += size
    for cls in classes.values():
        cls["bits_per_weight"] = cls.pop("stored_bits") / cls["weights"]
        cls["escape_fraction"] = cls.pop("escapes") / cls["weights"]
        # bits a weight over the class's weights: each record section, and what the tensors kept as BF16 add
        cls["bits_per_weight_by_section"] = {
            key: 8.0 * size / cls["weights"] for key, size in cls.pop("sections").items()
        }
        cls["bits_per_weight_by_section"]["kept_bf16"] = 16.0 * cls.pop("kept_bf16_weights") / cls["weights"]
    embeddings = {c for c in classes if "embed" in c}
    rest = [tensors[n] for n in tensors if tensor_class(n) not in embeddings]
    rest_weights = sum(t["shape"][0] * t["shape"][1] for t in rest)
    return {
        "checkpoint": path,
        "tensors": tensors,
        "classes": classes,
        "weights": weights,
        "bits_per_weight": 8.0 * stored_choice / max(weights, 1),
        "bits_per_weight_all_w12": 8.0 * stored_w12_only / max(weights, 1),
        "loaded_bits_per_weight": 8.0 * loaded / max(weights, 1),
        "bits_per_weight_without_embeddings": (
            sum(t["shape"][0] * t["shape"][1] * t["stored_bits_per_weight"] for t in rest) / rest_weights
            if rest_weights
            else None
        ),
        "bits_per_weight_by_section": {key: 8.0 * size / max(weights, 1) for key, size in sections.items()},
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
            f"({stats['bits_per_weight_all_w12']:.4f} all W12, {stats['bits_per_weight_without_embeddings']} without "
            f"embeddings; {stats['loaded_bits_per_weight']:.4f} in memory once loaded), escapes "
            f"{stats['escape_fraction']:.2e}, "
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
