"""Small fused kernels of the system engine's step: RMSNorm and SwiGLU's silu(gate) * up, one launch each.

A 64-layer step launches these ~200 times; as torch ops each is 4-7 kernels, which under a CUDA graph still
costs microseconds apiece against a ~11 ms weight floor. Both keep the torch references' operation order
(float32 inside, one rounding to the output dtype where the reference rounds), so the engine's options share
them and stay comparable. On a CPU they are the references (the interpreter's bf16 loads are not reliable).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(x * rsqrt(mean(x^2) + eps)) rounded to x's dtype, times weight (the engine's model.py RMSNorm)."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def add_rms_norm_reference(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """(x + delta, rms_norm(x + delta)): a residual add and the next norm."""
    y = x + delta
    return y, rms_norm_reference(y, weight, eps)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@triton.jit
def _rms_norm_kernel(x, w, out, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < N
    xv = tl.load(x + row * N + cols, mask=keep, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / N + eps)
    normed = (xv * inv).to(out.dtype.element_ty)
    wv = tl.load(w + cols, mask=keep, other=0.0)
    tl.store(out + row * N + cols, (normed * wv).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _add_rms_norm_kernel(x, delta, w, y, out, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < N
    total = (tl.load(x + row * N + cols, mask=keep, other=0.0).to(tl.float32)
             + tl.load(delta + row * N + cols, mask=keep, other=0.0).to(tl.float32)).to(y.dtype.element_ty)
    tl.store(y + row * N + cols, total, mask=keep)
    yv = total.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(yv * yv, axis=0) / N + eps)
    normed = (yv * inv).to(out.dtype.element_ty)
    wv = tl.load(w + cols, mask=keep, other=0.0)
    tl.store(out + row * N + cols, (normed * wv).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _silu_mul_kernel(gu, out, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < N
    g = tl.load(gu + row * 2 * N + cols, mask=keep, other=0.0)
    u = tl.load(gu + row * 2 * N + N + cols, mask=keep, other=0.0)
    gf = g.to(tl.float32)
    silu = (gf / (1.0 + tl.exp(-gf))).to(gu.dtype.element_ty)
    tl.store(out + row * N + cols, silu * u, mask=keep)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension in one launch on a GPU (the torch reference on a CPU).

    Args:
        x: [..., N] bf16/fp16/fp32, contiguous; weight: [N], x's dtype; eps: added to the mean square.
    Returns:
        [..., N] in x's dtype. Example: ``rms_norm(h, layer_norm_weight, 1e-6)``.
    """
    if not x.is_cuda:
        return rms_norm_reference(x, weight, eps)
    x = x.contiguous()
    N = x.shape[-1]
    out = torch.empty_like(x)
    _rms_norm_kernel[(x.numel() // N,)](x, weight, out, N, eps, BLOCK=triton.next_power_of_2(N),
                                        num_warps=8 if N >= 2048 else 4)
    return out


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float):
    """A residual add and RMSNorm of its result in one launch on a GPU (the reference on a CPU).

    Args:
        x, delta: [..., N] of one dtype, contiguous (the residual stream and a layer's output); weight: [N].
    Returns:
        (x + delta, rms_norm(x + delta, weight, eps)), both [..., N] in x's dtype.
        Example: ``x, h = add_rms_norm(x, attn_out, norm_weight, 1e-6)``.
    """
    if not x.is_cuda:
        return add_rms_norm_reference(x, delta, weight, eps)
    x, delta = x.contiguous(), delta.contiguous()
    N = x.shape[-1]
    y, out = torch.empty_like(x), torch.empty_like(x)
    _add_rms_norm_kernel[(x.numel() // N,)](x, delta, weight, y, out, N, eps, BLOCK=triton.next_power_of_2(N),
                                            num_warps=8 if N >= 2048 else 4)
    return y, out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused [..., 2N] gate_up projection in one launch on a GPU (the reference on a CPU).

    Args:
        gate_up: [..., 2N] contiguous, gate in the first N columns, up in the last N.
    Returns:
        [..., N] in gate_up's dtype. Example: ``down(silu_mul(gate_up(h)))``.
    """
    if not gate_up.is_cuda:
        return silu_mul_reference(gate_up)
    gate_up = gate_up.contiguous()
    N = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * N)
    out = torch.empty(*gate_up.shape[:-1], N, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(N))
    _silu_mul_kernel[(rows, triton.cdiv(N, block))](gate_up, out, N, BLOCK=block, num_warps=4)
    return out
