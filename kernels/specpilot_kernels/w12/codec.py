"""Public codec: encode with the load-time bit-for-bit check, decode, the check itself, and the per-tensor choice
between W12 and BF16.

Encoding is the pure-torch reference run on the weight's own device (elementwise work: fast on a GPU).
"""

from __future__ import annotations

import torch

from .format import FORMAT_VERSION, W12Error, W12Tensor
from .reference import decode_reference, encode_reference


def decode(w12: W12Tensor) -> torch.Tensor:
    """The exact BF16 weight [N, K] on the W12 tensor's device."""
    return decode_reference(w12)


def check_roundtrip(weight: torch.Tensor, w12: W12Tensor, name: str = "weight") -> dict:
    """Compare the decoded tensor with its BF16 source bit for bit; raise W12Error on any difference.

    Returns the tensor's statistics (bits per weight with headers and escapes, escape fraction).
    """
    decoded = decode(w12).view(torch.int16)
    source = weight.contiguous().view(torch.int16).to(decoded.device)
    if decoded.shape != source.shape:
        raise W12Error(
            f"W12 tensor {name} decodes to shape {tuple(decoded.shape)}, source is {tuple(source.shape)}",
            where=name,
            fix="re-encode this tensor",
        )
    diff = decoded != source
    if bool(diff.any()):
        row, col = (int(v) for v in torch.nonzero(diff)[0])
        raise W12Error(
            f"W12 tensor {name} differs from its BF16 source at {int(diff.sum())} positions, first at "
            f"[{row}, {col}]: {int(decoded[row, col]) & 0xFFFF:#06x} != {int(source[row, col]) & 0xFFFF:#06x}",
            where=f"{name}[{row}, {col}]",
            fix="re-encode from the BF16 checkpoint; the stored planes are corrupt",
        )
    return w12.stats()


def encode(
    weight: torch.Tensor, *, check: bool = True, name: str = "weight", version: int = FORMAT_VERSION
) -> W12Tensor:
    """Encode a BF16 weight [N, K] (CPU or GPU) to W12 on the same device, checked bit for bit.

    Args:
        weight: bf16 [N, K], the linear layer's [out_features, in_features] weight.
        version: the format version's window rule (3 and 2: the window covering the most weights; 1: v1's).

    Example: ``w12 = encode(layer.weight.data, name="layers.0.q_proj")``.
    """
    w12 = encode_reference(weight, version)
    if check:
        check_roundtrip(weight, w12, name)
    return w12


# W12 is used only where it pays, judged twice. In memory (the kernel layout, padded to 128 x 128: what the GEMM
# holds and reads) a tensor runs as W12 when that form is at most this share of BF16's bytes (14.4 bits a weight) and
# at most MAX_ESCAPE_FRACTION of its weights escape (where the GEMM's escape patching stays cheap; measured up to
# 1e-2); otherwise it runs as BF16. On disk a tensor is stored as a W12 record when the record is at most the same
# share of BF16's bytes (a record that runs as BF16 is decoded exactly at load); otherwise it is stored as BF16.
W12_MAX_SHARE_OF_BF16 = 0.90
MAX_ESCAPE_FRACTION = 0.02


def runs_as_bf16(stats: dict) -> str | None:
    """Why a tensor with these :meth:`W12Tensor.stats` runs as BF16, or None where the W12 GEMM pays."""
    if stats["memory_bits_per_weight"] > 16.0 * W12_MAX_SHARE_OF_BF16:
        return (
            f"W12 needs {stats['memory_bits_per_weight']:.2f} bits a weight in memory, more than "
            f"{W12_MAX_SHARE_OF_BF16:.0%} of BF16's 16"
        )
    if stats["escape_fraction"] > MAX_ESCAPE_FRACTION:
        return f"{stats['escape_fraction']:.2%} of its weights escape the window (more than {MAX_ESCAPE_FRACTION:.0%})"
    return None


def _report(name: str, stats: dict) -> dict:
    return {
        "name": name,
        "shape": stats["shape"],
        "bits_per_weight": stats["bits_per_weight"],
        "memory_bits_per_weight": stats["memory_bits_per_weight"],
        "escape_fraction": stats["escape_fraction"],
        "escapes": stats["escapes"],
        "kept_bf16": False,
    }


def encode_or_keep(weight: torch.Tensor, *, name: str = "weight") -> tuple[W12Tensor | None, dict]:
    """The per-tensor choice in memory: (W12 tensor, report) where the W12 GEMM pays, else (None, report) and the
    weight stays BF16.

    Args:
        weight: bf16 [N, K] (CPU or GPU), encoded and checked bit for bit when kept as W12.

    The report: name, shape, bits_per_weight (of the stored W12 record, every byte), memory_bits_per_weight (of
    the kernel layout, which this choice judges), escape_fraction, kept_bf16 and, when kept, the reason.
    Example: ``w12, report = encode_or_keep(w, name="lm_head")``.
    """
    w12 = encode(weight, check=False, name=name)
    report = _report(name, w12.stats())
    reason = runs_as_bf16(report)
    if reason:
        report.update(kept_bf16=True, reason=reason)
        return None, report
    check_roundtrip(weight, w12, name)
    return w12, report


def encode_for_storage(weight: torch.Tensor, *, name: str = "weight") -> tuple[W12Tensor | None, dict]:
    """The per-tensor choice on disk: (W12 tensor, report) where its version 3 record pays, else (None, report) and
    the weight is stored as BF16.

    The report is :func:`encode_or_keep`'s, kept_bf16 and reason judging the stored record, plus loads_as_bf16 (and
    load_reason): a stored record that :func:`~specpilot_kernels.w12.convert.load_converted` decodes to BF16
    because the W12 GEMM would not pay in memory (:func:`runs_as_bf16`).
    """
    w12 = encode(weight, check=False, name=name)
    report = _report(name, w12.stats())
    if report["bits_per_weight"] > 16.0 * W12_MAX_SHARE_OF_BF16:
        report.update(
            kept_bf16=True,
            reason=f"its W12 record needs {report['bits_per_weight']:.2f} bits a weight, more than "
            f"{W12_MAX_SHARE_OF_BF16:.0%} of BF16's 16",
        )
        return None, report
    check_roundtrip(weight, w12, name)
    load_reason = runs_as_bf16(report)
    report["loads_as_bf16"] = load_reason is not None
    if load_reason:
        report["load_reason"] = load_reason
    return w12, report
