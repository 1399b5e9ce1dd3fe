"""Public codec: encode with the load-time bit-for-bit check, decode, and the check itself.

Encoding is the pure-torch reference run on the weight's own device (elementwise work: fast on a GPU).
"""

from __future__ import annotations

import torch

from .format import W12Error, W12Tensor
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
        raise W12Error(f"W12 tensor {name} decodes to shape {tuple(decoded.shape)}, source is {tuple(source.shape)}",
                       where=name, fix="re-encode this tensor")
    diff = decoded != source
    if bool(diff.any()):
        row, col = (int(v) for v in torch.nonzero(diff)[0])
        raise W12Error(
            f"W12 tensor {name} differs from its BF16 source at {int(diff.sum())} positions, first at "
            f"[{row}, {col}]: {int(decoded[row, col]) & 0xFFFF:#06x} != {int(source[row, col]) & 0xFFFF:#06x}",
            where=f"{name}[{row}, {col}]", fix="re-encode from the BF16 checkpoint; the stored planes are corrupt")
    return w12.stats()


def encode(weight: torch.Tensor, *, check: bool = True, name: str = "weight") -> W12Tensor:
    """Encode a BF16 weight [N, K] (CPU or GPU) to W12 on the same device, checked bit for bit."""
    w12 = encode_reference(weight)
    if check:
        check_roundtrip(weight, w12, name)
    return w12
