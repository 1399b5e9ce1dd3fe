"""INT8 pass of the certified head: approximate logits, their radius, and the rows that may be the argmax.

One program per block of ``BLOCK_N`` vocabulary rows streams the INT8 copy once (the bytes that set
the speed), with the activations on the narrow side of the MMA. Its epilogue computes each row's
bounds ``I_r -/+ radius_r``, raises the running best lower bound per input row (atomic max), and
appends the rows whose upper bound reaches ``max(running best, this block's best)`` to a candidate
list. The running best never exceeds the final one, so a row dropped here is provably not the argmax;
the rescore pass filters the list against the final best.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["M"])  # one compiled kernel per tile for every row count (M=1 included)
def _int8_bound_kernel(
    x,
    qweight,
    scale,
    radius_coef,
    best_lower,
    count,
    cand_idx,
    cand_upper,
    M,
    N,
    K: tl.constexpr,
    CAP: tl.constexpr,
    SLACK: tl.constexpr,
    NORM_INFLATION: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    o_m = tl.arange(0, BLOCK_M)
    m_ok = o_m < M
    o_k = tl.arange(0, BLOCK_K)
    w_ptrs = qweight + rows[:, None].to(tl.int64) * K + o_k[None, :]
    x_ptrs = x + o_m[None, :] * K + o_k[:, None]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    # ||x||^2 rides along with the activation tiles: every program computes the same value
    sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        # the last tile may run past K (K a multiple of the exact head's 128, not of BLOCK_K): zero it,
        # or it would read the next row's weights and activations and corrupt the bounds
        k_ok = k0 + o_k < K
        w = tl.load(w_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0)
        xt = tl.load(x_ptrs, mask=m_ok[None, :] & k_ok[:, None], other=0)
        xf = xt.to(tl.float32)
        sum_sq += tl.sum(xf * xf, axis=0)
        if DOT_FP32:  # the interpreter's bf16 dot is broken; int8 and bf16 values are exact in fp32
            acc += tl.dot(w.to(tl.float32), xt.to(tl.float32))
        else:
            acc += tl.dot(w.to(tl.bfloat16), xt)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    s = tl.load(scale + rows, mask=row_ok, other=0)
    c = tl.load(radius_coef + rows, mask=row_ok, other=0)
    nx = tl.sqrt(sum_sq) * NORM_INFLATION
    approx = acc * s[:, None]
    radius = (nx[None, :] * c[:, None]) * (1.0 + SLACK) + tl.abs(approx) * SLACK
    valid = row_ok[:, None] & m_ok[None, :]
    lower = tl.where(valid, approx - radius, float("-inf"))
    upper = tl.where(valid, approx + radius, float("-inf"))
    block_best = tl.max(lower, axis=0)
    running = tl.atomic_max(best_lower + o_m, block_best, mask=m_ok)
    threshold = tl.maximum(running, block_best)
    keep = valid & (upper >= threshold[None, :])
    keep_i = keep.to(tl.int32)
    base = tl.atomic_add(count + o_m, tl.sum(keep_i, axis=0), mask=m_ok)
    pos = base[None, :] + tl.cumsum(keep_i, axis=0) - 1
    ok = keep & (pos < CAP)
    rows_2d = rows[:, None] + tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.int32)
    tl.store(cand_idx + o_m[None, :] * CAP + pos, rows_2d, mask=ok)
    tl.store(cand_upper + o_m[None, :] * CAP + pos, upper, mask=ok)
