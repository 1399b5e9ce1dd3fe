"""Convert a BF16 safetensors checkpoint to W12 records, tensor by tensor, with a conversion report.

    python -m specpilot_kernels.w12.convert CHECKPOINT.safetensors OUT.safetensors [--device cuda] [--report R.json]

Every 2-D BF16 tensor is encoded (checked bit for bit) and stored as its canonical record, format version 3
(one uint8 tensor ``NAME.w12.record``), where the record pays
(:func:`~specpilot_kernels.w12.codec.encode_for_storage`); every other tensor, and each W12 candidate that does not
pay, is copied unchanged. The report (printed as JSON, or written to ``--report``) lists per tensor its shape,
bits per weight (stored and in memory), escape fraction, whether it was kept as BF16 (and why) and whether its
record loads as BF16 (and why: the W12 GEMM would not pay in memory).
:func:`load_converted` reads such a file back, and files of versions 1 and 2 (tile records ``NAME.w12.records``,
``.base``, ``.escapes``, ``.escape_bits``, ``.header``), refusing records it cannot trust.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from .codec import decode, encode_for_storage, runs_as_bf16
from .format import W12Error, W12Tensor, from_canonical, to_canonical

W12_SUFFIX = ".w12."
TILE_RECORD_FIELDS = ("records", "base", "escapes", "escape_bits", "header")  # versions 1 and 2


def convert_tensors(
    tensors: dict[str, torch.Tensor], device: str = "cpu"
) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """(stored tensors, per-tensor reports): W12 records for the 2-D BF16 tensors where W12 pays, the rest as given."""
    out, reports = {}, []
    for name, tensor in tensors.items():
        if tensor.dim() != 2 or tensor.dtype != torch.bfloat16:
            out[name] = tensor
            continue
        w12, report = encode_for_storage(tensor.to(device), name=name)
        reports.append(report)
        if w12 is None:
            out[name] = tensor
            continue
        for field, value in to_canonical(w12).items():
            out[f"{name}{W12_SUFFIX}{field}"] = value.cpu().contiguous()
    return out, reports


def load_converted(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor | W12Tensor]:
    """The checkpoint :func:`convert_tensors` wrote (or one of versions 1 and 2): W12 tensors by name (checked by
    ``from_canonical``) where the W12 GEMM pays in memory, the others decoded exactly to BF16
    (:func:`~specpilot_kernels.w12.codec.runs_as_bf16`), the rest as stored. A version 1/2 record with a missing
    field is refused naming it."""
    out, groups = {}, {}
    for key, value in tensors.items():
        if W12_SUFFIX in key:
            name, _, field = key.rpartition(W12_SUFFIX)
            groups.setdefault(name, {})[field] = value
        else:
            out[key] = value
    for name, fields in groups.items():
        missing = [] if "record" in fields else [f for f in TILE_RECORD_FIELDS if f not in fields]
        if missing:
            raise W12Error(
                f"W12 tensor {name} lacks {', '.join(missing)}",
                where=f"{name}{W12_SUFFIX}*",
                fix="the file is incomplete: convert the BF16 checkpoint again",
            )
        w12 = from_canonical(fields, name=name)
        out[name] = decode(w12) if runs_as_bf16(w12.stats()) else w12
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specpilot_kernels.w12.convert", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--device", default="cpu", help="where to encode (cuda: fast)")
    parser.add_argument("--report", default=None, help="write the conversion report (JSON) here")
    args = parser.parse_args(argv)
    from safetensors.torch import load_file, save_file

    stored, reports = convert_tensors(load_file(args.checkpoint), args.device)
    save_file(stored, args.out)
    text = json.dumps({"checkpoint": args.checkpoint, "out": args.out, "tensors": reports}, indent=1)
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(text + "\n")
    else:
        print(text)
    kept = sum(r["kept_bf16"] for r in reports)
    loads = sum(r.get("loads_as_bf16", False) for r in reports)
    print(f"{len(reports) - kept} tensors as W12 ({loads} of them load as BF16), {kept} kept as BF16", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
