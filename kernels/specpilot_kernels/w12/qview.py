"""The 8-bit view as Q-pass weights, read without a copy.

Each view byte is a normal FP8 E4M3 number (the window excludes E4M3's subnormal and NaN codes), and
the weight's top 8 bits equal that number times ``2**(base - 120)`` per output channel. The Q pass
drops the 4 low mantissa bits: "midpoint" puts them at 1000 (the middle of the interval they span,
the paper's choice), "truncated" at 0000.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .format import W12Tensor
from .mma import W12MmaTensor, w12_mma_gemm
from .reference import qpass_weight_reference


def fp8_view(w12: W12Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn [N, K] sharing the view plane's storage, fp32 [N] per-row scale 2**(base-120)).

    ``fp8[n, k].float() * scale[n]`` is the truncated Q-pass weight; no bytes are copied.
    """
    n, k = w12.shape
    scale = torch.exp2(w12.base[:n].to(torch.float32) - 120.0)
    return w12.view.view(torch.float8_e4m3fn)[:n, :k], scale


def qpass_linear(x: torch.Tensor, w12: W12Tensor | W12MmaTensor, low_bits: str = "midpoint") -> torch.Tensor:
    """Q-pass product x [..., K] bf16 -> [..., N] bf16 from the 8-bit view alone.

    On CUDA the W12 GEMM (mma.sync for a W12MmaTensor, Triton for a W12Tensor) reads only the view
    plane (8 of 12 bits); on the CPU the reference weight of a W12Tensor.
    """
    flat = x.reshape(-1, x.shape[-1])
    if flat.is_cuda and isinstance(w12, W12MmaTensor):
        y = w12_mma_gemm(flat.contiguous(), w12, low_bits=low_bits)
    elif flat.is_cuda:
        y = _triton_gemm(flat.contiguous(), w12, low_bits=low_bits)
    else:
        y = F.linear(flat, qpass_weight_reference(w12, low_bits))
    return y.reshape(*x.shape[:-1], w12.shape[0])


def _triton_gemm(*args, **kwargs):
    from .gemm import w12_gemm  # Triton, imported only where a W12Tensor meets a CUDA input

    return w12_gemm(*args, **kwargs)
