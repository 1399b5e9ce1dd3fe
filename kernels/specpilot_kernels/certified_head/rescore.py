"""The exact head's arithmetic, shared by the full exact head and the rescoring of survivors.

``_exact_partial`` computes the part of ``x_m . w_r`` over one contiguous K range, for one input row and a
gathered block of vocabulary rows: bf16 products accumulated in FP32 over ``BLOCK_K`` slices, the input
in row 0 of a 16-row MMA tile. A logit is the sum of ``SPLITS`` such parts over equal K ranges, added in
range order. The full head adds them in one program; the rescore computes the parts in parallel programs
(a serial chain SPLITS times shorter) and its finalize adds them in the same order. Every use takes the
same constants (``BLOCK_K = exact_block_k(K)``, ``SPLITS = exact_k_splits(K)`` unless both sides are given
the same other value), so a row's logit is the same bits whether it comes from the full head or from
rescoring — which is what makes the certified argmax equal the exact one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

EXACT_BLOCK_S = 32
EXACT_NUM_WARPS = 4
K_MULTIPLE = 128  # hidden sizes the exact head takes
EXACT_K_SPLITS = 4
FINALIZE_BLOCK = 512  # candidates per step of the finalize


def exact_block_k(k: int) -> int:
    """The exact head's K slice for hidden size ``k``: 256 where it divides k (half the serial steps of 128,
    the faster rescore on the H200: ``benchmarks/archive/results/certified_head-cuda2-2026-11-30.json``), else 128.
    A function of k alone, so the full head and the rescoring always sum in the same order."""
    return 256 if k % 256 == 0 else K_MULTIPLE


def exact_k_splits(k: int) -> int:
    """How many K ranges the exact head's logit is summed over (in range order): the largest count up to
    EXACT_K_SPLITS that divides the ``exact_block_k`` slices. A function of k alone, like the slice."""
    slices = k // exact_block_k(k)
    return max(s for s in range(1, EXACT_K_SPLITS + 1) if slices % s == 0)


@triton.jit
def _exact_partial(
    x_row,
    weight,
    rid,
    keep,
    k_lo,
    K: tl.constexpr,
    K_RANGE: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    o_k = tl.arange(0, BLOCK_K)
    x_row += k_lo
    w_ptrs = weight + rid[:, None].to(tl.int64) * K + k_lo + o_k[None, :]
    if DOT_FP32:  # interpreter: per-row FP32 sums (its bf16 dot is broken)
        acc = tl.zeros([BS], dtype=tl.float32)
        for k0 in range(0, K_RANGE, BLOCK_K):
            xv = tl.load(x_row + k0 + o_k).to(tl.float32)
            w = tl.load(w_ptrs + k0, mask=keep[:, None], other=0).to(tl.float32)
            acc += tl.sum(w * xv[None, :], axis=1)
        return acc
    else:
        r16 = tl.arange(0, 16)
        acc = tl.zeros([16, BS], dtype=tl.float32)
        for k0 in range(0, K_RANGE, BLOCK_K):
            xt = tl.load(x_row + k0 + o_k[None, :] + r16[:, None] * 0, mask=r16[:, None] == 0, other=0)
            w = tl.load(w_ptrs + k0, mask=keep[:, None], other=0)
            acc += tl.dot(xt, tl.trans(w))
        return tl.sum(tl.where(r16[:, None] == 0, acc, 0.0), axis=0)


@triton.jit
def _exact_head_kernel(
    x,
    weight,
    out,
    N,
    tokens,
    K: tl.constexpr,
    SPLITS: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
    GUARDED: tl.constexpr,
):
    """Logits of input row m, vocabulary block pid. GUARDED: programs of rows whose ``tokens`` entry is not
    negative (the certified head's overflow flag) return at once, so the fallback can sit in a CUDA graph and
    cost about a launch when no row overflowed."""
    m, pid = tl.program_id(0), tl.program_id(1)
    if GUARDED:
        if tl.load(tokens + m) >= 0:
            return
    rid = pid * BS + tl.arange(0, BS)
    keep = rid < N
    K_RANGE: tl.constexpr = K // SPLITS
    logits = _exact_partial(x + m * K, weight, rid, keep, 0, K, K_RANGE, BS, BLOCK_K, DOT_FP32)
    for s in tl.static_range(1, SPLITS):  # the parts in range order, as the rescore's finalize adds them
        logits = logits + _exact_partial(x + m * K, weight, rid, keep, s * K_RANGE, K, K_RANGE, BS, BLOCK_K, DOT_FP32)
    tl.store(out + m.to(tl.int64) * N + rid, logits, mask=keep)


@triton.jit
def _survivors(cand_idx, cand_upper, m, offs, n, best, CAP: tl.constexpr):
    """Entries ``offs`` of input row m's candidate list: their vocabulary rows, and which of them are listed
    (below the count n) with an upper bound reaching the final best."""
    in_list = offs < n
    rid = tl.load(cand_idx + m * CAP + offs, mask=in_list, other=0)
    upper = tl.load(cand_upper + m * CAP + offs, mask=in_list, other=float("-inf"))
    return rid, in_list & (upper >= best)


@triton.jit
def _rescore_kernel(
    x,
    weight,
    best_lower,
    count,
    cand_idx,
    cand_upper,
    partial,
    K: tl.constexpr,
    CAP: tl.constexpr,
    G: tl.constexpr,
    SPLITS: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """Program (m, g, s): part s of the logits of candidates g*BS, (g+G)*BS, ... of input row m that reach
    the final best, into partial[m, candidate, s].

    A row whose count exceeds CAP takes the full head (its list may be partly unwritten: the CUDA pass
    flags rows it cannot scale exactly before appending anything), so it is skipped here."""
    m, g, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n = tl.load(count + m)
    n = tl.where(n > CAP, 0, n)
    best = tl.load(best_lower + m)
    K_RANGE: tl.constexpr = K // SPLITS
    start = g * BS
    while start < n:
        offs = start + tl.arange(0, BS)
        rid, keep = _survivors(cand_idx, cand_upper, m, offs, n, best, CAP)
        part = _exact_partial(x + m * K, weight, rid, keep, s * K_RANGE, K, K_RANGE, BS, BLOCK_K, DOT_FP32)
        tl.store(partial + ((m * CAP + offs) * SPLITS + s).to(tl.int64), part, mask=keep)
        start += G * BS


@triton.jit
def _finalize_kernel(
    partial,
    best_lower,
    count,
    cand_idx,
    cand_upper,
    tokens,
    CAP: tl.constexpr,
    SPLITS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Token of input row m (program m): each rescored candidate's parts added in range order (the full
    head's order), the largest logit, lowest index on ties; -1 if the row overflowed."""
    m = tl.program_id(0)
    n = tl.load(count + m)
    overflow = n > CAP
    n = tl.where(overflow, 0, n)
    best = tl.load(best_lower + m)
    best_val = float("-inf")
    best_idx = 2147483647
    start = 0
    while start < n:
        offs = start + tl.arange(0, BLOCK_C)
        rid, keep = _survivors(cand_idx, cand_upper, m, offs, n, best, CAP)
        base = ((m * CAP + offs) * SPLITS).to(tl.int64)
        logits = tl.load(partial + base, mask=keep, other=0.0)
        for s in tl.static_range(1, SPLITS):
            logits = logits + tl.load(partial + base + s, mask=keep, other=0.0)
        vals = tl.where(keep, logits, float("-inf"))
        block_max = tl.max(vals, axis=0)
        block_idx = tl.min(tl.where(keep & (vals == block_max), rid, 2147483647), axis=0)
        better = (block_max > best_val) | ((block_max == best_val) & (block_idx < best_idx))
        best_val = tl.where(better, block_max, best_val)
        best_idx = tl.where(better, block_idx, best_idx)
        start += BLOCK_C
    tl.store(tokens + m, tl.where(overflow, -1, best_idx).to(tl.int64))


def rescore(
    x: torch.Tensor,
    weight: torch.Tensor,
    best_lower: torch.Tensor,
    count: torch.Tensor,
    cand_idx: torch.Tensor,
    cand_upper: torch.Tensor,
    *,
    programs: int,
    dot_fp32: bool,
    k_splits: int | None = None,
    block_s: int = EXACT_BLOCK_S,
    block_k: int | None = None,
    num_warps: int = EXACT_NUM_WARPS,
) -> torch.Tensor:
    """The exact head's argmax over each row's candidates that reach its best lower bound (graphable).

    Args:
        x: [M, K] bf16; weight: [N, K] bf16; best_lower: [M] fp32; count: [M] int32 (above the list's
            capacity: the row's token is -1); cand_idx: [M, CAP] int32 and cand_upper: [M, CAP] fp32.
        programs: programs per row and K range sharing the candidate blocks; dot_fp32: the interpreter's
            FP32 path; k_splits, block_k: the summation order, the exact head's (``exact_k_splits``,
            ``exact_block_k``) unless both sides are given the same; block_s, num_warps: tuning only.
    Returns:
        tokens: [M] int64, lowest index on ties.
    """
    M, K = x.shape
    cap = cand_idx.shape[1]
    k_splits = k_splits or exact_k_splits(K)
    block_k = block_k or exact_block_k(K)
    partial = torch.empty((M, cap, k_splits), dtype=torch.float32, device=x.device)
    tokens = torch.empty(M, dtype=torch.int64, device=x.device)
    _rescore_kernel[(M, programs, k_splits)](
        x,
        weight,
        best_lower,
        count,
        cand_idx,
        cand_upper,
        partial,
        K=K,
        CAP=cap,
        G=programs,
        SPLITS=k_splits,
        BS=block_s,
        BLOCK_K=block_k,
        DOT_FP32=dot_fp32,
        num_warps=num_warps,
    )
    _finalize_kernel[(M,)](
        partial,
        best_lower,
        count,
        cand_idx,
        cand_upper,
        tokens,
        CAP=cap,
        SPLITS=k_splits,
        BLOCK_C=min(FINALIZE_BLOCK, triton.next_power_of_2(cap)),
    )
    return tokens
