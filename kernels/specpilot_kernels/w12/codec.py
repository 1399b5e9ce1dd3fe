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
        version: the format version's window rule (2: the window covering the most weights).

    Example: ``w12 = encode(layer.weight.data, name="layers.0.q_proj")``.
    """
    w12 = encode_reference(weight, version)
    if check:
        check_roundtrip(weight, w12, name)
    return w12


# A tensor is stored as W12 only where that pays: its W12 form at most this share of BF16's bytes (14.4 bits a
# weight) and at most MAX_ESCAPE_FRACTION of its weights escaped (where the GEMM's escape patching stays cheap;
# measured up to 1e-2). Otherwise it stays BF16.
W12_MAX_SHARE_OF_BF16 = 0.90
MAX_ESCAPE_FRACTION = 0.02


def encode_or_keep(weight: torch.Tensor, *, name: str = "weight") -> tuple[W12Tensor | None, dict]:
    """The per-tensor choice: (W12 tensor, report) where W12 pays, else (None, report) and the weight stays BF16.

    Args:
        weight: bf16 [N, K] (CPU or GPU), encoded and checked bit for bit when kept as W12.

    The report: name, shape, bits_per_weight (of the W12 form, headers and escapes included), escape_fraction,
    kept_bf16 and, when kept, the reason. Example: ``w12, report = encode_or_keep(w, name="lm_head")``.
    """
    w12 = encode(weight, check=False, name=name)
    stats = w12.stats()
    report = {
        "name": name,
        "shape": stats["shape"],
        "bits_per_weight": stats["bits_per_weight"],
        "escape_fraction": stats["escape_fraction"],
        "escapes": stats["escapes"],
        "kept_bf16": False,
    }
    if stats["bits_per_weight"] > 16.0 * W12_MAX_SHARE_OF_BF16:
        report.update(
            kept_bf16=True,
            reason=f"W12 needs {stats['bits_per_weight']:.2f} bits a weight, more than "
            f"{W12_MAX_SHARE_OF_BF16:.0%} of BF16's 16",
        )
    elif stats["escape_fraction"] > MAX_ESCAPE_FRACTION:
        report.update(
            kept_bf16=True,
            reason=f"{stats['escape_fraction']:.2%} of its weights escape the window "
            f"(more than {MAX_ESCAPE_FRACTION:.0%})",
        )
    if report["kept_bf16"]:
        return None, report
    check_roundtrip(weight, w12, name)
    return w12, report
