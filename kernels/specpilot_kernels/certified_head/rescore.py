"""The exact head's arithmetic, shared by the full exact head and the rescoring of survivors.

``_exact_logits`` computes ``x_m . w_r`` for one input row and a gathered block of vocabulary rows:
bf16 products accumulated in FP32 over ``BLOCK_K`` slices, the input in row 0 of a 16-row MMA tile.
Every use calls it with the same constants (``BLOCK_K = exact_block_k(K)``), so a row's logit is the
same bits whether it comes from the full head or from rescoring — which is what makes the certified
argmax equal the exact one.
"""

from __future__ import annotations

import triton
import triton.language as tl

EXACT_BLOCK_S = 32
EXACT_NUM_WARPS = 4
K_MULTIPLE = 128  # hidden sizes the exact head takes


def exact_block_k(k: int) -> int:
    """The exact head's K slice for hidden size ``k``: 256 where it divides k (half the serial steps of 128,
    the faster rescore on the H200: ``benchmarks/results/certified_head-cuda2-2026-11-30.json``), else 128.
    A function of k alone, so the full head and the rescoring always sum in the same order."""
    return 256 if k % 256 == 0 else K_MULTIPLE


@triton.jit
def _exact_logits(x_row, weight, rid, keep, K: tl.constexpr, BS: tl.constexpr, BLOCK_K: tl.constexpr,
                  DOT_FP32: tl.constexpr):
    o_k = tl.arange(0, BLOCK_K)
    w_ptrs = weight + rid[:, None].to(tl.int64) * K + o_k[None, :]
    if DOT_FP32:  # interpreter: per-row FP32 sums (its bf16 dot is broken)
        acc = tl.zeros([BS], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xv = tl.load(x_row + k0 + o_k).to(tl.float32)
            w = tl.load(w_ptrs + k0, mask=keep[:, None], other=0).to(tl.float32)
            acc += tl.sum(w * xv[None, :], axis=1)
        return acc
    else:
        r16 = tl.arange(0, 16)
        acc = tl.zeros([16, BS], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            xt = tl.load(x_row + k0 + o_k[None, :] + r16[:, None] * 0, mask=r16[:, None] == 0, other=0)
            w = tl.load(w_ptrs + k0, mask=keep[:, None], other=0)
            acc += tl.dot(xt, tl.trans(w))
        return tl.sum(tl.where(r16[:, None] == 0, acc, 0.0), axis=0)


@triton.jit
def _exact_head_kernel(x, weight, out, N, K: tl.constexpr, BS: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT_FP32: tl.constexpr):
    m, pid = tl.program_id(0), tl.program_id(1)
    rid = pid * BS + tl.arange(0, BS)
    keep = rid < N
    logits = _exact_logits(x + m * K, weight, rid, keep, K, BS, BLOCK_K, DOT_FP32)
    tl.store(out + m.to(tl.int64) * N + rid, logits, mask=keep)


@triton.jit
def _rescore_kernel(x, weight, best_lower, count, cand_idx, cand_upper, part_val, part_idx,
                    K: tl.constexpr, CAP: tl.constexpr, G: tl.constexpr, BS: tl.constexpr, BLOCK_K: tl.constexpr,
                    DOT_FP32: tl.constexpr):
    """Program (m, g) rescores candidates g*BS, (g+G)*BS, ... of input row m that reach the final best.

    A row whose count exceeds CAP takes the full head (its list may be partly unwritten: the CUDA pass
    flags rows it cannot scale exactly before appending anything), so it is skipped here."""
    m, g = tl.program_id(0), tl.program_id(1)
    n = tl.load(count + m)
    n = tl.where(n > CAP, 0, n)
    best = tl.load(best_lower + m)
    best_val = float("-inf")
    best_idx = 2147483647
    start = g * BS
    while start < n:
        offs = start + tl.arange(0, BS)
        in_list = offs < n
        rid = tl.load(cand_idx + m * CAP + offs, mask=in_list, other=0)
        upper = tl.load(cand_upper + m * CAP + offs, mask=in_list, other=float("-inf"))
        keep = in_list & (upper >= best)
        logits = _exact_logits(x + m * K, weight, rid, keep, K, BS, BLOCK_K, DOT_FP32)
        vals = tl.where(keep, logits, float("-inf"))
        block_max = tl.max(vals, axis=0)
        block_idx = tl.min(tl.where(keep & (vals == block_max), rid, 2147483647), axis=0)
        better = (block_max > best_val) | ((block_max == best_val) & (block_idx < best_idx))
        best_val = tl.where(better, block_max, best_val)
        best_idx = tl.where(better, block_idx, best_idx)
        start += G * BS
    tl.store(part_val + m * G + g, best_val)
    tl.store(part_idx + m * G + g, best_idx)


@triton.jit
def _finalize_kernel(part_val, part_idx, count, tokens, M, CAP: tl.constexpr, G: tl.constexpr,
                     BLOCK_M: tl.constexpr):
    """Token of each input row: the best of its G partial results (lowest index on ties); -1 if it overflowed."""
    o_m = tl.arange(0, BLOCK_M)
    m_ok = o_m < M
    o_g = tl.arange(0, G)
    offs = o_m[:, None] * G + o_g[None, :]
    vals = tl.load(part_val + offs, mask=m_ok[:, None], other=float("-inf"))
    idx = tl.load(part_idx + offs, mask=m_ok[:, None], other=2147483647)
    top = tl.max(vals, axis=1)
    token = tl.min(tl.where(vals == top[:, None], idx, 2147483647), axis=1)
    overflow = tl.load(count + o_m, mask=m_ok, other=0) > CAP
    tl.store(tokens + o_m, tl.where(overflow, -1, token).to(tl.int64), mask=m_ok)
