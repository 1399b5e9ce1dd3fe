"""GDN tree verification in the WY form (TreeWY): all nodes of a tree at once, on tensor cores.

With nodes in topological order, the ancestor-or-self mask ``M`` is lower-triangular; ``G = M g`` is
the decay accumulated along each node's root path. From the committed state ``S`` ([K, V]):

    A = strict(M) * beta_i exp(G_i - G_j) (k_i . k_j)              (strictly lower-triangular)
    U = (I + A)^-1 diag(beta) (V - diag(exp G) K S)                 (forward substitution)
    O = diag(exp G) Q S + (M * exp(G_i - G_j) * Q K^T) U

(:func:`.reference.wy_verify_reference` states and tests the identity.) The two products with the
state, ``K S`` and ``Q S``, run on bf16 tensor cores: the FP32 state is split into three bf16 parts
(8 significand bits each, 24 together) and q, k into two, so the sums of the partial products carry
about 2^-17 relative error — far inside one bf16 ulp of the output. The T x T products and the
substitution run in FP32 (IEEE) arithmetic. One program per (value block, request, value head).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .path_verify import _check_inputs, _gdn_gates, _state_tile


def tree_ancestors(parents: torch.Tensor, num_nodes: torch.Tensor | None = None) -> torch.Tensor:
    """Ancestor-or-self mask [B, T, T] float32 (1 where node j is on node i's root path), padding rows zero.

    parents: [B, T] int (-1: child of the committed state, else ``< i``); computed by repeated squaring.
    """
    B, T = parents.shape
    if T > 64:
        raise ValueError(f"trees of up to 64 nodes are supported, got {T}")
    p = parents.long()
    step = torch.zeros((B, T, T), dtype=torch.float32, device=parents.device)
    has_parent = p >= 0
    b_idx, i_idx = has_parent.nonzero(as_tuple=True)
    step[b_idx, i_idx, p[b_idx, i_idx]] = 1.0
    reach = step + torch.eye(T, device=parents.device)
    for _ in range(max(1, (T - 1).bit_length())):
        reach = torch.bmm(reach, reach).clamp_(max=1.0)
    if num_nodes is not None:
        valid = torch.arange(T, device=parents.device)[None, :] < num_nodes.to(parents.device)[:, None]
        reach = reach * valid[:, :, None] * valid[:, None, :]
    return reach.contiguous()


@triton.jit
def _split3(x):
    """x (fp32) = hi + mid + lo exactly to 24 bits, each part bf16."""
    hi = x.to(tl.bfloat16)
    rest = x - hi.to(tl.float32)
    mid = rest.to(tl.bfloat16)
    lo = (rest - mid.to(tl.float32)).to(tl.bfloat16)
    return hi, mid, lo


@triton.jit
def _split2(x):
    hi = x.to(tl.bfloat16)
    lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
    return hi, lo


@triton.jit
def _dot_split(a_hi, a_lo, s_hi, s_mid, s_lo, DOT_FP32: tl.constexpr):
    """a @ s with a in two bf16 parts and s in three: every partial product down to 2^-16 relative."""
    if DOT_FP32:  # interpreter: its bf16 dot is broken; the parts are exact in fp32
        a_hi = a_hi.to(tl.float32)
        a_lo = a_lo.to(tl.float32)
        s_hi = s_hi.to(tl.float32)
        s_mid = s_mid.to(tl.float32)
        s_lo = s_lo.to(tl.float32)
    acc = tl.dot(a_lo, s_mid)
    acc = tl.dot(a_hi, s_lo, acc)
    acc = tl.dot(a_lo, s_hi, acc)
    acc = tl.dot(a_hi, s_mid, acc)
    return tl.dot(a_hi, s_hi, acc)


@triton.jit
def _wy_verify_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    state_indices,
    ancestors,
    num_nodes,
    o,
    softplus_beta,
    softplus_threshold,
    scale,
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    i_v, i_b, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    n = tl.load(num_nodes + i_b)
    rows = tl.arange(0, BT)
    cols = tl.arange(0, BT)
    row_ok = rows < n
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    tok = i_b * T + rows

    b_q = tl.load(q + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=row_ok[:, None] & mask_k[None, :], other=0).to(
        tl.float32
    )
    b_k = tl.load(k + (tok[:, None] * H + i_h) * K + o_k[None, :], mask=row_ok[:, None] & mask_k[None, :], other=0).to(
        tl.float32
    )
    b_v = tl.load(
        v + (tok[:, None] * HV + i_hv) * V + o_v[None, :], mask=row_ok[:, None] & mask_v[None, :], other=0
    ).to(tl.float32)
    if USE_QK_L2NORM:
        b_q = b_q * (1.0 / tl.sqrt(tl.sum(b_q * b_q, axis=1) + 1e-6))[:, None]
        b_k = b_k * (1.0 / tl.sqrt(tl.sum(b_k * b_k, axis=1) + 1e-6))[:, None]
    b_q = b_q * scale

    # gates, as the recurrence computes them; padding nodes get g = 0, beta = 0
    b_g, b_beta = _gdn_gates(
        tl.load(a + tok * HV + i_hv, mask=row_ok, other=0).to(tl.float32),
        tl.load(b + tok * HV + i_hv, mask=row_ok, other=0).to(tl.float32),
        tl.load(A_log + i_hv).to(tl.float32),
        tl.load(dt_bias + i_hv).to(tl.float32),
        softplus_beta,
        softplus_threshold,
    )
    b_g = tl.where(row_ok, b_g, 0.0)
    b_beta = tl.where(row_ok, b_beta, 0.0)

    anc = tl.load(
        ancestors + (i_b * T + rows[:, None]) * T + cols[None, :],
        mask=(rows[:, None] < T) & (cols[None, :] < T),
        other=0.0,
    )  # [BT, BT] ancestor-or-self
    G = tl.sum(anc * b_g[None, :], axis=1)
    G_col = tl.sum(tl.where(rows[:, None] == cols[None, :], G[:, None], 0.0), axis=0)  # G indexed by column
    decay = tl.where(anc > 0, tl.exp(tl.where(anc > 0, G[:, None] - G_col[None, :], 0.0)), 0.0)
    strict = tl.where(rows[:, None] > cols[None, :], decay, 0.0)

    # the committed state tile S [BK, BV], FP32 in three bf16 parts
    b_s = tl.load(
        _state_tile(state_pool, state_indices, i_b, i_hv, o_k, o_v, HV, K, V),
        mask=mask_k[:, None] & mask_v[None, :],
        other=0,
    ).to(tl.float32)
    s_hi, s_mid, s_lo = _split3(b_s)
    k_hi, k_lo = _split2(b_k)
    q_hi, q_lo = _split2(b_q)
    ks = _dot_split(k_hi, k_lo, s_hi, s_mid, s_lo, DOT_FP32)  # [BT, BV]
    qs = _dot_split(q_hi, q_lo, s_hi, s_mid, s_lo, DOT_FP32)

    kkt = tl.dot(b_k, tl.trans(b_k), input_precision="ieee")  # [BT, BT]
    qkt = tl.dot(b_q, tl.trans(b_k), input_precision="ieee")
    A = b_beta[:, None] * strict * kkt
    exp_G = tl.exp(G)
    rhs = b_beta[:, None] * (b_v - exp_G[:, None] * ks)

    # forward substitution: U_i = rhs_i - sum_{j < i} A_ij U_j, row by row
    U = tl.zeros([BT, BV], dtype=tl.float32)
    i = 0
    while i < n:
        a_row = tl.sum(tl.where(rows[:, None] == i, A, 0.0), axis=0)  # [BT] over columns j
        a_row_r = tl.sum(tl.where(rows[:, None] == cols[None, :], a_row[None, :], 0.0), axis=1)  # as a column
        u_i = tl.sum(tl.where(rows[:, None] == i, rhs, 0.0), axis=0) - tl.sum(a_row_r[:, None] * U, axis=0)
        U = tl.where(rows[:, None] == i, u_i[None, :], U)
        i += 1

    out = exp_G[:, None] * qs + tl.dot(decay * qkt, U, input_precision="ieee")
    tl.store(
        o + (tok[:, None] * HV + i_hv) * V + o_v[None, :],
        out.to(o.dtype.element_ty),
        mask=(rows[:, None] < T) & mask_v[None, :],
    )


def gdn_tree_wy_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    ancestors: torch.Tensor,
    num_nodes: torch.Tensor | None = None,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    block_v: int = 32,
    num_warps: int = 8,
) -> torch.Tensor:
    """The outputs of :func:`.path_verify.gdn_tree_path_verify`, computed for all nodes at once (WY form).

    Args:
        q, k: [B, T, H, K]; v: [B, T, HV, V]; a, b: [B, T, HV]; A_log, dt_bias: [HV];
        state_pool: [slots, HV, V, K] (fp32 or bf16), read only; state_indices: [B] int;
        ancestors: :func:`tree_ancestors` [B, T, T] float32 (once per verify step, shared by all layers);
        num_nodes: [B] int (default all T).
    Returns:
        o: [B, T, HV, V] in q's dtype; nodes past ``num_nodes[b]`` are zero.
    """
    B, T, H, HV, K, V = _check_inputs(q, k, v, a, b, state_pool, state_indices)
    if ancestors.shape != (B, T, T) or ancestors.dtype != torch.float32:
        raise ValueError(f"ancestors must be float32 [{B}, {T}, {T}], got {ancestors.dtype} {tuple(ancestors.shape)}")
    if num_nodes is None:
        num_nodes = torch.full((B,), T, dtype=torch.int32, device=q.device)
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(V, block_v), B, HV)
    _wy_verify_kernel[grid](
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state_pool,
        state_indices,
        ancestors,
        num_nodes.to(torch.int32).contiguous(),
        o,
        softplus_beta,
        softplus_threshold,
        scale if scale is not None else K**-0.5,
        T=T,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BT=max(16, triton.next_power_of_2(T)),
        BK=triton.next_power_of_2(K),
        BV=block_v,
        USE_QK_L2NORM=use_qk_l2norm,
        DOT_FP32=q.device.type == "cpu",
        num_warps=num_warps,
    )
    return o
