"""Pure-torch W12: the exact semantics of the codec, the GEMM and the Q-pass weights.

Runs on CPU and GPU (the encoder used on the H200 is this code: it is elementwise torch work).
"""

from __future__ import annotations

import torch

from .format import (
    ESCAPE_HIGH_BYTE,
    ESCAPE_LOW_BYTE,
    FORMAT_VERSION,
    MAX_BASE,
    MAX_OFFSET,
    STEP_K,
    SUPPORTED_VERSIONS,
    TILE_N,
    W12Error,
    W12Tensor,
    bucket_escapes,
    escape_positions,
    nibbles_from_kernel_layout,
    nibbles_to_kernel_layout,
    padded,
)

ROW_CHUNK = 16384  # rows encoded at once: bounds the int32 temporaries to ~8 bytes x 16384 x K


def _fields(bits: torch.Tensor):
    bits = bits.to(torch.int32) & 0xFFFF
    return bits >> 15, (bits >> 7) & 0xFF, bits & 0x7F


def _in_window(exp, man, base):
    top = base + MAX_OFFSET
    normal = (exp >= 1) & (exp <= 254)
    inside = (exp > base) & (exp <= top) & ~((exp == top) & ((man >> 4) == 7))
    return normal & inside


def window_counts(bits: torch.Tensor) -> torch.Tensor:
    """In-window weight counts int32 [rows, 240] of int16 BF16 bits [rows, K], one column per window base 0..239.

    A per-row histogram of the normal exponents (and of those with top mantissa bits 111) gives every
    window's count at once: base b covers exponents b+1 .. b+15, less the excluded code (exponent b+15,
    mmm = 111). One bincount over (row, exponent, mmm == 111) keys; elementwise work on the weight's device.
    """
    rows = bits.shape[0]
    _, exp, man = _fields(bits)
    key = (
        torch.arange(rows, device=bits.device, dtype=torch.int32)[:, None] * 512
        + exp * 2
        + ((man >> 4) == 7).to(torch.int32)
    )
    hist = torch.bincount(key.reshape(-1), minlength=rows * 512).view(rows, 256, 2)
    normal = hist.sum(-1)
    normal[:, 0] = 0  # zeros and denormals
    normal[:, 255] = 0  # Inf and NaN
    cum = torch.nn.functional.pad(torch.cumsum(normal, dim=1), (1, 0))  # cum[:, e] = weights with exponent < e
    bases = torch.arange(MAX_BASE + 1, device=bits.device)
    tops = bases + MAX_OFFSET
    return (cum[:, tops + 1] - cum[:, bases + 1] - hist[:, tops, 1]).to(torch.int32)


def choose_base(bits: torch.Tensor) -> torch.Tensor:
    """Per-row window base (int32 [rows]) for int16 BF16 bits [rows, K]: the 16-binade window that covers the most
    weights (format version 2).

    Window ``base`` covers exponents base+1 .. base+15 minus the excluded top code (exponent base+15 with mantissa
    111, E4M3's NaN), so a count is exactly the weights it stores without escape. Tie rule: the lowest base among the
    windows with the largest count (``argmax`` keeps the first maximum). A row with no normal weight gets base 0.
    base is at most 239 so the decode's add never carries into the sign (base + 15 <= 254).
    """
    return torch.argmax(window_counts(bits), dim=1).to(torch.int32)


def choose_base_v1(bits: torch.Tensor) -> torch.Tensor:
    """Format version 1's window (kept to re-create v1 records bit for bit): the top at the row's largest normal
    exponent E, or E + 1 when that leaves fewer escapes; ties keep E."""
    _, exp, man = _fields(bits)
    normal = (exp >= 1) & (exp <= 254)
    e_max = torch.where(normal, exp, torch.zeros_like(exp)).amax(dim=1)
    base_a = (e_max - MAX_OFFSET).clamp(0, MAX_BASE)
    base_b = (base_a + 1).clamp(max=MAX_BASE)
    esc_a = (~_in_window(exp, man, base_a[:, None])).sum(1)
    esc_b = (~_in_window(exp, man, base_b[:, None])).sum(1)
    return torch.where(esc_b < esc_a, base_b, base_a)


