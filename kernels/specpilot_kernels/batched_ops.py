"""Kernels for the batched verify step (many requests in flight, each with its own cache and a few verify rows).

``batched_tree_attention`` is ``fused_ops.tree_attention``'s contract (same arguments, same result, the same torch
reference: ``fused_ops.tree_attention_reference``) with a grid built for B requests' caches:

- the committed keys and the rows' own keys are separate programs: a context program streams a chunk of its
  request's cache in a loop bounded by that request's length (no per-block branch, so Triton pipelines the K/V
  loads), and one more program per (request, kv head, row block) attends to the rows' own keys under the tree
  mask. fused_ops' single loop tests every key block for "cache or tree row" and loads both, unpipelined; at 32
  requests it ran at ~1 TB/s (1 row) and ~0.3 TB/s (17 rows) of the caches' bytes;
- all folded query rows of a kv head (REP x T, up to 64) are one block, and a kv head's row blocks are the
  fastest grid axis, so a key block read for one row block is still in L2 for the next (one HBM read of each
  cache byte a step);
- the key range is split so the step has about four programs per SM whatever B is (a graph replays the grid it
  was captured with, so the split is over the cache's allocated length; a chunk beyond a request's length exits
  at once).

The partial results are combined, with the output gate, by ``fused_ops``' combine kernel.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from specpilot_kernels.fused_ops import (
    _kernels,
    _pdl,
    _pdl_start,
    combine_tree_attention,
    tree_attention,
    tree_attention_reference,
)

_LOG2E = 1.4426950408889634


@triton.jit
def _batched_attention_split_kernel(
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
    S_CTX,
    qk_scale,
    WINDOW,
    CHUNK: tl.constexpr,
    D: tl.constexpr,
    BD: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BT: tl.constexpr,
    IEEE: tl.constexpr,
    STAGES: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    blk = tl.program_id(0)  # row block: the fastest axis, so row blocks of one key range share its L2 lines
    pid = tl.program_id(1).to(tl.int64)  # request * HKV + kv head
    split = tl.program_id(2)  # 0 .. S_CTX - 1: a chunk of the cache; S_CTX: the rows' own keys
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
    m = tl.full([BM], -1.0e30, dtype=tl.float32)
    lsum = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    if split < S_CTX:  # committed keys [start, end) of this request's cache
        length = tl.load(lengths + b).to(tl.int32)
        start = split * CHUNK
        end = tl.minimum(start + CHUNK, length)
        if WINDOW > 0:  # attn_window (the context fault): only the last WINDOW committed keys
            start = tl.maximum(start, length - WINDOW)
        if start < end:  # a chunk past the request's length exits at once
            base = b * kc_b + kh * kc_h
            # a fixed trip count with masked tails, no branch inside: the K/V loads pipeline
            for it in tl.range(0, CHUNK // BN, num_stages=STAGES):
                j = start + it * BN + tl.arange(0, BN)
                ok = j < end
                off = base + j[:, None] * D + d[None, :]
                kt = tl.load(kc + off, mask=ok[:, None] & keep_d[None, :], other=0.0).to(qt.dtype)
                vt = tl.load(vc + off, mask=ok[:, None] & keep_d[None, :], other=0.0).to(qt.dtype)
                if IEEE:
                    s = tl.dot(qt, tl.trans(kt), input_precision="ieee")
                else:
                    s = tl.dot(qt, tl.trans(kt))
                s = tl.where(ok[None, :], s * qk_scale, float("-inf"))
                m_new = tl.maximum(m, tl.max(s, axis=1))
                alpha = tl.exp2(m - m_new)
                p = tl.exp2(s - m_new[:, None])
                lsum = lsum * alpha + tl.sum(p, axis=1)
                if IEEE:
                    acc = acc * alpha[:, None] + tl.dot(p, vt, input_precision="ieee")
                else:
                    acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
                m = m_new
    else:  # the rows' own keys, each visible to the rows it is an ancestor of (or itself)
        j = tl.arange(0, BT)
        in_tree = j < T
        off = ((b * T + j) * HKV + kh)[:, None] * D + d[None, :]
        kt = tl.load(kr + off, mask=in_tree[:, None] & keep_d[None, :], other=0.0).to(qt.dtype)
        vt = tl.load(vr + off, mask=in_tree[:, None] & keep_d[None, :], other=0.0).to(qt.dtype)
        if IEEE:
            s = tl.dot(qt, tl.trans(kt), input_precision="ieee")
        else:
            s = tl.dot(qt, tl.trans(kt))
        anc_ok = tl.load(anc + (b * T + t)[:, None] * T + j[None, :], mask=keep_r[:, None] & in_tree[None, :], other=0)
        s = tl.where(anc_ok != 0, s * qk_scale, float("-inf"))
        m = tl.maximum(m, tl.max(s, axis=1))
        p = tl.exp2(s - m[:, None])
        lsum = tl.sum(p, axis=1)
        if IEEE:
            acc = tl.dot(p, vt, input_precision="ieee")
        else:
            acc = tl.dot(p.to(vt.dtype), vt)
    # the combine kernel works in natural-log units: m back from log2 units
    slot = pid * (S_CTX + 1) + split
    tl.store(part_o + (slot * R + rows)[:, None] * BD + d[None, :], acc, mask=keep_r[:, None])
    tl.store(part_m + slot * R + rows, m * 0.6931471805599453, mask=keep_r)
    tl.store(part_l + slot * R + rows, lsum, mask=keep_r)


def batched_split(B: int, HKV: int, R: int, L: int, D: int, sms: int) -> dict:
    """The launch plan of ``batched_tree_attention``: rows a block (BM), key block (BN), warps, pipeline stages,
    context splits and keys a split. About four programs per SM over B x HKV x row blocks x splits; a split keeps
    at least two key blocks (fewer would not pipeline), and R up to 64 folded rows is one block."""
    BD = triton.next_power_of_2(D)
    BM = max(16, min(64, triton.next_power_of_2(R)))
    BN = 32 if BD >= 256 else 64
    warps = 8 if BM * BD >= 64 * 256 else 4
    blocks = triton.cdiv(R, BM)
    if L == 0:
        return {"BM": BM, "BN": BN, "warps": warps, "stages": 2, "splits": 0, "chunk": BN}
    splits = max(1, min(triton.cdiv(L, 2 * BN), triton.cdiv(4 * sms, B * HKV * blocks)))
    chunk = triton.cdiv(triton.cdiv(L, splits), BN) * BN
    return {"BM": BM, "BN": BN, "warps": warps, "stages": 3, "splits": triton.cdiv(L, chunk), "chunk": chunk}


def batched_tree_attention(q, k_cache, v_cache, k_rows, v_rows, lengths, anc, gate=None, window: int = 0):
    """Tree attention of B requests' verify rows over their dense caches (``fused_ops.tree_attention``'s contract,
    gridded for many requests: see the module docstring). On a CPU: the torch reference.

    Args:
        q: [B, T, HQ, D] contiguous; k_cache, v_cache: [B, HKV, L, D] (unit token stride D) or None (no context);
        k_rows, v_rows: [B, T, HKV, D] (the rows' own keys); lengths: [B] int64 or None; anc: [B, T, T] bool
        ancestor-or-self; gate: [B, T, HQ * D] (a view is read in place) or None (o * sigmoid(gate) when given);
        window: 0 (every committed key) or how many of the last committed keys each row sees.
    Returns:
        [B, T, HQ * D] in q's dtype.
    """
    B, T, HQ, D = q.shape
    HKV = k_rows.shape[2]
    if HQ % HKV or k_rows.shape != (B, T, HKV, D) or v_rows.shape != k_rows.shape or anc.shape != (B, T, T):
        raise ValueError(
            f"batched_tree_attention: q {tuple(q.shape)}, k_rows {tuple(k_rows.shape)}, v_rows "
            f"{tuple(v_rows.shape)}, anc {tuple(anc.shape)}: want q [B, T, HQ, D], rows [B, T, HKV, D] with HKV "
            "dividing HQ, anc [B, T, T]"
        )
    if T > 64:
        raise ValueError(f"batched_tree_attention: {T} rows a request; the rows' own keys are one block of <= 64")
    if not _kernels(q):
        return tree_attention_reference(q, k_cache, v_cache, k_rows, v_rows, lengths, anc, gate, window)
    REP, R = HQ // HKV, HQ // HKV * T
    has_cache = k_cache is not None
    if has_cache and (k_cache.stride(3) != 1 or k_cache.stride(2) != D or v_cache.stride() != k_cache.stride()):
        raise ValueError("batched_tree_attention reads caches laid out [B, HKV, L, D] with unit token stride D")
    L = k_cache.shape[2] if has_cache else 0
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    plan = batched_split(B, HKV, R, L, D, sms)
    BD, S = triton.next_power_of_2(D), plan["splits"] + 1
    dev = q.device
    part_o = torch.empty(B * HKV, S, R, BD, dtype=torch.float32, device=dev)
    part_m = torch.empty(B * HKV, S, R, dtype=torch.float32, device=dev)
    part_l = torch.empty_like(part_m)
    q, k_rows, v_rows = q.contiguous(), k_rows.contiguous(), v_rows.contiguous()
    anc8 = anc.contiguous().view(torch.uint8)
    grid = (triton.cdiv(R, plan["BM"]), B * HKV, S)
    _batched_attention_split_kernel[grid](
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
        plan["splits"],
        _LOG2E / math.sqrt(D),
        window,
        CHUNK=plan["chunk"],
        D=D,
        BD=BD,
        BM=plan["BM"],
        BN=plan["BN"],
        BT=max(16, triton.next_power_of_2(T)),
        IEEE=q.dtype == torch.float32,
        STAGES=plan["stages"],
        **_pdl(q, *grid),
        num_warps=plan["warps"],
    )
    out = combine_tree_attention(part_o, part_m, part_l, gate, B, T, HQ, HKV, D, q.dtype, 2 if BD <= 128 else 4)
    return out


def verify_attention(q, k_cache, v_cache, k_rows, v_rows, lengths, anc, gate=None, window: int = 0):
    """The engine's tree attention for a step of B requests (same arguments as ``batched_tree_attention``): one
    request's rows take ``fused_ops.tree_attention`` (its split tuned for one cache and 1-33 rows), two or more
    requests ``batched_tree_attention``."""
    attend = batched_tree_attention if q.shape[0] > 1 else tree_attention
    return attend(q, k_cache, v_cache, k_rows, v_rows, lengths, anc, gate, window)


# -- the tree commit's KV move, every attention layer at once ----------------------------------------------------


def commit_kv_rows_reference(kv, lengths, accepted, accept_len):
    """kv[a, s, b, :, lengths[b] + t] = kv[a, s, b, :, lengths[b] + accepted[b, t]] for t < accept_len[b] (the
    accepted root path's K and V moved to consecutive cache slots, every layer a and both s = K, V), in place.

    kv [A, 2, B, HKV, L, D]; lengths, accept_len [B] long; accepted [B, T] long (node indices, root first)."""
    A, _, B, _, L, _ = kv.shape
    T = accepted.shape[1]
    steps = torch.arange(T, device=kv.device)[None, :]
    src = torch.where(steps < accept_len[:, None], accepted, steps)
    dst_pos = (lengths[:, None] + steps).clamp(max=L - 1)
    src_pos = (lengths[:, None] + src).clamp(max=L - 1)
    bidx = torch.arange(B, device=kv.device)[:, None]
    for a in range(A):
        for s in range(2):
            cache = kv[a, s]
            cache[bidx, :, dst_pos] = cache[bidx, :, src_pos]


@triton.jit
def _commit_kv_rows_kernel(
    kv,
    lengths,
    accepted,
    accept_len,
    B,
    HKV,
    L,
    T,
    s_a,
    s_b,
    D: tl.constexpr,
    TP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    _pdl_start(PDL)
    b = tl.program_id(0)
    layer_kv = tl.program_id(1).to(tl.int64)  # a * 2 + (0: K, 1: V)
    h = tl.program_id(2)
    n = tl.load(accept_len + b)
    length = tl.load(lengths + b)
    base = kv + layer_kv * s_a + b * s_b + h * L * D
    d = tl.arange(0, D)
    for t in range(0, TP):  # in order: row t is written after every row it is read from (accepted[t] >= t)
        if t < n:
            src = tl.load(accepted + b * T + t)
            if src != t:
                row = tl.load(base + tl.minimum(length + src, L - 1) * D + d)
                tl.store(base + tl.minimum(length + t, L - 1) * D + d, row)


def commit_kv_rows(kv: torch.Tensor, lengths: torch.Tensor, accepted: torch.Tensor, accept_len: torch.Tensor) -> None:
    """The tree commit's KV move for B requests in one launch: each request's accepted root path's K and V rows,
    in every attention layer, moved to consecutive slots after its committed keys (rows already in place, a chain's,
    are not touched). In place; ``commit_kv_rows_reference`` is the torch form (used on a CPU).

    Args:
        kv: [A, 2, B, HKV, L, D] the attention layers' K and V caches (``Caches.kv_all``, its first B slots),
            contiguous per [HKV, L, D] and over (A, 2);
        lengths: [B] long, each request's committed keys before this step; accepted: [B, T] long, the accepted
        path's node indices root first (``tree_accept``); accept_len: [B] long, how many of them.
    """
    A, two, B, HKV, L, D = kv.shape
    T = accepted.shape[1]
    if (
        two != 2
        or kv.stride(0) != 2 * kv.stride(1)
        or kv.stride(-1) != 1
        or kv.stride(-2) != D
        or kv.stride(-3) != L * D
        or accepted.shape[0] != B
    ):
        raise ValueError(
            f"commit_kv_rows: kv {tuple(kv.shape)} strides {kv.stride()}, accepted {tuple(accepted.shape)}: want kv "
            "[A, 2, B, HKV, L, D] contiguous per [HKV, L, D] and accepted [B, T]"
        )
    if not _kernels(kv):
        return commit_kv_rows_reference(kv, lengths, accepted, accept_len)
    if D != triton.next_power_of_2(D):
        raise ValueError(f"commit_kv_rows: head dim {D} is not a power of two")
    grid = (B, 2 * A, HKV)
    _commit_kv_rows_kernel[grid](
        kv,
        lengths,
        accepted.contiguous(),
        accept_len,
        B,
        HKV,
        L,
        T,
        kv.stride(1),
        kv.stride(2),
        D=D,
        TP=T,
        **_pdl(kv, *grid),
        num_warps=1 if D <= 128 else 2,
    )


# -- the drafter's top-k candidates per position --------------------------------------------------------------

_TOPK_CHUNK = 4096  # vocabulary entries a first-stage program reduces


def row_topk_reference(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of each row's k largest entries, largest first (``torch.topk``)."""
    top = x.topk(k, dim=-1)
    return top.values, top.indices


@triton.jit
def _row_topk_partial_kernel(x, vals, idx, N, sx, NCH, K: tl.constexpr, CH: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    offs = c * CH + tl.arange(0, CH)
    v = tl.load(x + r * sx + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
    out = (r * NCH + c) * K
    for i in tl.static_range(K):  # K rounds of (max, its lowest index), each winner then removed
        m = tl.max(v, axis=0)
        j = tl.min(tl.where(v == m, offs, N + CH), axis=0)
        tl.store(vals + out + i, m)
        tl.store(idx + out + i, j)
        v = tl.where(offs == j, float("-inf"), v)


@triton.jit
def _row_topk_merge_kernel(vals, idx, out_v, out_i, NC, BIG, K: tl.constexpr, P: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    p = tl.arange(0, P)
    ok = p < NC
    v = tl.load(vals + r * NC + p, mask=ok, other=float("-inf"))
    j = tl.load(idx + r * NC + p, mask=ok, other=BIG)
    for i in tl.static_range(K):
        m = tl.max(v, axis=0)
        w = tl.min(tl.where(v == m, j, BIG), axis=0)
        tl.store(out_v + r * K + i, m.to(out_v.dtype.element_ty))
        tl.store(out_i + r * K + i, w.to(tl.int64))
        v = tl.where(j == w, float("-inf"), v)


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's k largest entries, largest first, in two launches (chunks of the row, then their candidates):
    the drafter's top-k candidates a position over the vocabulary, where ``torch.topk`` of [rows, 248320] took ~4x
    the logits' read. Equal values come lowest index first (``torch.topk`` leaves their order unspecified);
    a row needs at least k entries above -inf. On a CPU: ``torch.topk``.

    Args:
        x: [M, N] (unit stride along N), k: 1-16 entries a row.
    Returns:
        (values [M, k] in x's dtype, indices [M, k] int64).
    """
    if x.dim() != 2 or x.stride(1) != 1 or not 1 <= k <= 16 or k > x.shape[1]:
        raise ValueError(f"row_topk: x {tuple(x.shape)} strides {x.stride()}, k {k}: want [M, N] rows, 1 <= k <= 16, N")
    if not _kernels(x):
        return row_topk_reference(x, k)
    M, N = x.shape
    nch = triton.cdiv(N, _TOPK_CHUNK)
    vals = torch.empty(M, nch, k, dtype=torch.float32, device=x.device)
    idx = torch.empty(M, nch, k, dtype=torch.int32, device=x.device)
    _row_topk_partial_kernel[(M, nch)](x, vals, idx, N, x.stride(0), nch, K=k, CH=_TOPK_CHUNK, num_warps=8)
    out_v = torch.empty(M, k, dtype=x.dtype, device=x.device)
    out_i = torch.empty(M, k, dtype=torch.long, device=x.device)
    NC = nch * k
    _row_topk_merge_kernel[(M,)](
        vals, idx, out_v, out_i, NC, N + _TOPK_CHUNK, K=k, P=max(16, triton.next_power_of_2(NC)), num_warps=4
    )
    return out_v, out_i
