"""``w12_linear``: the drop-in for ``F.linear`` with a W12 weight (the SGLang and HF methods call this)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .codec import decode
from .format import W12Tensor
from .mma import W12MmaTensor, w12_mma_gemm


def w12_linear(x: torch.Tensor, w12: W12Tensor | W12MmaTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ W^T (+ bias) for x bf16 [..., K] -> bf16 [..., N].

    On CUDA: a :class:`W12MmaTensor` (``to_mma_layout(w12)``, the fast path) runs the mma.sync kernel, a
    :class:`W12Tensor` the Triton kernel; both decode in registers and are deterministic across row
    counts. On the CPU (a W12Tensor): the exact decoded weight through F.linear, so the output equals
    the unquantized layer's bit for bit.
    """
    if not x.is_cuda:
        return F.linear(x, decode(w12), bias)
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    y = w12_mma_gemm(flat, w12) if isinstance(w12, W12MmaTensor) else _triton_gemm(flat, w12)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], w12.shape[0])


def _triton_gemm(*args, **kwargs):
    from .gemm import w12_gemm  # Triton, imported only where a W12Tensor meets a CUDA input

    return w12_gemm(*args, **kwargs)
