"""Small fused kernels of the system engine's step, one launch each: RMSNorm (alone, after a residual add, gated),
SwiGLU's silu(gate) * up, the GDN's causal conv along tree paths, attention's q/k norm + RoPE + cache write, tree
attention over a dense cache (split over the keys, flash-decoding style), and the commits of conv windows and GDN
state snapshots for all layers at once.

A 64-layer step launches these hundreds of times; as torch ops each is 4-25 kernels, which under a CUDA graph
still costs microseconds apiece against a ~11 ms weight floor. They read the projections' outputs in place
(strided views, no copies) and keep the torch references' operation order (float32 inside, one rounding to the
output dtype where the reference rounds), so the engine's options share them and stay comparable. On a CPU they
are the references (the interpreter's bf16 loads are not reliable); ``interpreted_kernels()`` runs the kernels
on CPU tensors under ``TRITON_INTERPRET=1`` instead (the tests' fp32 check of the whole step).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

_INTERPRETED = False


@contextlib.contextmanager
def interpreted_kernels():
    """Within: the kernels run on CPU tensors through the Triton interpreter (needs ``TRITON_INTERPRET=1``)."""
    global _INTERPRETED
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("interpreted_kernels() needs TRITON_INTERPRET=1 set before triton is imported")
    _INTERPRETED, before = True, _INTERPRETED
    try:
        yield
    finally:
        _INTERPRETED = before


def _kernels(x: torch.Tensor) -> bool:
    return x.is_cuda or _INTERPRETED


_PDL_DEVICES: dict = {}


@functools.lru_cache(maxsize=8)
def _pdl_waves(value: str) -> float:
    """``SPECPILOT_PDL_WAVES`` parsed once per value, not at each of a step's hundreds of launches."""
    try:
        waves = float(value)
    except ValueError:
        waves = -1.0
    if not waves > 0:
        raise ValueError(f"SPECPILOT_PDL_WAVES={value!r}: set it to a positive number")
    return waves


def _pdl(x: torch.Tensor, *grid: int, allowed: bool = True) -> dict:
    """Launch options for programmatic dependent launch (Hopper and newer; ``SPECPILOT_PDL=0`` switches it off):
    a kernel of at most one program per SM is launched while its producer still runs and waits in ``_pdl_start``
    for the producer's writes, so the launch latency between a decode step's hundreds of small dependent kernels
    overlaps the work before them (SGLang launches its GDN kernel the same way). Larger grids launch normally:
    their programs would wait resident on the SMs the producer still needs (on the H200 that made 33-row steps
    slower, while 1-row steps gained). ``SPECPILOT_PDL_WAVES=w`` moves that bound to w programs an SM (the probe of
    whether 8-row grids of 1-2 waves gain from it; 1 unless set). ``allowed=False``: a tile that must not (``RowTile.pdl``)."""
    if not allowed or not x.is_cuda or os.environ.get("SPECPILOT_PDL", "1") == "0":
        return {}
    waves = _pdl_waves(os.environ.get("SPECPILOT_PDL_WAVES", "1"))
    if x.device not in _PDL_DEVICES:
        props = torch.cuda.get_device_properties(x.device)
        _PDL_DEVICES[x.device] = props.multi_processor_count if props.major >= 9 else 0
    return {"PDL": True, "launch_pdl": True} if math.prod(grid) <= waves * _PDL_DEVICES[x.device] else {}


@triton.jit
def _pdl_start(PDL: tl.constexpr, TRIGGER: tl.constexpr = True):
    if PDL:  # before any load or store: the producer's writes are visible after the wait
        tl.extra.cuda.gdc_wait()
        if TRIGGER:  # let the next PDL kernel launch now (it waits for this one the same way)
            tl.extra.cuda.gdc_launch_dependents()


# -- launch tiles by row count -----------------------------------------------------------------------------------
#
# One program per row wastes a 17-33-row verify step's launches on per-program set-up (index loads, the conv
# taps); one program per many rows starves a 1-row step of SMs. So an element-wise op's tile is a row range's
# entry: (most rows, tile), the first entry whose bound holds. No bit depends on the tile, so none depends on the row
# count either (every element's arithmetic, and each row's reduction, is the same whatever the tile; the q/k norm +
# RoPE keeps one tile at every row count because its per-head reduction's order follows its warps:
# ``benchmarks/engine_linear_probe.py --sections fused`` checks it on the GPU bit for bit and times the choices).


@dataclass(frozen=True)
class RowTile:
    """Rows a program and columns a program (``block``: 0 is the whole row) of an element-wise fused op, its warps,
    and whether it may launch with programmatic dependent launch (``pdl``; still only grids of at most one program
    an SM): a tile that makes a 17-33-row grid that small must not, since its waiting programs would hold SMs that
    the producer GEMM's large tiles need (on the H200 such a conv made the 32-33-row stock step ~1 ms slower)."""

    rows: int
    block: int = 0
    num_warps: int = 4
    pdl: bool = True

    def __post_init__(self):
        if self.rows < 1 or self.rows & (self.rows - 1) or self.block < 0 or self.block & (self.block - 1):
            raise ValueError(f"RowTile{(self.rows, self.block)}: rows and block are powers of two (block 0: a row)")


# From the H200 sweep (benchmarks/probes/engine-tiles-h200-2026-12-03/): one row a program where that was fastest
# or unmeasured, two (conv) to sixteen (gated norm) where the sweep found them faster at 17-33 rows.
FUSED_TILES: dict[str, tuple[tuple[int, RowTile], ...]] = {
    # [B*T, C] windows: few rows want narrow column blocks to spread over the SMs; more share the taps' loads
    "tree_conv_silu": ((8, RowTile(1, 256, 2)), (1 << 30, RowTile(2, 512, 4, pdl=False))),
    # [rows, 2N] -> [rows, N]: one row a program was as fast as any tile that keeps the grid above one wave
    "silu_mul": ((1 << 30, RowTile(1, 1024, 4)),),
    # [tokens * heads, N]: rows are (token, head) pairs (48 a token at the 27B-like shape)
    "gated_rms_norm": (
        (64, RowTile(1, 0, 4)),
        (1024, RowTile(8, 0, 4, pdl=False)),
        (1 << 30, RowTile(16, 0, 8, pdl=False)),
    ),
    # [B*T] tokens x (HQ + HKV) heads; warps doubled for head dims above 128
    "qk_norm_rope": ((1 << 30, RowTile(1, 0, 1)),),
}


