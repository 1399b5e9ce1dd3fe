"""GDN tree verification without per-node state: every node's output along its root path.

One program per (value block, request, value head) holds one FP32 state tile ``[K, BV]`` in registers.
Nodes are visited in a depth-first schedule (:func:`tree_schedule`): a node whose parent is the node
just visited continues from the state in registers; otherwise the program restarts from the
committed state and replays the new node's ancestors. On a chain that is exactly one step per node;
no state is ever written to memory (the commit, ``commit.py``, runs this same kernel over the
accepted path with ``write_state`` set). The per-step arithmetic is SGLang 0.5.23's
``fused_sigmoid_gating_delta_rule_update_kernel`` (GDN branch), operation for operation; on the H200
the chain outputs matched SGLang's verify bit for bit at the same tile (BV=4, one warp).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _tree_schedule_kernel(parents, num_nodes, order, replay_len, replay, T: tl.constexpr, NP2_T: tl.constexpr):
    """Depth-first visiting order of one request's tree, and what to replay before each visit.

    Next node: the lowest-index unvisited child of the node just visited; if there is none, the
    lowest-index unvisited node (its parent has a lower index, so it is visited already), which
    restarts from the committed state: ``replay[j, :replay_len[j]]`` is its ancestors, root first.
    ``replay_len[j] = -1`` means continue from the previous node's state.
    """
    i_b = tl.program_id(0)
    n = tl.load(num_nodes + i_b)
    idx = tl.arange(0, NP2_T)
    row = parents + i_b * T
    par = tl.load(row + idx, mask=idx < T, other=-2)
    valid = idx < n
    visited = tl.zeros([NP2_T], dtype=tl.int32)
    cur = -1
    # while loops, not range(): the interpreter cannot take a loaded scalar as a range bound.
    j = 0
    while j < n:
        open_ = valid & (visited == 0)
        nxt = tl.min(tl.where(open_ & (par == cur), idx, NP2_T))
        if nxt == NP2_T:
            nxt = tl.min(tl.where(open_, idx, NP2_T))
            depth = 0
            walk = tl.load(row + nxt)
            while walk >= 0:
                depth += 1
                walk = tl.load(row + walk)
            tl.store(replay_len + i_b * T + j, depth)
            walk = tl.load(row + nxt)
            slot = depth - 1
            while walk >= 0:
                tl.store(replay + (i_b * T + j) * T + slot, walk)
                slot -= 1
                walk = tl.load(row + walk)
        else:
            tl.store(replay_len + i_b * T + j, -1)
        tl.store(order + i_b * T + j, nxt)
        visited = tl.where(idx == nxt, 1, visited)
        cur = nxt
        j += 1


class TreeSchedule:
    """A batch of trees' visiting schedule; compute once per verify step, reuse in every GDN layer.

    order: [B, T] int32 node visited at step j; replay_len: [B, T] int32 (-1: continue);
    replay: [B, T, T] int32 ancestors to replay before step j; num_nodes: [B] int32.
    """

    def __init__(self, order, replay_len, replay, num_nodes):
        self.order, self.replay_len, self.replay, self.num_nodes = order, replay_len, replay, num_nodes

    def replayed_steps(self) -> torch.Tensor:
        """Recurrence steps each request costs, ancestors replayed included: [B] int64."""
        return self.num_nodes.long() + self.replay_len.clamp(min=0).sum(1)


def tree_schedule(parents: torch.Tensor, num_nodes: torch.Tensor | None = None) -> TreeSchedule:
    """Schedule for trees given by ``parents`` [B, T] int (-1: child of the committed state, else ``< i``).

    num_nodes: [B] int (default: all T nodes valid). T is at most 64.
    """
    B, T = parents.shape
    if T > 64:
        raise ValueError(f"trees of up to 64 nodes are supported, got {T}")
    parents = parents.to(torch.int32).contiguous()
    if num_nodes is None:
        num_nodes = torch.full((B,), T, dtype=torch.int32, device=parents.device)
    num_nodes = num_nodes.to(torch.int32).contiguous()
    order = torch.full((B, T), -1, dtype=torch.int32, device=parents.device)
    replay_len = torch.full((B, T), -1, dtype=torch.int32, device=parents.device)
    replay = torch.full((B, T, T), -1, dtype=torch.int32, device=parents.device)
    _tree_schedule_kernel[(B,)](parents, num_nodes, order, replay_len, replay, T=T,
                                NP2_T=triton.next_power_of_2(T))
    return TreeSchedule(order, replay_len, replay, num_nodes)


@triton.jit
def _gdn_node_update(b_h, node, q, k, v, a, b, b_A_log, b_dt_bias, softplus_beta, softplus_threshold, scale,
                     bos, i_h, i_hv, o_k, o_v, mask_k, mask_v,
                     H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     USE_QK_L2NORM: tl.constexpr):
    """One GDN step on the state tile ``b_h [BK, BV]`` for token ``bos + node``; returns (state, scaled q).

    Operation order is SGLang 0.5.23's (``fused_sigmoid_gating_delta_rule_update_kernel``, GDN).
    """
    t = bos + node
    b_q = tl.load(q + (t * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(k + (t * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_v = tl.load(v + (t * HV + i_hv) * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_b = tl.load(b + t * HV + i_hv).to(tl.float32)
    b_a = tl.load(a + t * HV + i_hv).to(tl.float32)
    x = b_a + b_dt_bias
    beta_x = softplus_beta * x
    softplus_x = tl.where(beta_x <= softplus_threshold, (1.0 / softplus_beta) * tl.log(1.0 + tl.exp(beta_x)), x)
    b_g = -tl.exp(b_A_log) * softplus_x
    b_beta = 1.0 / (1.0 + tl.exp(-b_b))
    if USE_QK_L2NORM:
        q_sum_sq = tl.sum(b_q * b_q)
        k_sum_sq = tl.sum(b_k * b_k)
        q_rsqrt = 1.0 / tl.sqrt(q_sum_sq + 1e-6)
        k_rsqrt = 1.0 / tl.sqrt(k_sum_sq + 1e-6)
        b_q *= q_rsqrt
        b_k *= k_rsqrt
    b_q = b_q * scale
    b_h *= tl.exp(b_g)
    b_v -= tl.sum(b_h * b_k[:, None], 0)
    b_v *= b_beta
    b_h += b_k[:, None] * b_v[None, :]
    return b_h, b_q


@triton.jit
def _load_state_tile(state_pool, state_indices, i_b, i_hv, o_k, o_v, mask_h, HV: tl.constexpr, K: tl.constexpr,
                     V: tl.constexpr):
    slot = tl.load(state_indices + i_b).to(tl.int64)
    p_h = state_pool + slot * (HV * K * V) + i_hv * K * V + o_v[None, :] * K + o_k[:, None]
    return tl.load(p_h, mask=mask_h, other=0).to(tl.float32)


@triton.jit
def _path_verify_kernel(q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, order, replay_len, replay,
                        num_nodes, o, write_state, softplus_beta, softplus_threshold, scale,
                        T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                        BK: tl.constexpr, BV: tl.constexpr, USE_QK_L2NORM: tl.constexpr):
    i_v, i_b, i_hv = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_h = i_hv // (HV // H)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_h = mask_k[:, None] & mask_v[None, :]
    bos = i_b * T
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)
    h0 = _load_state_tile(state_pool, state_indices, i_b, i_hv, o_k, o_v, mask_h, HV, K, V)
    b_h = h0
    n = tl.load(num_nodes + i_b)
    j = 0
    while j < n:
        node = tl.load(order + bos + j)
        n_replay = tl.load(replay_len + bos + j)
        if n_replay >= 0:
            b_h = h0
            d = 0
            while d < n_replay:
                ancestor = tl.load(replay + (bos + j) * T + d)
                b_h, _ = _gdn_node_update(b_h, ancestor, q, k, v, a, b, b_A_log, b_dt_bias, softplus_beta,
                                          softplus_threshold, scale, bos, i_h, i_hv, o_k, o_v, mask_k, mask_v,
                                          H, HV, K, V, USE_QK_L2NORM)
                d += 1
        b_h, b_q = _gdn_node_update(b_h, node, q, k, v, a, b, b_A_log, b_dt_bias, softplus_beta,
                                    softplus_threshold, scale, bos, i_h, i_hv, o_k, o_v, mask_k, mask_v,
                                    H, HV, K, V, USE_QK_L2NORM)
        b_o = tl.sum(b_h * b_q[:, None], 0)
        tl.store(o + ((bos + node) * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mask_v)
        j += 1
    while j < T:
        tl.store(o + ((bos + j) * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty),
                 mask=mask_v)
        j += 1
    if write_state != 0:  # commit: the state after the last visited node goes back into the pool
        slot = tl.load(state_indices + i_b).to(tl.int64)
        p_h = state_pool + slot * (HV * K * V) + i_hv * K * V + o_v[None, :] * K + o_k[:, None]
        tl.store(p_h, b_h.to(p_h.dtype.element_ty), mask=mask_h)


def _check_inputs(q, k, v, a, b, state_pool, state_indices):
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    if q is not None and q.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ")
    if v.shape[:2] != (B, T) or a.shape != (B, T, HV) or b.shape != (B, T, HV) or HV % H:
        raise ValueError(f"shapes disagree: k {tuple(k.shape)}, v {tuple(v.shape)}, a {tuple(a.shape)}, "
                         f"b {tuple(b.shape)} (HV must be a multiple of H)")
    if state_pool.shape[1:] != (HV, V, K) or state_indices.shape != (B,):
        raise ValueError(f"state_pool must be [slots, {HV}, {V}, {K}] and state_indices [{B}], got "
                         f"{tuple(state_pool.shape)} and {tuple(state_indices.shape)}")
    tensors = [t for t in (q, k, v, a, b, state_pool) if t is not None]
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("q, k, v, a, b and state_pool must be contiguous")
    return B, T, H, HV, K, V


def gdn_tree_path_verify(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                         A_log: torch.Tensor, dt_bias: torch.Tensor, state_pool: torch.Tensor,
                         state_indices: torch.Tensor, schedule: TreeSchedule, *, scale: float | None = None,
                         use_qk_l2norm: bool = True, softplus_beta: float = 1.0, softplus_threshold: float = 20.0,
                         block_v: int = 4, num_warps: int = 1) -> torch.Tensor:
    """Gated-delta-rule output of every tree node along its root path; stores no per-node state.

    Args:
        q, k: [B, T, H, K] (bf16/fp16/fp32), node i of request b at [b, i].
        v: [B, T, HV, V]; a, b: [B, T, HV] (raw gate inputs, as SGLang passes them); A_log, dt_bias: [HV].
        state_pool: [slots, HV, V, K] committed states (fp32 or bf16; SGLang's layout), read only.
        state_indices: [B] int, the slot of each request.
        schedule: :func:`tree_schedule` of the batch's parents (shared by all layers of a step).
        block_v / num_warps: the value tile; (4, 1) is SGLang's Hopper verify tile (bit parity with it).
    Returns:
        o: [B, T, HV, V] in q's dtype; nodes past ``num_nodes[b]`` are zero.
    """
    B, T, H, HV, K, V = _check_inputs(q, k, v, a, b, state_pool, state_indices)
    if schedule.order.shape != (B, T):
        raise ValueError(f"schedule is for {tuple(schedule.order.shape)} trees, inputs are [{B}, {T}]")
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(V, block_v), B, HV)
    _path_verify_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, state_pool, state_indices, schedule.order, schedule.replay_len,
        schedule.replay, schedule.num_nodes, o, 0, softplus_beta, softplus_threshold,
        scale if scale is not None else K ** -0.5,
        T=T, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=block_v, USE_QK_L2NORM=use_qk_l2norm,
        num_warps=num_warps, num_stages=3,
    )
    return o
