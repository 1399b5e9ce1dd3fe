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


def tree_conv_silu_reference(
    conv_state: torch.Tensor, x: torch.Tensor, conv_idx: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """silu of the causal depthwise conv along each row's root path: window = cat(conv_state, x) gathered by
    conv_idx, times weight, summed over the window (the products rounded to x's dtype, as torch does)."""
    B, T, C = x.shape
    cs = conv_idx.shape[-1]
    window = torch.cat([conv_state, x], dim=1)
    win = window.gather(1, conv_idx.reshape(B, T * cs, 1).expand(B, T * cs, C)).view(B, T, cs, C)
    return torch.nn.functional.silu((win * weight.t().to(win.dtype)).sum(2))


def gated_rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * silu(gate) (the GDN output's gated norm), each step rounded to x's dtype."""
    return rms_norm_reference(x, weight, eps) * torch.nn.functional.silu(gate)


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
    total = (
        tl.load(x + row * N + cols, mask=keep, other=0.0).to(tl.float32)
        + tl.load(delta + row * N + cols, mask=keep, other=0.0).to(tl.float32)
    ).to(y.dtype.element_ty)
    tl.store(y + row * N + cols, total, mask=keep)
    yv = total.to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(yv * yv, axis=0) / N + eps)
    normed = (yv * inv).to(out.dtype.element_ty)
    wv = tl.load(w + cols, mask=keep, other=0.0)
    tl.store(out + row * N + cols, (normed * wv).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _tree_conv_silu_kernel(state, x, idx, w, out, T, C, CS: tl.constexpr, BLOCK: tl.constexpr):
    bt = tl.program_id(0).to(tl.int64)
    b = bt // T
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < C
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(CS):
        src = tl.load(idx + bt * CS + j)
        from_state = src < CS - 1
        row_state = tl.where(from_state, src, 0)
        row_x = tl.where(from_state, 0, src - (CS - 1))
        vs = tl.load(state + (b * (CS - 1) + row_state) * C + cols, mask=keep & from_state, other=0.0)
        vx = tl.load(x + (b * T + row_x) * C + cols, mask=keep & (src >= CS - 1), other=0.0)
        v = tl.where(from_state, vs, vx)
        wj = tl.load(w + cols * CS + j, mask=keep, other=0.0).to(v.dtype)
        acc += (v * wj).to(tl.float32)  # each product rounded to the input dtype first, as torch's mul does
    summed = acc.to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + bt * C + cols, (summed / (1.0 + tl.exp(-summed))).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _gated_rms_norm_kernel(x, w, gate, out, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < N
    xv = tl.load(x + row * N + cols, mask=keep, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / N + eps)
    normed = ((xv * inv).to(out.dtype.element_ty) * tl.load(w + cols, mask=keep, other=0.0)).to(out.dtype.element_ty)
    g = tl.load(gate + row * N + cols, mask=keep, other=0.0).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(out.dtype.element_ty)
    tl.store(out + row * N + cols, (normed * silu).to(out.dtype.element_ty), mask=keep)


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
    _rms_norm_kernel[(x.numel() // N,)](
        x, weight, out, N, eps, BLOCK=triton.next_power_of_2(N), num_warps=8 if N >= 2048 else 4
    )
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
    _add_rms_norm_kernel[(x.numel() // N,)](
        x, delta, weight, y, out, N, eps, BLOCK=triton.next_power_of_2(N), num_warps=8 if N >= 2048 else 4
    )
    return y, out


def tree_conv_silu(
    conv_state: torch.Tensor, x: torch.Tensor, conv_idx: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """The GDN's causal conv + silu over draft-tree rows in one launch on a GPU (the reference on a CPU).

    Args:
        conv_state: [B, CS-1, C] the committed conv window per request; x: [B, T, C] the rows' conv inputs;
        conv_idx: [B, T, CS] int64, each row's window as indices into cat(conv_state, x) along its root path
            (< CS-1: the committed window); weight: [C, CS] depthwise taps.
    Returns:
        [B, T, C] in x's dtype. Example: ``mixed = tree_conv_silu(conv[:B], qkv, buf.conv_idx, conv_weight)``.
    """
    if not x.is_cuda:
        return tree_conv_silu_reference(conv_state, x, conv_idx, weight)
    B, T, C = x.shape
    CS = conv_idx.shape[-1]
    conv_state, x, conv_idx, weight = (t.contiguous() for t in (conv_state, x, conv_idx, weight))
    out = torch.empty_like(x)
    block = min(1024, triton.next_power_of_2(C))
    _tree_conv_silu_kernel[(B * T, triton.cdiv(C, block))](
        conv_state, x, conv_idx, weight, out, T, C, CS=CS, BLOCK=block, num_warps=4
    )
    return out


def gated_rms_norm(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * silu(gate) over the last dimension in one launch on a GPU (the reference on a CPU).

    Args:
        x, gate: [..., N] of one dtype, contiguous; weight: [N]. Returns [..., N] in x's dtype.
        Example: ``gated_rms_norm(o, out_norm_weight, z, 1e-6)`` (the GDN output before its projection).
    """
    if not x.is_cuda:
        return gated_rms_norm_reference(x, weight, gate, eps)
    x, gate = x.contiguous(), gate.contiguous()
    N = x.shape[-1]
    out = torch.empty_like(x)
    _gated_rms_norm_kernel[(x.numel() // N,)](
        x, weight, gate, out, N, eps, BLOCK=triton.next_power_of_2(N), num_warps=4
    )
    return out


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