def row_tile(op: str, rows: int) -> RowTile:
    """The tile ``op`` launches with for ``rows`` rows (``FUSED_TILES``)."""
    return next(tile for top, tile in FUSED_TILES[op] if rows <= top)


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
def _rms_norm_kernel(x, w, out, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    keep = cols < N
    xv = tl.load(x + row * N + cols, mask=keep, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=0) / N + eps)
    normed = (xv * inv).to(out.dtype.element_ty)
    wv = tl.load(w + cols, mask=keep, other=0.0)
    tl.store(out + row * N + cols, (normed * wv).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _add_rms_norm_kernel(x, delta, w, y, out, N, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
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
def _tree_conv_silu_kernel(
    state,
    x,
    idx,
    w,
    out,
    raw,
    BT,
    T,
    C,
    sx,
    CS: tl.constexpr,
    BR: tl.constexpr,
    BLOCK: tl.constexpr,
    RAW: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    bt = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)  # BR rows (request * T + row) a program
    keep_r = bt < BT
    b = bt // T
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = keep_r[:, None] & (cols < C)[None, :]
    acc = tl.zeros([BR, BLOCK], dtype=tl.float32)
    for j in tl.static_range(CS):
        src = tl.load(idx + bt * CS + j, mask=keep_r, other=0)
        from_state = src < CS - 1
        row_state = tl.where(from_state, src, 0)
        row_x = tl.where(from_state, 0, src - (CS - 1))
        vs = tl.load(
            state + ((b * (CS - 1) + row_state) * C)[:, None] + cols[None, :],
            mask=keep & from_state[:, None],
            other=0.0,
        )
        vx = tl.load(x + ((b * T + row_x) * sx)[:, None] + cols[None, :], mask=keep & ~from_state[:, None], other=0.0)
        v = tl.where(from_state[:, None], vs, vx)
        wj = tl.load(w + cols * CS + j, mask=cols < C, other=0.0).to(v.dtype)  # one tap load for all BR rows
        acc += (v * wj[None, :]).to(tl.float32)  # each product rounded to the input dtype first, as torch's mul does
    summed = acc.to(out.dtype.element_ty).to(tl.float32)
    offs = (bt * C)[:, None] + cols[None, :]
    tl.store(out + offs, (summed / (1.0 + tl.exp(-summed))).to(out.dtype.element_ty), mask=keep)
    if RAW:  # the rows' own conv inputs, for the commit of the conv window (read here anyway)
        tl.store(raw + offs, tl.load(x + (bt * sx)[:, None] + cols[None, :], mask=keep, other=0.0), mask=keep)


@triton.jit
def _gated_rms_norm_kernel(
    x, w, gate, out, ROWS, N, HEADS, sg, eps, BR: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False
):
    _pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)  # BR (token, head) rows a program
    cols = tl.arange(0, BLOCK)
    keep = (row < ROWS)[:, None] & (cols < N)[None, :]
    xv = tl.load(x + (row * N)[:, None] + cols[None, :], mask=keep, other=0.0).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(xv * xv, axis=1) / N + eps)
    wv = tl.load(w + cols, mask=cols < N, other=0.0)
    normed = ((xv * inv[:, None]).to(out.dtype.element_ty) * wv[None, :]).to(out.dtype.element_ty)
    # the gate is read in place: row = token * HEADS + head, tokens sg apart
    g_off = ((row // HEADS) * sg + (row % HEADS) * N)[:, None] + cols[None, :]
    g = tl.load(gate + g_off, mask=keep, other=0.0).to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(out.dtype.element_ty)
    tl.store(out + (row * N)[:, None] + cols[None, :], (normed * silu).to(out.dtype.element_ty), mask=keep)


@triton.jit
def _silu_mul_kernel(gu, out, ROWS, N, BR: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = (row < ROWS)[:, None] & (cols < N)[None, :]
    base = (row * 2 * N)[:, None] + cols[None, :]
    g = tl.load(gu + base, mask=keep, other=0.0)
    u = tl.load(gu + base + N, mask=keep, other=0.0)
    gf = g.to(tl.float32)
    silu = (gf / (1.0 + tl.exp(-gf))).to(gu.dtype.element_ty)
    tl.store(out + (row * N)[:, None] + cols[None, :], silu * u, mask=keep)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension in one launch on a GPU (the torch reference on a CPU).

    Args:
        x: [..., N] bf16/fp16/fp32, contiguous; weight: [N], x's dtype; eps: added to the mean square.
    Returns:
        [..., N] in x's dtype. Example: ``rms_norm(h, layer_norm_weight, 1e-6)``.
    """
    if not _kernels(x):
        return rms_norm_reference(x, weight, eps)
    x = x.contiguous()
    N = x.shape[-1]
    out = torch.empty_like(x)
    _rms_norm_kernel[(x.numel() // N,)](
        x,
        weight,
        out,
        N,
        eps,
        BLOCK=triton.next_power_of_2(N),
        **_pdl(x, x.numel() // N),
        num_warps=8 if N >= 2048 else 4,
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
    if not _kernels(x):
        return add_rms_norm_reference(x, delta, weight, eps)
    x, delta = x.contiguous(), delta.contiguous()
    N = x.shape[-1]
    y, out = torch.empty_like(x), torch.empty_like(x)
    _add_rms_norm_kernel[(x.numel() // N,)](
        x,
        delta,
        weight,
        y,
        out,
        N,
        eps,
        BLOCK=triton.next_power_of_2(N),
        **_pdl(x, x.numel() // N),
        num_warps=8 if N >= 2048 else 4,
    )
    return y, out


def tree_conv_silu(
    conv_state: torch.Tensor,
    x: torch.Tensor,
    conv_idx: torch.Tensor,
    weight: torch.Tensor,
    raw: torch.Tensor | None = None,
) -> torch.Tensor:
    """The GDN's causal conv + silu over draft-tree rows in one launch on a GPU (the reference on a CPU).

    Args:
        conv_state: [B, CS-1, C] the committed conv window per request; x: [B, T, C] the rows' conv inputs (a view
            of the input projection is read in place: unit channel stride, tokens a common stride apart);
        conv_idx: [B, T, CS] int64, each row's window as indices into cat(conv_state, x) along its root path
            (< CS-1: the committed window); weight: [C, CS] depthwise taps; raw: [B, T, C] contiguous, or None:
            where a contiguous copy of x goes (what ``conv_commit`` reads).
    Returns:
        [B, T, C] in x's dtype. Example: ``mixed = tree_conv_silu(conv[:B], qkv, buf.conv_idx, conv_weight)``.
    """
    if not _kernels(x):
        if raw is not None:
            raw.copy_(x)
        return tree_conv_silu_reference(conv_state, x, conv_idx, weight)
    B, T, C = x.shape
    CS = conv_idx.shape[-1]
    if x.stride(2) != 1 or x.stride(0) != T * x.stride(1):
        x = x.contiguous()
    conv_state, conv_idx, weight = (t.contiguous() for t in (conv_state, conv_idx, weight))
    out = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    tile = row_tile("tree_conv_silu", B * T)
    block = min(tile.block or 1 << 30, triton.next_power_of_2(C))
    grid = (triton.cdiv(B * T, tile.rows), triton.cdiv(C, block))
    _tree_conv_silu_kernel[grid](
        conv_state,
        x,
        conv_idx,
        weight,
        out,
        out if raw is None else raw,
        B * T,
        T,
        C,
        x.stride(1),
        CS=CS,
        BR=tile.rows,
        BLOCK=block,
        RAW=raw is not None,
        **_pdl(x, *grid, allowed=tile.pdl),
        num_warps=tile.num_warps,
    )
    return out


def gated_rms_norm(x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * silu(gate) over the last dimension in one launch on a GPU (the reference on a CPU).

    Args:
        x: [..., HEADS, N] contiguous; gate: x's shape and dtype (a view of the input projection is read in place:
            unit stride, heads N apart, tokens a common stride apart); weight: [N]. Returns [..., N] in x's dtype.
        Example: ``gated_rms_norm(o, out_norm_weight, z, 1e-6)`` (the GDN output before its projection).
    """
    if not _kernels(x):
        return gated_rms_norm_reference(x, weight, gate, eps)
    x = x.contiguous()
    N = x.shape[-1]
    heads = x.shape[-2] if x.dim() >= 2 else 1
    try:
        g3 = gate.view(-1, heads, N)
    except RuntimeError:
        g3 = gate.contiguous().view(-1, heads, N)
    if g3.stride(2) != 1 or g3.stride(1) != N:
        g3 = g3.contiguous()
    out = torch.empty_like(x)
    rows = x.numel() // N
    tile = row_tile("gated_rms_norm", rows)
    grid = (triton.cdiv(rows, tile.rows),)
    _gated_rms_norm_kernel[grid](
        x,
        weight,
        g3,
        out,
        rows,
        N,
        heads,
        g3.stride(0),
        eps,
        BR=tile.rows,
        BLOCK=triton.next_power_of_2(N),
        **_pdl(x, *grid, allowed=tile.pdl),
        num_warps=tile.num_warps,
    )
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused [..., 2N] gate_up projection in one launch on a GPU (the reference on a CPU).

    Args:
        gate_up: [..., 2N] contiguous, gate in the first N columns, up in the last N.
    Returns:
        [..., N] in gate_up's dtype. Example: ``down(silu_mul(gate_up(h)))``.
    """
    if not _kernels(gate_up):
        return silu_mul_reference(gate_up)
    gate_up = gate_up.contiguous()
    N = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * N)
    out = torch.empty(*gate_up.shape[:-1], N, dtype=gate_up.dtype, device=gate_up.device)
    tile = row_tile("silu_mul", rows)
    block = min(tile.block or 1 << 30, triton.next_power_of_2(N))
    grid = (triton.cdiv(rows, tile.rows), triton.cdiv(N, block))
    _silu_mul_kernel[grid](
        gate_up,
        out,
        rows,
        N,
        BR=tile.rows,
        BLOCK=block,
        **_pdl(gate_up, *grid, allowed=tile.pdl),
        num_warps=tile.num_warps,
    )
    return out


# -- attention: q/k norm + RoPE + cache write, then tree attention over the dense cache --------------------------


def apply_rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (rotate-half) of x [B, T, H, D] with cos/sin [B, T, D/2] float32 (model.rope's arithmetic)."""
    d = x.shape[-1]
    cos, sin = cos[:, :, None], sin[:, :, None]
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def qk_norm_rope_reference(q, k, v, cos, sin, q_weight, k_weight, eps, k_cache=None, v_cache=None, slots=None):
    """RMSNorm of q and k per head (when weights are given), RoPE of both, the rows' k / v written at
    ``slots`` of the caches (when given). Returns contiguous (q, k, v)."""
    if q_weight is not None:
        q, k = rms_norm_reference(q, q_weight, eps), rms_norm_reference(k, k_weight, eps)
    q, k, v = apply_rope_reference(q, cos, sin), apply_rope_reference(k, cos, sin), v.contiguous()
    if k_cache is not None:
        bidx = torch.arange(q.shape[0], device=q.device)[:, None]
        k_cache[bidx, :, slots] = k.to(k_cache.dtype)
        v_cache[bidx, :, slots] = v.to(v_cache.dtype)
    return q, k, v


@triton.jit
def _qk_norm_rope_kernel(
    q,
    k,
    v,
    cos,
    sin,
    qw,
    kw,
    q_out,
    k_out,
    v_out,
    kc,
    vc,
    slots,
    sq,
    sk,
    sv,
    kc_b,
    kc_h,
    BT,
    T,
    HQ,
    HKV,
    eps,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BR: tl.constexpr,
    QK_NORM: tl.constexpr,
    WRITE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    bt = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)  # BR tokens (request * T + row) a program
    keep_r = bt < BT
    h = tl.program_id(1)
    is_q = h < HQ
    is_k = h >= HQ
    kh = tl.maximum(h - HQ, 0)
    j = tl.arange(0, HALF)
    mq = keep_r[:, None] & is_q
    mk = keep_r[:, None] & is_k
    x1 = tl.where(
        is_q,
        tl.load(q + (bt * sq)[:, None] + h * D + j[None, :], mask=mq, other=0.0),
        tl.load(k + (bt * sk)[:, None] + kh * D + j[None, :], mask=mk, other=0.0),
    ).to(tl.float32)
    x2 = tl.where(
        is_q,
        tl.load(q + (bt * sq)[:, None] + h * D + HALF + j[None, :], mask=mq, other=0.0),
        tl.load(k + (bt * sk)[:, None] + kh * D + HALF + j[None, :], mask=mk, other=0.0),
    ).to(tl.float32)
    dt = q_out.dtype.element_ty
    if QK_NORM:
        inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / D + eps)
        w1 = tl.where(is_q, tl.load(qw + j), tl.load(kw + j))
        w2 = tl.where(is_q, tl.load(qw + HALF + j), tl.load(kw + HALF + j))
        x1 = ((x1 * inv[:, None]).to(dt) * w1[None, :]).to(dt).to(tl.float32)
        x2 = ((x2 * inv[:, None]).to(dt) * w2[None, :]).to(dt).to(tl.float32)
    cs = (bt * HALF)[:, None] + j[None, :]
    c = tl.load(cos + cs, mask=keep_r[:, None], other=0.0)
    s = tl.load(sin + cs, mask=keep_r[:, None], other=0.0)
    y1 = (x1 * c - x2 * s).to(dt)
    y2 = (x2 * c + x1 * s).to(dt)
    qo = ((bt * HQ + h) * D)[:, None] + j[None, :]
    tl.store(q_out + qo, y1, mask=mq)
    tl.store(q_out + qo + HALF, y2, mask=mq)
    d = tl.arange(0, 2 * HALF)
    md = mk & (d < D)[None, :]
    vv = tl.load(v + (bt * sv)[:, None] + kh * D + d[None, :], mask=md, other=0.0)
    ko = ((bt * HKV + kh) * D)[:, None]
    tl.store(k_out + ko + j[None, :], y1, mask=mk)
    tl.store(k_out + ko + HALF + j[None, :], y2, mask=mk)
    tl.store(v_out + ko + d[None, :], vv, mask=md)
    if WRITE:
        b = bt // T
        slot = tl.load(slots + bt, mask=keep_r, other=0)
        base = (b * kc_b + kh * kc_h + slot * D)[:, None]
        tl.store(kc + base + j[None, :], y1.to(kc.dtype.element_ty), mask=mk)
        tl.store(kc + base + HALF + j[None, :], y2.to(kc.dtype.element_ty), mask=mk)
        tl.store(vc + base + d[None, :], vv.to(vc.dtype.element_ty), mask=md)


def _rows_view(x: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] as read in place: unit stride, heads D apart, batch and tokens one common stride."""
    B, T, H, D = x.shape
    if x.stride(3) != 1 or x.stride(2) != D or x.stride(0) != T * x.stride(1):
        x = x.contiguous()
    return x


def qk_norm_rope(q, k, v, cos, sin, q_weight, k_weight, eps, k_cache=None, v_cache=None, slots=None):
    """Attention's q/k RMSNorm (per head, when weights are given), RoPE and the rows' cache write in one launch on
    a GPU (the reference on a CPU).

    Args:
        q: [B, T, HQ, D], k, v: [B, T, HKV, D] of one dtype (views of the fused QKV projection are read in place);
        cos, sin: [B, T, D/2] float32 at each row's position; q_weight, k_weight: [D] or None (no q/k norm);
        k_cache, v_cache: [B, HKV, L, D] (unit token stride D), or None: no write; slots: [B, T] int64 cache
            positions the rows' k / v go to.
    Returns:
        (q, k, v) contiguous, q and k normed and rotated. Example:
        ``q, k, v = qk_norm_rope(q, k, v, cos, sin, qn, kn, 1e-6, kc, vc, slots)``.
    """
    if not _kernels(q):
        return qk_norm_rope_reference(q, k, v, cos, sin, q_weight, k_weight, eps, k_cache, v_cache, slots)
    B, T, HQ, D = q.shape
    HKV = k.shape[2]
    if D % 2 or D & (D - 1):
        raise ValueError(f"qk_norm_rope takes power-of-two head dims, got {D}")
    q, k, v = _rows_view(q), _rows_view(k), _rows_view(v)
    q_out = torch.empty(B, T, HQ, D, dtype=q.dtype, device=q.device)
    k_out, v_out = (torch.empty(B, T, HKV, D, dtype=q.dtype, device=q.device) for _ in range(2))
    write = k_cache is not None
    if write and (k_cache.stride(3) != 1 or k_cache.stride(2) != D or v_cache.stride() != k_cache.stride()):
        raise ValueError("qk_norm_rope writes caches laid out [B, HKV, L, D] with unit token stride D")
    norm = q_weight is not None
    tile = row_tile("qk_norm_rope", B * T)
    grid = (triton.cdiv(B * T, tile.rows), HQ + HKV)
    _qk_norm_rope_kernel[grid](
        q,
        k,
        v,
        cos.contiguous(),
        sin.contiguous(),
        q_weight if norm else q,
        k_weight if norm else q,
        q_out,
        k_out,
        v_out,
        k_cache if write else q_out,
        v_cache if write else q_out,
        slots.contiguous() if write else cos,
        q.stride(1),
        k.stride(1),
        v.stride(1),
        k_cache.stride(0) if write else 0,
        k_cache.stride(1) if write else 0,
        B * T,
        T,
        HQ,
        HKV,
        eps,
        D=D,
        HALF=D // 2,
        BR=tile.rows,
        QK_NORM=norm,
        WRITE=write,
        **_pdl(q, *grid, allowed=tile.pdl),
        num_warps=tile.num_warps * (1 if D <= 128 else 2),
    )
    return q_out, k_out, v_out


def tree_attention_reference(q, k_cache, v_cache, k_rows, v_rows, lengths, anc, gate=None, window=0):
    """Each row attends to its request's first ``lengths`` cache keys (the last ``window`` of them when window > 0)
    and to the rows it descends from (``anc``).

    q [B, T, HQ, D]; k_cache/v_cache [B, HKV, L, D] or None (no context); k_rows/v_rows [B, T, HKV, D];
    lengths [B] long or None; anc [B, T, T] bool; gate [B, T, HQ * D] or None (o * sigmoid(gate)).
    Returns [B, T, HQ * D] in q's dtype (SDPA, GQA folded into the query rows)."""
    B, T, HQ, D = q.shape
    HKV = k_rows.shape[2]
    rep = HQ // HKV
    keys, values = k_rows.transpose(1, 2).to(q.dtype), v_rows.transpose(1, 2).to(q.dtype)
    mask = anc[:, None]
    if k_cache is not None:
        L = k_cache.shape[2]
        keys = torch.cat([k_cache.to(q.dtype), keys], dim=2)
        values = torch.cat([v_cache.to(q.dtype), values], dim=2)
        cols = torch.arange(L, device=q.device)[None, :]
        seen = cols < lengths[:, None]
        if window:
            seen = seen & (cols >= lengths[:, None] - window)
        ctx = seen[:, None, None, :].expand(B, 1, T, L)
        mask = torch.cat([ctx, mask], dim=-1)
    mask = mask.expand(B, rep, T, mask.shape[-1]).reshape(B, 1, rep * T, mask.shape[-1])
    qf = q.view(B, T, HKV, rep, D).permute(0, 2, 3, 1, 4).reshape(B, HKV, rep * T, D)
    o = torch.nn.functional.scaled_dot_product_attention(qf, keys, values, attn_mask=mask)
    o = o.view(B, HKV, rep, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, HQ * D)
    return o * torch.sigmoid(gate) if gate is not None else o


@triton.jit
def _tree_attention_split_kernel(
    q,
    kc,
    vc,
    kr,
    vr,
    lengths,
    anc,
    part_o,
    part_m,
    part_l,
    T,
    R,
    HQ,
    HKV,
    REP,
    kc_b,
    kc_h,
    S,
    scale,
    WINDOW,
    CHUNK: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    HAS_CACHE: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)  # request * HKV + kv head
    blk = tl.program_id(1)
    split = tl.program_id(2)
    b = pid // HKV
    kh = pid % HKV
    rows = blk * BM + tl.arange(0, BM)  # folded query rows: r = rep_i * T + t
    keep_r = rows < R
    t = rows % T
    head = kh * REP + rows // T
    d = tl.arange(0, BD)
    keep_d = d < D
    qt = tl.load(
        q + ((b * T + t) * HQ + head)[:, None] * D + d[None, :], mask=keep_r[:, None] & keep_d[None, :], other=0.0
    )
    if HAS_CACHE:
        length = tl.load(lengths + b)
    else:
        length = 0
    start = split * CHUNK
    lo = tl.where(WINDOW > 0, length - WINDOW, 0)  # the first context key seen (attn_window: the last WINDOW)
    end = tl.minimum(start + CHUNK, length + T)
    m = tl.full([BM], -1.0e30, dtype=tl.float32)
    lsum = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    for it in range(0, CHUNK // BN):  # a fixed trip count; blocks past the request's keys skip their work
        n0 = start + it * BN
        if n0 < end:
            j = n0 + tl.arange(0, BN)
            in_ctx = (j < length) & (j >= lo)
            tr = j - length
            in_tree = (j >= length) & (tr < T)
            tr = tl.where(in_tree, tr, 0)
            kt = tl.load(
                kr + ((b * T + tr) * HKV + kh)[:, None] * D + d[None, :],
                mask=in_tree[:, None] & keep_d[None, :],
                other=0.0,
            )
            vt = tl.load(
                vr + ((b * T + tr) * HKV + kh)[:, None] * D + d[None, :],
                mask=in_tree[:, None] & keep_d[None, :],
                other=0.0,
            )
            if HAS_CACHE:
                jc = tl.where(in_ctx, j, 0)
                off = b * kc_b + kh * kc_h + jc[:, None] * D + d[None, :]
                kt = tl.where(in_ctx[:, None], tl.load(kc + off, mask=in_ctx[:, None] & keep_d[None, :], other=0.0), kt)
                vt = tl.where(in_ctx[:, None], tl.load(vc + off, mask=in_ctx[:, None] & keep_d[None, :], other=0.0), vt)
            kt, vt = kt.to(qt.dtype), vt.to(qt.dtype)
            if IEEE:
                s = tl.dot(qt, tl.trans(kt), input_precision="ieee")
            else:
                s = tl.dot(qt, tl.trans(kt))
            anc_ok = tl.load(
                anc + (b * T + t)[:, None] * T + tr[None, :], mask=keep_r[:, None] & in_tree[None, :], other=0
            )
            visible = in_ctx[None, :] | (in_tree[None, :] & (anc_ok != 0))
            s = tl.where(visible, s * scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            lsum = lsum * alpha + tl.sum(p, axis=1)
            if IEEE:
                acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m = m_new
    base = pid * S + split
    tl.store(part_o + (base * R + rows)[:, None] * BD + d[None, :], acc, mask=keep_r[:, None])
    tl.store(part_m + base * R + rows, m, mask=keep_r)
    tl.store(part_l + base * R + rows, lsum, mask=keep_r)


@triton.jit
def _tree_attention_combine_kernel(
    part_o,
    part_m,
    part_l,
    gate,
    out,
    T,
    R,
    HQ,
    HKV,
    REP,
    S,
    sg,
    D: tl.constexpr,
    BD: tl.constexpr,
    SP: tl.constexpr,
    HAS_GATE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    pid = tl.program_id(0).to(tl.int64)
    r = tl.program_id(1)
    b = pid // HKV
    kh = pid % HKV
    t = r % T
    head = kh * REP + r // T
    sp = tl.arange(0, SP)
    keep_s = sp < S
    m = tl.load(part_m + (pid * S + sp) * R + r, mask=keep_s, other=-1.0e30)
    lsum = tl.load(part_l + (pid * S + sp) * R + r, mask=keep_s, other=0.0)
    top = tl.max(m, axis=0)
    w = tl.where(keep_s, tl.exp(m - top), 0.0)
    d = tl.arange(0, BD)
    keep_d = d < D
    acc = tl.load(part_o + ((pid * S + sp) * R + r)[:, None] * BD + d[None, :], mask=keep_s[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], axis=0) / tl.sum(lsum * w, axis=0)
    dt = out.dtype.element_ty
    o = o.to(dt)
    if HAS_GATE:  # the output gate, o * sigmoid(gate), each rounded as torch rounds it
        g = tl.load(gate + (b * T + t) * sg + head * D + d, mask=keep_d, other=0.0).to(tl.float32)
        o = (o * (1.0 / (1.0 + tl.exp(-g))).to(dt)).to(dt)
    tl.store(out + ((b * T + t) * HQ + head) * D + d, o, mask=keep_d)


@dataclass(frozen=True)
class AttentionTile:
    """The split kernel's tile: folded query rows a program (``block_m``), keys a step (``block_n``), warps, software
    pipeline stages, and about how many programs a multiprocessor the key range is split over (``programs_per_sm``:
    more spreads the keys over more SMs, fewer writes fewer FP32 partial outputs, splits x rows x D, for the
    combine to read back) — and the combine's warps."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: float
    combine_warps: int = 4


# (most folded query rows R = query heads per KV head x verify rows, largest head dim, tile): the first entry whose
# bounds hold. A decode step's few rows want many splits of a short key range; 17-33 verify rows at GQA 6 (R
# 102-198) want 64-row blocks and 8 warps (the H200 sweep, benchmarks/probes/engine-tiles-h200-2026-12-03/: 16.8 µs
# at 17 rows where 32-row blocks took 23.5, 26.3 at 33 where 32-key steps took 30.1). At head dim 256, 3-8 rows
# (R 18-48) take the 64-row block too: 16-row blocks read every key once a block (three times at 8 rows) and made
# 4 x 3 x 17 programs, past one wave and so launched without PDL; one 64-row block keeps 4 x 33 programs.
ATTENTION_TILES: tuple[tuple[int, int, AttentionTile], ...] = (
    (48, 128, AttentionTile(16, 64, 4, 3, 2, 2)),
    (128, 128, AttentionTile(32, 64, 4, 3, 2, 2)),
    (1 << 30, 128, AttentionTile(64, 64, 8, 3, 2, 2)),
    (16, 256, AttentionTile(16, 32, 4, 3, 2)),
    (128, 256, AttentionTile(64, 32, 8, 1, 2, 2)),
    (1 << 30, 256, AttentionTile(64, 64, 8, 2, 2)),
)


def attention_tile(R: int, D: int) -> AttentionTile:
    """The split kernel's tile for ``R`` folded query rows of head dim ``D`` (``ATTENTION_TILES``)."""
    for top, dims, tile in ATTENTION_TILES:
        if R <= top and triton.next_power_of_2(D) <= dims:
            return tile
    raise ValueError(f"tree_attention takes head dims up to {ATTENTION_TILES[-1][1]}, got {D}")


def _attention_split(B: int, HKV: int, R: int, keys: int, D: int, sms: int) -> tuple[AttentionTile, int, int]:
    """(tile, splits, keys per split): about ``programs_per_sm`` programs a multiprocessor over the key range, down
    to one key block a program (a decode step's few query rows)."""
    tile = attention_tile(R, D)
    blocks = triton.cdiv(R, tile.block_m)
    bn = tile.block_n
    splits = max(1, min(triton.cdiv(keys, bn), math.ceil(tile.programs_per_sm * sms / (B * HKV * blocks))))
    chunk = triton.cdiv(triton.cdiv(keys, splits), bn) * bn
    return tile, triton.cdiv(keys, chunk), chunk


def combine_tree_attention(part_o, part_m, part_l, gate, B, T, HQ, HKV, D, dtype, num_warps):
    """Sum the key splits' partial softmax states into the attention output [B, T, HQ * D] (with the optional
    output gate [B, T, HQ * D]); shared by the single-request and the batched tree attention."""
    S, R, BD = part_o.shape[1], part_o.shape[2], part_o.shape[3]
    out = torch.empty(B, T, HQ * D, dtype=dtype, device=part_o.device)
    if gate is not None and (gate.stride(2) != 1 or gate.stride(0) != T * gate.stride(1)):
        gate = gate.contiguous()
    _tree_attention_combine_kernel[(B * HKV, R)](
        part_o,
        part_m,
        part_l,
        gate if gate is not None else out,
        out,
        T,
        R,
        HQ,
        HKV,
        HQ // HKV,
        S,
        gate.stride(1) if gate is not None else 0,
        D=D,
        BD=BD,
        SP=triton.next_power_of_2(S),
        HAS_GATE=gate is not None,
        **_pdl(out, B * HKV, R),
        num_warps=num_warps,
    )
    return out


def tree_attention(q, k_cache, v_cache, k_rows, v_rows, lengths, anc, gate=None, window: int = 0):
    """Tree attention of verify rows over a dense per-request cache, no mask tensor: each row sees its request's
    first ``lengths`` cache keys (the last ``window`` of them when window > 0: the fault study's context fault)
    and the rows it descends from. Split over the keys (flash-decoding: few query rows, ~1k keys) and combined
    with the output gate in a second launch on a GPU (the reference on a CPU).

    Args:
        q: [B, T, HQ, D] contiguous; k_cache, v_cache: [B, HKV, L, D] (unit token stride D) or None (no context);
        k_rows, v_rows: [B, T, HKV, D] contiguous (the rows' own keys, in the cache or not); lengths: [B] int64
        or None; anc: [B, T, T] bool ancestor-or-self; gate: [B, T, HQ * D] (a view is read in place) or None;
        window: int, 0 (every committed key) or how many of the last committed keys each row sees.
    Returns:
        [B, T, HQ * D] in q's dtype. Example: ``o = tree_attention(q, kc, vc, k, v, caches.lengths[:B], buf.anc)``.
    """
    if not _kernels(q):
        return tree_attention_reference(q, k_cache, v_cache, k_rows, v_rows, lengths, anc, gate, window)
    B, T, HQ, D = q.shape
    HKV = k_rows.shape[2]
    REP, R = HQ // HKV, HQ // HKV * T
    has_cache = k_cache is not None
    if has_cache and (k_cache.stride(3) != 1 or k_cache.stride(2) != D or v_cache.stride() != k_cache.stride()):
        raise ValueError("tree_attention reads caches laid out [B, HKV, L, D] with unit token stride D")
    L = k_cache.shape[2] if has_cache else 0
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    tile, S, chunk = _attention_split(B, HKV, R, L + T, D, sms)
    BD = triton.next_power_of_2(D)
    dev = q.device
    part_o = torch.empty(B * HKV, S, R, BD, dtype=torch.float32, device=dev)
    part_m = torch.empty(B * HKV, S, R, dtype=torch.float32, device=dev)
    part_l = torch.empty_like(part_m)
    q, k_rows, v_rows = q.contiguous(), k_rows.contiguous(), v_rows.contiguous()
    anc8 = anc.contiguous().view(torch.uint8)
    ieee = q.dtype == torch.float32
    grid = (B * HKV, triton.cdiv(R, tile.block_m), S)
    _tree_attention_split_kernel[grid](
        q,
        k_cache if has_cache else q,
        v_cache if has_cache else q,
        k_rows,
        v_rows,
        lengths if has_cache else anc8,
        anc8,
        part_o,
        part_m,
        part_l,
        T,
        R,
        HQ,
        HKV,
        REP,
        k_cache.stride(0) if has_cache else 0,
        k_cache.stride(1) if has_cache else 0,
        S,
        1.0 / math.sqrt(D),
        window,
        CHUNK=chunk,
        D=D,
        BD=BD,
        BM=tile.block_m,
        BN=tile.block_n,
        HAS_CACHE=has_cache,
        IEEE=ieee,
        **_pdl(q, *grid),
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    out = combine_tree_attention(part_o, part_m, part_l, gate, B, T, HQ, HKV, D, q.dtype, tile.combine_warps)
    return out


# -- commits of every GDN layer at once ---------------------------------------------------------------------------


def select_states_reference(dst, src, index, keep):
    """dst[g, b] = src[g, b, index[b]] where keep[b] (the accepted position's state snapshot, every layer)."""
    bar = torch.arange(dst.shape[1], device=dst.device)
    chosen = src[:, bar, index]
    dst.copy_(torch.where(keep.view(1, -1, *([1] * (dst.dim() - 2))), chosen, dst))


@triton.jit
def _select_states_kernel(dst, src, index, keep, B, T, E, dst_g, dst_b, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL, False)
    gb = tl.program_id(0).to(tl.int64)
    g = gb // B
    b = gb % B
    if tl.load(keep + b) != 0:
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < E
        i = tl.load(index + b)
        vals = tl.load(src + ((g * B + b) * T + i) * E + cols, mask=ok)
        tl.store(dst + g * dst_g + b * dst_b + cols, vals, mask=ok)


def select_states(dst: torch.Tensor, src: torch.Tensor, index: torch.Tensor, keep: torch.Tensor) -> None:
    """The GDN snapshot commit of every layer in one launch on a GPU (the reference on a CPU), in place.

    Args:
        dst: [G, B, ...] (each [g, b] item contiguous; g and b strided: a slice of the layer-stacked pool);
        src: [G, B, T, ...] contiguous snapshots; index: [B] int64 the accepted position; keep: [B] bool.
    Example: ``select_states(caches.state_all[:, :B], snapshots, deepest, accept_len > 0)``.
    """
    if not _kernels(dst):
        return select_states_reference(dst, src, index, keep)
    G, B = dst.shape[:2]
    T = src.shape[2]
    E = dst[0, 0].numel()
    if not src.is_contiguous() or not dst[0, 0].is_contiguous():
        raise ValueError("select_states needs contiguous snapshots and contiguous per-(layer, request) items")
    block = 4096
    _select_states_kernel[(G * B, triton.cdiv(E, block))](
        dst,
        src,
        index.contiguous(),
        keep.contiguous().view(torch.uint8),
        B,
        T,
        E,
        dst.stride(0),
        dst.stride(1),
        BLOCK=block,
        **_pdl(dst, G * B, triton.cdiv(E, block)),
        num_warps=8,
    )


def conv_commit_reference(conv, raw, conv_idx, deepest, keep):
    """conv[g, b] = the last CS-1 conv inputs along row deepest[b]'s root path, from cat(conv[g, b], raw[g, b]),
    where keep[b] (every GDN layer's conv window)."""
    G, B, W, C = conv.shape
    bar = torch.arange(B, device=conv.device)
    last = conv_idx[bar, deepest, 1:]  # [B, CS-1]
    window = torch.cat([conv, raw.to(conv.dtype)], dim=2)
    new = window.gather(2, last[None, :, :, None].expand(G, B, W, C))
    conv.copy_(torch.where(keep.view(1, B, 1, 1), new, conv))


@triton.jit
def _conv_commit_kernel(
    conv,
    raw,
    idx,
    deepest,
    keep,
    B,
    T,
    C,
    conv_g,
    conv_b,
    CS: tl.constexpr,
    WP: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    gb = tl.program_id(0).to(tl.int64)
    g = gb // B
    b = gb % B
    if tl.load(keep + b) != 0:
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        w = tl.arange(0, WP)
        keep_w = w < CS - 1
        row = tl.load(deepest + b)
        src = tl.load(idx + (b * T + row) * CS + 1 + w, mask=keep_w, other=0)
        from_conv = src < CS - 1
        ok = keep_w[:, None] & (cols < C)[None, :]
        base = conv + g * conv_g + b * conv_b
        old = tl.load(base + tl.where(from_conv, src, 0)[:, None] * C + cols[None, :], mask=ok & from_conv[:, None])
        new = tl.load(
            raw + ((g * B + b) * T + tl.where(from_conv, 0, src - (CS - 1)))[:, None] * C + cols[None, :],
            mask=ok & (src >= CS - 1)[:, None],
        )
        # all of the window is loaded before any of it is stored: the new window reads the old one
        tl.store(base + w[:, None] * C + cols[None, :], tl.where(from_conv[:, None], old, new.to(old.dtype)), mask=ok)


def conv_commit(
    conv: torch.Tensor, raw: torch.Tensor, conv_idx: torch.Tensor, deepest: torch.Tensor, keep: torch.Tensor
) -> None:
    """The conv-window commit of every GDN layer in one launch on a GPU (the reference on a CPU), in place.

    Args:
        conv: [G, B, CS-1, C] (each [g, b] window contiguous; a slice of the layer-stacked windows); raw: [G, B, T,
        C] contiguous, the rows' conv inputs; conv_idx: [B, T, CS] int64 (``StepBuffers.conv_idx``); deepest: [B]
        int64 the accepted row; keep: [B] bool.
    Example: ``conv_commit(caches.conv_all[:, :B], raw, buf.conv_idx, deepest, accept_len > 0)``.
    """
    if not _kernels(conv):
        return conv_commit_reference(conv, raw, conv_idx, deepest, keep)
    G, B, W, C = conv.shape
    T = raw.shape[2]
    if not raw.is_contiguous() or not conv[0, 0].is_contiguous():
        raise ValueError("conv_commit needs contiguous raw inputs and contiguous per-(layer, request) windows")
    block = min(1024, triton.next_power_of_2(C))
    _conv_commit_kernel[(G * B, triton.cdiv(C, block))](
        conv,
        raw,
        conv_idx.contiguous(),
        deepest.contiguous(),
        keep.contiguous().view(torch.uint8),
        B,
        T,
        C,
        conv.stride(0),
        conv.stride(1),
        CS=W + 1,
        WP=triton.next_power_of_2(W),
        BLOCK=block,
        **_pdl(conv, G * B, triton.cdiv(C, block)),
        num_warps=4,
    )


# -- the LM head's greedy token ------------------------------------------------------------------------------------

_ARGMAX_CHUNK = 4096  # vocabulary entries a first-stage program reduces


@triton.jit
def _argmax_key(v, offs, BIG):
    """A chunk's (max, has NaN, index): torch.argmax's order (NaN above every number, then the lowest index)."""
    nan = v != v
    m = tl.max(tl.where(nan, float("-inf"), v), axis=0)
    has_nan = tl.max(nan.to(tl.int32), axis=0)
    win = tl.where(has_nan > 0, nan, v == m)
    return m, has_nan, tl.min(tl.where(win, offs, BIG), axis=0)


@triton.jit
def _row_argmax_partial_kernel(x, m_out, nan_out, i_out, N, sx, NCH, CH: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CH + tl.arange(0, CH)
    v = tl.load(x + r * sx + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
    m, has_nan, j = _argmax_key(v, offs, N + CH)
    tl.store(m_out + r * NCH + c, m)
    tl.store(nan_out + r * NCH + c, has_nan)
    tl.store(i_out + r * NCH + c, j)


@triton.jit
def _row_argmax_merge_kernel(m_in, nan_in, i_in, out, NCH, BIG, P: tl.constexpr, PDL: tl.constexpr = False):
    _pdl_start(PDL)
    r = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, P)
    ok = p < NCH
    m = tl.load(m_in + r * NCH + p, mask=ok, other=float("-inf"))
    has_nan = tl.load(nan_in + r * NCH + p, mask=ok, other=0)
    j = tl.load(i_in + r * NCH + p, mask=ok, other=BIG)
    top = tl.max(m, axis=0)
    # a chunk's index is below every later chunk's: the first qualifying chunk's index is the row's
    win = tl.where(tl.max(has_nan, axis=0) > 0, has_nan > 0, (m == top) & ok)
    tl.store(out + r, tl.min(tl.where(win, j, BIG), axis=0).to(tl.int64))


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` of [M, N] logits (unit stride along N) -> [M] int64, bit for bit (the largest entry's lowest
    index; a NaN counts above every number, as in torch), in two launches: chunks of each row, then their winners.
    torch's reduction took 8.8 µs for one 248,320-entry row and 19.6 for 32 on the H200 (its grid is one program
    a row). On a CPU: ``torch.argmax``."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(
            f"row_argmax takes [M, N] rows of unit stride, got shape {tuple(x.shape)} strides {x.stride()}"
        )
    if not _kernels(x):
        return x.argmax(-1)
    M, N = x.shape
    nch = triton.cdiv(N, _ARGMAX_CHUNK)
    m = torch.empty(M, nch, dtype=torch.float32, device=x.device)
    has_nan = torch.empty(M, nch, dtype=torch.int32, device=x.device)
    idx = torch.empty(M, nch, dtype=torch.int32, device=x.device)
    _row_argmax_partial_kernel[(M, nch)](
        x, m, has_nan, idx, N, x.stride(0), nch, CH=_ARGMAX_CHUNK, **_pdl(x, M, nch), num_warps=8
    )
    out = torch.empty(M, dtype=torch.long, device=x.device)
    _row_argmax_merge_kernel[(M,)](
        m, has_nan, idx, out, nch, N + _ARGMAX_CHUNK, P=max(16, triton.next_power_of_2(nch)), **_pdl(x, M), num_warps=1
    )
    return out


# -- acceptance --------------------------------------------------------------------------------------------------


def tree_accept_reference(tokens, parents, depth, anc, num_nodes, forced, active, pred):
    """Each tree's longest root path whose drafted tokens match the target's (or the path to ``forced[b]`` >= 0).

    tokens, parents (-1: root), depth [B, T] long; anc [B, T, T] bool; num_nodes [B] int; forced [B] long;
    active [B] bool; pred [B, T] long (the target's token after each row). Returns (accepted [B, T] the path's
    nodes root first, accept_len [B] (0 when inactive), deepest [B], out [B, T]: the accepted drafted tokens,
    then the target's next)."""
    B, T = tokens.shape
    dev = pred.device
    valid = torch.arange(T, device=dev)[None, :] < num_nodes[:, None].long()
    ok = ((parents < 0) | (tokens == pred.gather(1, parents.clamp(min=0)))) & valid
    accepted_node = ~(anc & ~ok[:, None, :]).any(-1) & valid
    deepest = torch.where(accepted_node, depth, -1).argmax(1)
    deepest = torch.where(forced >= 0, forced, deepest)
    on_path = anc.gather(1, deepest[:, None, None].expand(B, 1, T))[:, 0]
    accept_len = on_path.sum(1)
    where = torch.where(on_path, depth, T)
    accepted = torch.zeros(B, T + 1, dtype=torch.long, device=dev)
    accepted.scatter_(1, where, torch.arange(T, device=dev).expand(B, T).contiguous())
    accepted = accepted[:, :T]
    drafted = tokens.gather(1, accepted)
    out = torch.cat([drafted[:, 1:], torch.zeros(B, 1, dtype=torch.long, device=dev)], dim=1)
    out.scatter_(1, (accept_len - 1)[:, None], pred.gather(1, deepest[:, None]))
    return accepted, accept_len * active, deepest, out


@triton.jit
def _tree_accept_kernel(
    tokens,
    parents,
    depth,
    anc,
    num_nodes,
    forced,
    active,
    pred,
    accepted,
    accept_len,
    deepest,
    out,
    T,
    TP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    b = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, TP)  # rows
    j = tl.arange(0, TP)  # columns (ancestors, or output positions)
    inside = i < T
    valid = i < tl.load(num_nodes + b)
    par = tl.load(parents + b * T + i, mask=inside, other=0)
    tok = tl.load(tokens + b * T + i, mask=inside, other=0)
    dep = tl.load(depth + b * T + i, mask=inside, other=0)
    pred_par = tl.load(pred + b * T + tl.maximum(par, 0), mask=inside, other=-1)
    ok = ((par < 0) | (tok == pred_par)) & valid
    both = inside[:, None] & (j < T)[None, :]
    a = tl.load(anc + (b * T + i)[:, None] * T + j[None, :], mask=both, other=0) != 0
    ok_col = tl.where(valid, ok, False)  # ok as a row vector over the columns j (same index range)
    bad = tl.sum((a & ~ok_col[None, :]).to(tl.int32), axis=1)
    node_ok = (bad == 0) & valid
    score = tl.where(node_ok, dep, -1)
    best = tl.max(score, axis=0)
    first = tl.min(tl.where(score == best, i, TP), axis=0)  # argmax: the first row of the largest depth
    f = tl.load(forced + b)
    deep = tl.where(f >= 0, f, first.to(tl.int64))
    on_path = tl.load(anc + (b * T + deep) * T + i, mask=inside, other=0) != 0
    n = tl.sum(on_path.to(tl.int64), axis=0)
    # accepted[d] = the path's node at depth d (0 past the path), out[d] = tokens[accepted[d + 1]]
    at = on_path[:, None] & (dep[:, None] == j[None, :])
    acc = tl.sum(tl.where(at, i[:, None], 0), axis=0).to(tl.int64)
    at_next = on_path[:, None] & (dep[:, None] == (j + 1)[None, :])
    tok0 = tl.load(tokens + b * T)
    nxt = tl.where(tl.sum(at_next.to(tl.int32), axis=0) > 0, tl.sum(tl.where(at_next, tok[:, None], 0), axis=0), tok0)
    nxt = tl.where(j + 1 < T, nxt, 0)
    nxt = tl.where(j == n - 1, tl.load(pred + b * T + deep), nxt)
    keep = j < T
    tl.store(accepted + b * T + j, acc, mask=keep)
    tl.store(out + b * T + j, nxt, mask=keep)
    tl.store(deepest + b, deep)
    tl.store(accept_len + b, n * (tl.load(active + b) != 0).to(tl.int64))


def tree_accept(tokens, parents, depth, anc, num_nodes, forced, active, pred):
    """``tree_accept_reference`` in one launch on a GPU (one program per request; the reference on a CPU)."""
    if not _kernels(pred):
        return tree_accept_reference(tokens, parents, depth, anc, num_nodes, forced, active, pred)
    B, T = tokens.shape
    dev = pred.device
    accepted, out = (torch.empty(B, T, dtype=torch.long, device=dev) for _ in range(2))
    accept_len, deepest = (torch.empty(B, dtype=torch.long, device=dev) for _ in range(2))
    _tree_accept_kernel[(B,)](
        tokens.contiguous(),
        parents.contiguous(),
        depth.contiguous(),
        anc.contiguous().view(torch.uint8),
        num_nodes.contiguous(),
        forced.contiguous(),
        active.contiguous().view(torch.uint8),
        pred.contiguous(),
        accepted,
        accept_len,
        deepest,
        out,
        T,
        TP=max(16, triton.next_power_of_2(T)),
        **_pdl(pred, B),
        num_warps=4,
    )
    return accepted, accept_len, deepest, out