def encode_reference(weight: torch.Tensor, version: int = FORMAT_VERSION) -> W12Tensor:
    """Encode a BF16 weight ``[N, K]`` (any device) into a :class:`W12Tensor` on the same device.

    ``version`` picks the window rule: 3 (the default) and 2 the window covering the most weights, 1 the v1 rule
    (the planes are laid out alike; only the chosen bases, and so the escapes, differ). Version 3 differs from 2
    only in its stored record (:func:`~specpilot_kernels.w12.format.to_canonical`)."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        got = (
            f"{weight.dtype} of shape {tuple(weight.shape)}"
            if isinstance(weight, torch.Tensor)
            else type(weight).__name__
        )
        raise W12Error(
            f"W12 encodes 2-D bfloat16 weights, got {got}",
            where="encode(weight)",
            fix="pass the linear layer's [out_features, in_features] BF16 weight "
            "(convert float32/float16 checkpoints with .to(torch.bfloat16) first, if that is the model's dtype)",
        )
    if version not in SUPPORTED_VERSIONS:
        raise W12Error(
            f"W12 format version {version} is not one this code writes ({sorted(SUPPORTED_VERSIONS)})",
            where="encode(version=)",
            fix=f"use version={FORMAT_VERSION}",
        )
    window = choose_base_v1 if version == 1 else choose_base
    n, k = weight.shape
    np_, kp = padded(n, TILE_N), padded(k, STEP_K)
    device = weight.device
    view = torch.zeros(np_, kp, dtype=torch.uint8, device=device)
    nib = torch.zeros(np_, kp, dtype=torch.uint8, device=device)
    base = torch.zeros(np_, dtype=torch.uint8, device=device)
    esc_rows, esc_cols, esc_bits = [], [], []
    raw = weight.contiguous().view(torch.int16)
    for r0 in range(0, n, ROW_CHUNK):
        bits = raw[r0 : r0 + ROW_CHUNK]
        sign, exp, man = _fields(bits)
        row_base = window(bits)[:, None]
        ok = _in_window(exp, man, row_base)
        byte = (sign << 7) | ((exp - row_base) << 3) | (man >> 4)
        escaped_byte = (sign << 7) | torch.where(exp > row_base, ESCAPE_HIGH_BYTE, ESCAPE_LOW_BYTE)
        view[r0 : r0 + bits.shape[0], :k] = torch.where(ok, byte, escaped_byte).to(torch.uint8)
        nib[r0 : r0 + bits.shape[0], :k] = torch.where(ok, man & 0xF, 0).to(torch.uint8)
        base[r0 : r0 + bits.shape[0]] = row_base[:, 0].to(torch.uint8)
        r, c = torch.nonzero(~ok, as_tuple=True)
        esc_rows.append(r + r0)
        esc_cols.append(c)
        esc_bits.append(bits[r, c])
    rows, cols, vals = torch.cat(esc_rows), torch.cat(esc_cols), torch.cat(esc_bits)
    esc_ptr, esc_loc, esc_val = bucket_escapes(rows, cols, vals, np_, kp)
    return W12Tensor((n, k), view, nibbles_to_kernel_layout(nib), base, esc_ptr, esc_loc, esc_val, version)


def decoded_bits(w12: W12Tensor, low_bits: str = "exact") -> torch.Tensor:
    """int32 BF16 bit patterns [Np, Kp] of the padded tensor.

    ``low_bits``: "exact" uses the nibbles and patches escapes (the lossless decode); "truncated" and
    "midpoint" are the Q-pass weights read from the 8-bit view alone, with the 4 dropped mantissa bits
    set to 0000 or to 1000 (the middle of the interval they span), escapes left at their view byte.
    """
    b = w12.view.to(torch.int32)
    if low_bits == "exact":
        low = nibbles_from_kernel_layout(w12.nibbles).to(torch.int32)
    elif low_bits in ("truncated", "midpoint"):
        low = torch.full_like(b, 8 if low_bits == "midpoint" else 0)
    else:
        raise W12Error(f"unknown low_bits {low_bits!r}", where="decoded_bits", fix="use exact, truncated or midpoint")
    bits = (((b & 0x7F) << 4) + (w12.base.to(torch.int32)[:, None] << 7)) | ((b & 0x80) << 8) | low
    if low_bits == "exact":
        rows, cols = escape_positions(w12)
        bits[rows, cols] = w12.esc_val.to(torch.int32) & 0xFFFF
    else:
        # Escaped bytes s.0000.000 are E4M3 zeros: the Q-pass reads them as +-0.
        bits = torch.where((b & 0x7F) == ESCAPE_LOW_BYTE, (b & 0x80) << 8, bits)
    return bits


def decode_reference(w12: W12Tensor) -> torch.Tensor:
    """The exact BF16 weight ``[N, K]`` back, on the tensor's device."""
    n, k = w12.shape
    return decoded_bits(w12)[:n, :k].to(torch.int16).contiguous().view(torch.bfloat16)


def qpass_weight_reference(w12: W12Tensor, low_bits: str = "midpoint") -> torch.Tensor:
    """The Q-pass BF16 weight ``[N, K]`` implied by the 8-bit view ("midpoint" or "truncated")."""
    n, k = w12.shape
    return decoded_bits(w12, low_bits)[:n, :k].to(torch.int16).contiguous().view(torch.bfloat16)


def gemm_reference(x: torch.Tensor, w12: W12Tensor) -> torch.Tensor:
    """y = x @ W^T in fp32 from the exact weights, rounded to BF16: x [M, K] bf16 -> y [M, N] bf16."""
    return (x.float() @ decode_reference(w12).float().t()).to(torch.bfloat16)
