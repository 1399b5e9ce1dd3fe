"""W12 GEMM in Triton: y = x @ W^T with the weight decoded in registers.

Each program owns ``BLOCK_N`` output channels and one split of K. Per 128-column step it loads the
two 64-column halves of the 8-bit view and the nibble bytes that pair them (the kernel layout of
``format.py``), decodes both halves (inline PTX on packed 16-bit lanes on the GPU, plain Triton integer
ops under the interpreter; both are exact), patches the step's escapes into the decoded tile, and
multiplies with the weights on the MMA's M side and the token rows on its N side (16, 32 or 64 wide).

Determinism: the partition (``block_n``, ``splits``) comes from (N, K, GPU) only (``configs.py``); splits
write fp32 partials to a workspace that a second kernel sums in split order, never atomics. The
token rows only widen the MMA's N side, so a row's bits do not depend on how many rows come with it.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .configs import GemmConfig, select_config
from .format import W12Error, W12Tensor

MAX_ROWS_PER_LAUNCH = 64


def _decode_asm() -> str:
    """PTX decoding 4 columns of each half: $4/$5 view bytes (lo/hi half), $6 nibble bytes, $7 bases.

    Per pair of columns (two 16-bit lanes of one register): prmt spreads two bytes into lanes,
    lop3 merges the shifted byte with the nibble, mad adds base << 7 to both lanes (no carry: the
    exponent is at most 254), lop3 puts the sign at bit 15.
    """
    lines = [
        "{",
        ".reg .b32 z, cm, cs, n4, x, y, n, b, t, s;",
        "mov.b32 z, 0;",
        "mov.b32 cm, 0x07F007F0;",
        "mov.b32 cs, 0x80008000;",
        "shr.u32 n4, $6, 4;",
    ]
    for pair, sel in ((0, "0x4140"), (1, "0x4342")):
        lines.append(f"prmt.b32 b, $7, z, {sel};")
        for out, view_reg, nib_reg in ((pair, "$4", "$6"), (2 + pair, "$5", "n4")):
            lines += [
                f"prmt.b32 x, {view_reg}, z, {sel};",
                f"prmt.b32 n, {nib_reg}, z, {sel};",
                "shl.b32 y, x, 4;",
                "lop3.b32 t, y, n, cm, 0xE4;",  # (y & cm) | (n & ~cm)
                "mad.lo.u32 t, b, 128, t;",
                "shl.b32 s, x, 8;",
                f"lop3.b32 ${out}, t, s, cs, 0xF8;",  # t | (s & cs)
            ]
    lines.append("}")
    return "\n".join(lines)


DECODE_ASM = tl.constexpr(_decode_asm())


@triton.jit
def _decode_half(view, nib, base):
    """Exact BF16 from view bytes, nibbles and row bases (all same-shape integer tensors)."""
    b = view.to(tl.int32)
    bits = (((b & 0x7F) << 4) + (base.to(tl.int32) << 7)) | ((b & 0x80) << 8) | nib.to(tl.int32)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _w12_gemm_kernel(
    x_ptr,
    view_ptr,
    nib_ptr,
    base_ptr,
    esc_ptr_ptr,
    esc_loc_ptr,
    esc_val_ptr,
    out_ptr,
    M,
    N,
    K,
    Kp,
    stride_xm,
    stride_out_split,
    stride_out_m,
    BLOCK_N: tl.constexpr,
    M_PAD: tl.constexpr,
    STEPS: tl.constexpr,
    LOW_BITS: tl.constexpr,
    USE_ASM: tl.constexpr,
    PARTIAL: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    # LOW_BITS: 0 exact (nibbles + escapes), 1 truncated, 2 midpoint (Q-pass reads only the view).
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    half = tl.arange(0, 64)
    ms = tl.arange(0, M_PAD)
    base = tl.broadcast_to(tl.load(base_ptr + rows)[:, None], (BLOCK_N, 64))
    view_rows = view_ptr + rows[:, None].to(tl.int64) * Kp + half[None, :]
    nib_rows = nib_ptr + rows[:, None].to(tl.int64) * (Kp // 2) + half[None, :]
    local_rows = (rows % 128)[:, None]
    bucket_row = (pid_n * BLOCK_N // 128) * (Kp // 128)
    x_cols = x_ptr + ms[None, :] * stride_xm
    m_mask = (ms < M)[None, :]
    acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    # STEPS (128-column steps per split) is a compile-time constant: every split has the same length,
    # and the interpreter cannot take a run-time loop bound.
    k_begin = pid_s * (STEPS * 128)
    k_last = k_begin + (STEPS - 1) * 128
    lin_lo = local_rows * 128 + half[None, :]  # position of each lo-half weight inside its 128x128 bucket
    # Software pipelining by hand: the escape loop nested in the K loop keeps Triton's pipeliner off, so
    # each iteration issues the next step's loads (weights, escape pointers, activations) before it
    # decodes the current step; the last iteration re-reads its own step, an L2 hit.
    v_lo_next = tl.load(view_rows + k_begin, eviction_policy="evict_first")
    v_hi_next = tl.load(view_rows + k_begin + 64, eviction_policy="evict_first")
    if LOW_BITS == 0:
        nib_next = tl.load(nib_rows + k_begin // 2, eviction_policy="evict_first")
        e_next = tl.load(esc_ptr_ptr + bucket_row + k_begin // 128)
        e_end_next = tl.load(esc_ptr_ptr + bucket_row + k_begin // 128 + 1)
    k_x = k_begin + half[:, None]
    x_lo_next = tl.load(x_cols + k_x, mask=m_mask & (k_x < K), other=0.0)
    x_hi_next = tl.load(x_cols + k_x + 64, mask=m_mask & (k_x + 64 < K), other=0.0)
    for step in range(STEPS):
        k0 = k_begin + step * 128
        k_next = tl.minimum(k0 + 128, k_last)
        v_lo = v_lo_next
        v_hi = v_hi_next
        x_lo = x_lo_next
        x_hi = x_hi_next
        v_lo_next = tl.load(view_rows + k_next, eviction_policy="evict_first")
        v_hi_next = tl.load(view_rows + k_next + 64, eviction_policy="evict_first")
        k_x = k_next + half[:, None]
        x_lo_next = tl.load(x_cols + k_x, mask=m_mask & (k_x < K), other=0.0)
        x_hi_next = tl.load(x_cols + k_x + 64, mask=m_mask & (k_x + 64 < K), other=0.0)
        if LOW_BITS == 0:
            nib = nib_next
            e = e_next
            e_end = e_end_next
            nib_next = tl.load(nib_rows + k_next // 2, eviction_policy="evict_first")
            e_next = tl.load(esc_ptr_ptr + bucket_row + k_next // 128)
            e_end_next = tl.load(esc_ptr_ptr + bucket_row + k_next // 128 + 1)
        else:
            nib = tl.full((BLOCK_N, 64), 0x88 if LOW_BITS == 2 else 0, tl.uint8)
        if USE_ASM:
            w_lo, w_hi = tl.inline_asm_elementwise(
                DECODE_ASM,
                "=r,=r,=r,=r,r,r,r,r",
                [v_lo, v_hi, nib, base],
                dtype=(tl.bfloat16, tl.bfloat16),
                is_pure=True,
                pack=4,
            )
        else:
            w_lo = _decode_half(v_lo, nib & 0xF, base)
            w_hi = _decode_half(v_hi, nib >> 4, base)
        if LOW_BITS == 0:
            while e < e_end:  # a while loop: the interpreter cannot take a loaded range bound
                loc = tl.load(esc_loc_ptr + e).to(tl.int32) & 0x3FFF
                value = tl.load(esc_val_ptr + e).to(tl.bfloat16, bitcast=True)
                if (loc & 127) < 64:
                    w_lo = tl.where(lin_lo == loc, value, w_lo)
                else:
                    w_hi = tl.where(lin_lo == loc - 64, value, w_hi)
                e += 1
        else:
            # View bytes s.0000.000 (escapes below the window) read as +-0, as E4M3 does.
            zero = (v_lo & 0x7F) == 0
            w_lo = tl.where(zero, (v_lo.to(tl.int32) << 8).to(tl.int16).to(tl.bfloat16, bitcast=True), w_lo)
            zero = (v_hi & 0x7F) == 0
            w_hi = tl.where(zero, (v_hi.to(tl.int32) << 8).to(tl.int16).to(tl.bfloat16, bitcast=True), w_hi)
        if DOT_FP32:
            acc = tl.dot(w_lo.to(tl.float32), x_lo.to(tl.float32), acc, input_precision="ieee")
            acc = tl.dot(w_hi.to(tl.float32), x_hi.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w_lo, x_lo, acc)
            acc = tl.dot(w_hi, x_hi, acc)
    out = out_ptr + pid_s * stride_out_split + ms[None, :] * stride_out_m + rows[:, None]
    mask = m_mask & (rows < N)[:, None]
    if PARTIAL:
        tl.store(out, acc, mask=mask)
    else:
        tl.store(out, acc.to(tl.bfloat16), mask=mask)


@triton.jit
def _split_reduce_kernel(ws_ptr, y_ptr, total, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in range(1, SPLITS):  # fixed order: split 0, 1, 2, ...
        acc += tl.load(ws_ptr + s * total + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(tl.bfloat16), mask=mask)


LOW_BITS_CODES = {"exact": 0, "truncated": 1, "midpoint": 2}


def interpreting() -> bool:
    """True under the Triton interpreter, where bf16 tl.dot is wrong and inline PTX cannot run."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def launch(x, w12, y, config: GemmConfig, low_bits: int, workspace: torch.Tensor | None):
    """One launch of at most 64 rows (and the split reduction) into ``y``; returns the compiled GEMM
    kernel, whose ``asm["ptx"]`` and ``metadata.shared`` the benchmark checks (wgmma vs mma.sync).
    ``workspace``: fp32, at least splits x M x N elements when the config splits K."""
    m, k = x.shape
    n = w12.shape[0]
    np_, kp = w12.padded_shape
    splits = config.effective_splits(kp)
    steps = kp // 128 // splits
    interp = interpreting()
    m_pad = max(16, triton.next_power_of_2(m))
    partial = splits > 1
    out = workspace[: splits * m * n].view(splits, m, n) if partial else y
    grid = (np_ // config.block_n, splits)
    compiled = _w12_gemm_kernel[grid](
        x,
        w12.view,
        w12.nibbles,
        w12.base,
        w12.esc_ptr,
        w12.esc_loc,
        w12.esc_val,
        out,
        m,
        n,
        k,
        kp,
        x.stride(0),
        out.stride(0) if partial else 0,
        out.stride(-2),
        BLOCK_N=config.block_n,
        M_PAD=m_pad,
        STEPS=steps,
        LOW_BITS=low_bits,
        USE_ASM=config.use_asm and not interp,
        PARTIAL=partial,
        DOT_FP32=interp,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if partial:
        total = m * n
        block = 1024
        _split_reduce_kernel[(triton.cdiv(total, block),)](out, y, total, SPLITS=splits, BLOCK=block)
    return compiled


def w12_gemm(
    x: torch.Tensor,
    w12: W12Tensor,
    *,
    config: GemmConfig | None = None,
    low_bits: str = "exact",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y = x @ W^T with W stored as W12, decoded in registers.

    x    bf16 [M, K] (any M; launched in chunks of 64 rows), row stride free, unit column stride
    w12  W12Tensor of a [N, K] weight on the same CUDA device (or CPU under TRITON_INTERPRET=1)
    out  optional bf16 [M, N] contiguous
    returns y bf16 [M, N]; fp32 accumulation. ``low_bits`` "exact" is the lossless product;
    "truncated"/"midpoint" are Q-pass products reading only the 8-bit view.
    ``config`` overrides the (N, K, GPU) partition, for tuning only.
    """
    n, k = w12.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.bfloat16 or x.stride(1) != 1:
        raise W12Error(
            f"w12_gemm needs x bf16 [M, {k}] with unit column stride, got {x.dtype} "
            f"{tuple(x.shape)} strides {tuple(x.stride())}",
            where="w12_gemm(x)",
            fix="pass x.contiguous().to(torch.bfloat16) flattened to 2-D",
        )
    if x.device != w12.device:
        raise W12Error(
            f"x is on {x.device} but the W12 weight is on {w12.device}",
            where="w12_gemm",
            fix="move both to the same device",
        )
    m = x.shape[0]
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return y
    config = config or select_config(n, k, x.device)
    splits = config.effective_splits(w12.padded_shape[1])
    workspace = None
    if splits > 1:
        workspace = torch.empty(splits * min(m, MAX_ROWS_PER_LAUNCH) * n, dtype=torch.float32, device=x.device)
    for r0 in range(0, m, MAX_ROWS_PER_LAUNCH):
        r1 = min(m, r0 + MAX_ROWS_PER_LAUNCH)
        launch(x[r0:r1], w12, y[r0:r1], config, LOW_BITS_CODES[low_bits], workspace)
    return y
