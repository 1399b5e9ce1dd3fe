"""GDN tree verification without per-node state: every node's output along its root path.

One program per (value block, request, value head) holds one FP32 state tile ``[K, BV]`` in registers.
Nodes are visited in a depth-first schedule (:func:`tree_schedule`): a node whose parent is the node
just visited continues from the state in registers; after a leaf the program restarts from the
deepest kept branch state on the new node's root path (or the committed state) and replays the
nodes below it. States are kept only at branch nodes, at most ``max_saved`` at once per request, in
a scratch that lives for one call: no per-node state is stored, and with enough slots every node
costs exactly one step (``max_saved=0`` replays every restart's root path instead). The next node's
inputs can be loaded while the current step computes (``prefetch``). The commit (``commit.py``)
runs this same kernel over the accepted path with ``write_state`` set. The per-step arithmetic is
SGLang 0.5.23's ``fused_sigmoid_gating_delta_rule_update_kernel`` (GDN branch), operation for
operation; on the H200 the outputs on chains and FP32-pool trees and the committed states on chains
matched SGLang's bit for bit at the same tile (BV=4, one warp), with and without kept states and prefetch.
The norms and gates can be formed once per token in a first kernel (:func:`prepare_node_inputs`) instead
of in every value tile. On a GPU the default step loop is the CUDA kernel of ``lanes.py`` (same schedule,
same sums in the same order, so the same bits; about 3x fewer instructions per step); this Triton kernel
is the CPU path (interpreter), the fallback, and the reference the CUDA kernel is tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lanes import DEFAULT_WARPS_PER_BLOCK, lanes_kernel_applies, path_verify_lanes, resolve_lanes


@triton.jit
def _at(values, idx, i):
    """``values[i]`` of a register vector indexed by ``idx`` (0 where no index matches)."""
    return tl.sum(tl.where(idx == i, values, 0))


@triton.jit
def _first_open_child(open_, par, node, idx, NP2_T: tl.constexpr):
    """The lowest-index unvisited child of ``node`` (``NP2_T``: none)."""
    return tl.min(tl.where(open_ & (par == node), idx, NP2_T))


@triton.jit
def _tree_schedule_kernel(
    parents,
    num_nodes,
    order,
    replay_len,
    replay,
    restore_slot,
    save_slot,
    T: tl.constexpr,
    NP2_T: tl.constexpr,
    MAX_SAVED: tl.constexpr,
    NP2_S: tl.constexpr,
):
    """Depth-first visiting order of one request's tree, what to restore and replay before each visit.

    Next node: the lowest-index unvisited child of the node just visited; after a leaf, the
    lowest-index unvisited child of the deepest node on the current path that has one (``u``).
    Such a restart begins from the deepest saved state on ``u``'s root path (``restore_slot[j]``;
    -1: the committed state) and replays ``replay[j, :replay_len[j]]``, the nodes below it down to
    ``u``, root first. ``replay_len[j] = -1`` means continue from the previous node's state.
    ``save_slot[j] >= 0``: keep node j's state in that slot; a node is kept when it has two or more
    children and fewer than ``MAX_SAVED`` states are live. Saved states form a stack along the
    current path, so a restart below a kept node replays nothing.
    """
    i_b = tl.program_id(0)
    n = tl.load(num_nodes + i_b)
    idx = tl.arange(0, NP2_T)
    row = parents + i_b * T
    par = tl.load(row + idx, mask=idx < T, other=-2)
    valid = idx < n
    # depth[i] = nodes on i's root path (parents come first in index order); the committed state has 0
    depth = tl.zeros([NP2_T], dtype=tl.int32)
    i = 0
    while i < n:
        p = tl.load(row + i)
        depth = tl.where(idx == i, _at(depth, idx, p) + 1, depth)
        i += 1
    children = tl.zeros([NP2_T], dtype=tl.int32)
    i = 0
    while i < n:
        children = tl.where(idx == tl.load(row + i), children + 1, children)
        i += 1
    slots = tl.arange(0, NP2_S)
    stack = tl.full([NP2_S], -1, dtype=tl.int32)  # kept node per live slot, shallowest first
    live = 0
    visited = tl.zeros([NP2_T], dtype=tl.int32)
    cur = -1
    # while loops, not range(): the interpreter cannot take a loaded scalar as a range bound.
    j = 0
    while j < n:
        open_ = valid & (visited == 0)
        nxt = _first_open_child(open_, par, cur, idx, NP2_T)
        if nxt == NP2_T:
            u = tl.load(row + cur)
            nxt = _first_open_child(open_, par, u, idx, NP2_T)
            while nxt == NP2_T:
                u = tl.load(row + u)
                nxt = _first_open_child(open_, par, u, idx, NP2_T)
            u_depth = _at(depth, idx, u)
            # drop kept states below u: their subtrees are finished
            top_depth = _at(depth, idx, _at(stack, slots, live - 1))
            while (live > 0) & (top_depth > u_depth):
                live -= 1
                top_depth = _at(depth, idx, _at(stack, slots, live - 1))
            if live > 0:
                tl.store(restore_slot + i_b * T + j, live - 1)
            else:
                top_depth = 0
                tl.store(restore_slot + i_b * T + j, -1)
            n_replay = u_depth - top_depth
            tl.store(replay_len + i_b * T + j, n_replay)
            walk = u
            slot = n_replay - 1
            while slot >= 0:
                tl.store(replay + (i_b * T + j) * T + slot, walk)
                slot -= 1
                walk = tl.load(row + walk)
            # u's last child: its kept state is not needed after this restore
            others = tl.sum(tl.where(open_ & (par == u) & (idx != nxt), 1, 0))
            if (live > 0) & (n_replay == 0) & (others == 0):
                live -= 1
        else:
            tl.store(replay_len + i_b * T + j, -1)
            tl.store(restore_slot + i_b * T + j, -1)
        if (_at(children, idx, nxt) >= 2) & (live < MAX_SAVED):
            tl.store(save_slot + i_b * T + j, live)
            stack = tl.where(slots == live, nxt, stack)
            live += 1
        else:
            tl.store(save_slot + i_b * T + j, -1)
        tl.store(order + i_b * T + j, nxt)
        visited = tl.where(idx == nxt, 1, visited)
        cur = nxt
        j += 1


class TreeSchedule:
    """A batch of trees' visiting schedule; compute once per verify step, reuse in every GDN layer.

    order: [B, T] int32 node visited at step j; replay_len: [B, T] int32 (-1: continue);
    replay: [B, T, T] int32 nodes to replay before step j; restore_slot / save_slot: [B, T] int32
    (-1: the committed state / keep nothing); num_nodes: [B] int32; max_saved: states kept at once.
    """

    def __init__(self, order, replay_len, replay, num_nodes, restore_slot=None, save_slot=None, max_saved=0):
        self.order, self.replay_len, self.replay, self.num_nodes = order, replay_len, replay, num_nodes
        no_slot = torch.full_like(order, -1)
        self.restore_slot = no_slot if restore_slot is None else restore_slot
        self.save_slot = no_slot if save_slot is None else save_slot
        self.max_saved = max_saved

    def replayed_steps(self) -> torch.Tensor:
        """Recurrence steps each request costs, ancestors replayed included: [B] int64."""
        return self.num_nodes.long() + self.replay_len.clamp(min=0).sum(1)


def tree_schedule(parents: torch.Tensor, num_nodes: torch.Tensor | None = None, max_saved: int = 8) -> TreeSchedule:
    """Schedule for trees given by ``parents`` [B, T] int (-1: child of the committed state, else ``< i``).

    num_nodes: [B] int (default: all T nodes valid). T is at most 64. max_saved: branch states kept at
    once per request (scratch of ``max_saved`` states per request and value head during the verify);
    0 keeps none, every restart replays its root path from the committed state.
    """
    B, T = parents.shape
    if T > 64:
        raise ValueError(f"trees of up to 64 nodes are supported, got {T}")
    if not 0 <= max_saved <= 64:
        raise ValueError(f"max_saved must be in [0, 64], got {max_saved}")
    parents = parents.to(torch.int32).contiguous()
    if num_nodes is None:
        num_nodes = torch.full((B,), T, dtype=torch.int32, device=parents.device)
    num_nodes = num_nodes.to(torch.int32).contiguous()
    order = torch.full((B, T), -1, dtype=torch.int32, device=parents.device)
    replay_len = torch.full((B, T), -1, dtype=torch.int32, device=parents.device)
    replay = torch.full((B, T, T), -1, dtype=torch.int32, device=parents.device)
    restore_slot = torch.full((B, T), -1, dtype=torch.int32, device=parents.device)
    save_slot = torch.full((B, T), -1, dtype=torch.int32, device=parents.device)
    _tree_schedule_kernel[(B,)](
        parents,
        num_nodes,
        order,
        replay_len,
        replay,
        restore_slot,
        save_slot,
        T=T,
        NP2_T=triton.next_power_of_2(T),
        MAX_SAVED=max_saved,
        NP2_S=triton.next_power_of_2(max(max_saved, 1)),
        num_warps=1,
    )  # serial: one warp
    return TreeSchedule(order, replay_len, replay, num_nodes, restore_slot, save_slot, max_saved)


@triton.jit
def _load_node(
    node,
    q,
    k,
    v,
    a,
    b,
    bos,
    i_h,
    i_hv,
    o_k,
    o_v,
    mask_k,
    mask_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
):
    """The inputs of token ``bos + node`` in FP32: (q [BK], k [BK], v [BV], a, b)."""
    t = bos + node
    b_q = tl.load(q + (t * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(k + (t * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_v = tl.load(v + (t * HV + i_hv) * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_b = tl.load(b + t * HV + i_hv).to(tl.float32)
    b_a = tl.load(a + t * HV + i_hv).to(tl.float32)
    return b_q, b_k, b_v, b_a, b_b


@triton.jit
def _gdn_gates(b_a, b_b, b_A_log, b_dt_bias, softplus_beta, softplus_threshold):
    """A token's log-space decay ``g`` and write strength ``beta`` (scalars), in SGLang 0.5.23's operation order."""
    x = b_a + b_dt_bias
    beta_x = softplus_beta * x
    softplus_x = tl.where(beta_x <= softplus_threshold, (1.0 / softplus_beta) * tl.log(1.0 + tl.exp(beta_x)), x)
    b_g = -tl.exp(b_A_log) * softplus_x
    b_beta = 1.0 / (1.0 + tl.exp(-b_b))
    return b_g, b_beta


@triton.jit
def _normalise_qk(b_q, b_k, scale, USE_QK_L2NORM: tl.constexpr):
    """l2-normalised q (times ``scale``) and k, in SGLang 0.5.23's operation order."""
    if USE_QK_L2NORM:
        q_sum_sq = tl.sum(b_q * b_q)
        k_sum_sq = tl.sum(b_k * b_k)
        q_rsqrt = 1.0 / tl.sqrt(q_sum_sq + 1e-6)
        k_rsqrt = 1.0 / tl.sqrt(k_sum_sq + 1e-6)
        b_q *= q_rsqrt
        b_k *= k_rsqrt
    b_q = b_q * scale
    return b_q, b_k


@triton.jit
def _gdn_step(
    b_h,
    b_q,
    b_k,
    b_v,
    b_a,
    b_b,
    b_A_log,
    b_dt_bias,
    softplus_beta,
    softplus_threshold,
    scale,
    USE_QK_L2NORM: tl.constexpr,
    PREPARED: tl.constexpr,
):
    """One GDN step on the state tile ``b_h [BK, BV]`` from a token's inputs; returns (state, scaled q).

    Operation order is SGLang 0.5.23's (``fused_sigmoid_gating_delta_rule_update_kernel``, GDN). PREPARED:
    q, k are already normalised (q scaled) and ``b_a``, ``b_b`` are the decay and beta
    (:func:`prepare_node_inputs`), computed by the same operations once per token instead of once per tile.
    """
    if PREPARED:
        b_decay, b_beta = b_a, b_b
    else:
        b_g, b_beta = _gdn_gates(b_a, b_b, b_A_log, b_dt_bias, softplus_beta, softplus_threshold)
        b_q, b_k = _normalise_qk(b_q, b_k, scale, USE_QK_L2NORM)
        b_decay = tl.exp(b_g)  # here, after the norms, as in SGLang: the commit's PTX stays the verified one
    b_h *= b_decay
    b_v -= tl.sum(b_h * b_k[:, None], 0)
    b_v *= b_beta
    b_h += b_k[:, None] * b_v[None, :]
    return b_h, b_q


@triton.jit
def _prepare_node_inputs_kernel(
    q,
    k,
    a,
    b,
    A_log,
    dt_bias,
    q_out,
    k_out,
    decay_out,
    beta_out,
    softplus_beta,
    softplus_threshold,
    scale,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    BK: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
):
    """One program per (token, key head): normalised q/k and the gates of the key head's value heads."""
    t, i_h = tl.program_id(0), tl.program_id(1)
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    b_q = tl.load(q + (t * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(k + (t * H + i_h) * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_q, b_k = _normalise_qk(b_q, b_k, scale, USE_QK_L2NORM)
    tl.store(q_out + (t * H + i_h) * K + o_k, b_q, mask=mask_k)
    tl.store(k_out + (t * H + i_h) * K + o_k, b_k, mask=mask_k)
    for j in tl.static_range(HV // H):
        i_hv = i_h * (HV // H) + j
        b_g, b_beta = _gdn_gates(
            tl.load(a + t * HV + i_hv).to(tl.float32),
            tl.load(b + t * HV + i_hv).to(tl.float32),
            tl.load(A_log + i_hv).to(tl.float32),
            tl.load(dt_bias + i_hv).to(tl.float32),
            softplus_beta,
            softplus_threshold,
        )
        tl.store(decay_out + t * HV + i_hv, tl.exp(b_g))
        tl.store(beta_out + t * HV + i_hv, b_beta)


@triton.jit
def _gdn_node_update(
    b_h,
    node,
    q,
    k,
    v,
    a,
    b,
    b_A_log,
    b_dt_bias,
    softplus_beta,
    softplus_threshold,
    scale,
    bos,
    i_h,
    i_hv,
    o_k,
    o_v,
    mask_k,
    mask_v,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    PREPARED: tl.constexpr,
):
    """One GDN step on the state tile ``b_h [BK, BV]`` for token ``bos + node``; returns (state, scaled q)."""
    b_q, b_k, b_v, b_a, b_b = _load_node(node, q, k, v, a, b, bos, i_h, i_hv, o_k, o_v, mask_k, mask_v, H, HV, K, V)
    return _gdn_step(
        b_h,
        b_q,
        b_k,
        b_v,
        b_a,
        b_b,
        b_A_log,
        b_dt_bias,
        softplus_beta,
        softplus_threshold,
        scale,
        USE_QK_L2NORM,
        PREPARED,
    )


@triton.jit
def _state_tile(state_pool, state_indices, i_b, i_hv, o_k, o_v, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr):
    """Pointers [BK, BV] to this program's tile of request ``i_b``'s committed state (pool [slots, HV, V, K])."""
    slot = tl.load(state_indices + i_b).to(tl.int64)
    return state_pool + slot * (HV * K * V) + i_hv * K * V + o_v[None, :] * K + o_k[:, None]


@triton.jit
def _saved_tile(
    saved, i_b, slot, i_hv, o_k, o_v, MAX_SAVED: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr
):
    """Pointers to this program's tile of a kept branch state: ``saved`` is [B, MAX_SAVED, HV, V, K] FP32."""
    base = ((i_b * MAX_SAVED + slot).to(tl.int64) * HV + i_hv) * (K * V)
    return saved + base + o_v[None, :] * K + o_k[:, None]


@triton.jit
def _path_verify_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    state_indices,
    order,
    replay_len,
    replay,
    restore_slot,
    save_slot,
    saved,
    num_nodes,
    o,
    write_state,
    softplus_beta,
    softplus_threshold,
    scale,
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_QK_L2NORM: tl.constexpr,
    MAX_SAVED: tl.constexpr,
    PREFETCH: tl.constexpr,
    PREPARED: tl.constexpr,
):
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
    h0 = tl.load(_state_tile(state_pool, state_indices, i_b, i_hv, o_k, o_v, HV, K, V), mask=mask_h, other=0).to(
        tl.float32
    )
    b_h = h0
    n = tl.load(num_nodes + i_b)
    if PREFETCH:
        # the next node's inputs load while the current step computes (they need no state), and the node
        # after it is read from the schedule one step earlier still, so no load waits on another
        next_node = tl.maximum(tl.load(order + bos), 0)
        after_node = tl.load(order + bos + 1, mask=n > 1, other=next_node)
        n_q, n_k, n_v, n_a, n_b = _load_node(
            next_node, q, k, v, a, b, bos, i_h, i_hv, o_k, o_v, mask_k, mask_v, H, HV, K, V
        )
    j = 0
    while j < n:
        if PREFETCH:
            node = next_node
            c_q, c_k, c_v, c_a, c_b = n_q, n_k, n_v, n_a, n_b
            next_node = after_node
            after_node = tl.load(order + bos + j + 2, mask=j + 2 < n, other=next_node)
            n_q, n_k, n_v, n_a, n_b = _load_node(
                next_node, q, k, v, a, b, bos, i_h, i_hv, o_k, o_v, mask_k, mask_v, H, HV, K, V
            )
        else:
            node = tl.load(order + bos + j)
        n_replay = tl.load(replay_len + bos + j)
        if n_replay >= 0:
            b_h = h0
            if MAX_SAVED > 0:
                src = tl.load(restore_slot + bos + j)
                if src >= 0:
                    tl.debug_barrier()  # the slot may have been written by other threads of this program
                    b_h = tl.load(
                        _saved_tile(saved, i_b, src, i_hv, o_k, o_v, MAX_SAVED, HV, K, V), mask=mask_h, other=0
                    )
            d = 0
            while d < n_replay:
                ancestor = tl.load(replay + (bos + j) * T + d)
                b_h, _ = _gdn_node_update(
                    b_h,
                    ancestor,
                    q,
                    k,
                    v,
                    a,
                    b,
                    b_A_log,
                    b_dt_bias,
                    softplus_beta,
                    softplus_threshold,
                    scale,
                    bos,
                    i_h,
                    i_hv,
                    o_k,
                    o_v,
                    mask_k,
                    mask_v,
                    H,
                    HV,
                    K,
                    V,
                    USE_QK_L2NORM,
                    PREPARED,
                )
                d += 1
        if not PREFETCH:  # loaded here, after the replay, so they hold no registers during it
            c_q, c_k, c_v, c_a, c_b = _load_node(
                node, q, k, v, a, b, bos, i_h, i_hv, o_k, o_v, mask_k, mask_v, H, HV, K, V
            )
        b_h, b_q = _gdn_step(
            b_h,
            c_q,
            c_k,
            c_v,
            c_a,
            c_b,
            b_A_log,
            b_dt_bias,
            softplus_beta,
            softplus_threshold,
            scale,
            USE_QK_L2NORM,
            PREPARED,
        )
        b_o = tl.sum(b_h * b_q[:, None], 0)
        tl.store(o + ((bos + node) * HV + i_hv) * V + o_v, b_o.to(o.dtype.element_ty), mask=mask_v)
        if MAX_SAVED > 0:
            dst = tl.load(save_slot + bos + j)
            if dst >= 0:
                tl.debug_barrier()  # a restore from this slot earlier in the step may still be reading it
                tl.store(_saved_tile(saved, i_b, dst, i_hv, o_k, o_v, MAX_SAVED, HV, K, V), b_h, mask=mask_h)
        j += 1
    while j < T:
        tl.store(
            o + ((bos + j) * HV + i_hv) * V + o_v, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty), mask=mask_v
        )
        j += 1
    if write_state != 0:  # commit: the state after the last visited node goes back into the pool
        # the tile's pointers formed again here rather than kept live through the loop (registers)
        p_h = _state_tile(state_pool, state_indices, i_b, i_hv, o_k, o_v, HV, K, V)
        tl.store(p_h, b_h.to(p_h.dtype.element_ty), mask=mask_h)


def _check_inputs(q, k, v, a, b, state_pool, state_indices):
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    if q is not None and q.shape != k.shape:
        raise ValueError(f"q {tuple(q.shape)} and k {tuple(k.shape)} differ")
    if v.shape[:2] != (B, T) or a.shape != (B, T, HV) or b.shape != (B, T, HV) or HV % H:
        raise ValueError(
            f"shapes disagree: k {tuple(k.shape)}, v {tuple(v.shape)}, a {tuple(a.shape)}, "
            f"b {tuple(b.shape)} (HV must be a multiple of H)"
        )
    if state_pool.shape[1:] != (HV, V, K) or state_indices.shape != (B,):
        raise ValueError(
            f"state_pool must be [slots, {HV}, {V}, {K}] and state_indices [{B}], got "
            f"{tuple(state_pool.shape)} and {tuple(state_indices.shape)}"
        )
    tensors = [t for t in (q, k, v, a, b, state_pool) if t is not None]
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError("q, k, v, a, b and state_pool must be contiguous")
    return B, T, H, HV, K, V


def prepare_node_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    *,
    scale: float,
    use_qk_l2norm: bool = True,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
):
    """Per-token inputs of the recurrence, once per token instead of once per value tile of every head.

    Args: q, k [B, T, H, K]; a, b [B, T, HV]; A_log, dt_bias [HV].
    Returns: q (normalised, times ``scale``), k (normalised) [B, T, H, K] FP32; decay ``exp(g)`` and beta
    [B, T, HV] FP32 — bit for bit the values the path kernel forms from the raw inputs.
    """
    B, T, H, K = k.shape
    HV = a.shape[2]
    q_out = torch.empty((B, T, H, K), dtype=torch.float32, device=q.device)
    k_out = torch.empty_like(q_out)
    decay = torch.empty((B, T, HV), dtype=torch.float32, device=q.device)
    beta = torch.empty_like(decay)
    _prepare_node_inputs_kernel[(B * T, H)](
        q,
        k,
        a,
        b,
        A_log,
        dt_bias,
        q_out,
        k_out,
        decay,
        beta,
        softplus_beta,
        softplus_threshold,
        scale,
        H=H,
        HV=HV,
        K=K,
        BK=triton.next_power_of_2(K),
        USE_QK_L2NORM=use_qk_l2norm,
        num_warps=1,
    )  # one warp: SGLang's q/k layout
    return q_out, k_out, decay, beta


def gdn_tree_path_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    schedule: TreeSchedule,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    block_v: int = 4,
    num_warps: int = 1,
    prefetch: bool = True,
    prepare_inputs: bool = False,
    max_registers: int | None = None,
    lanes_per_column: int | str | None = "auto",
    warps_per_block: int = DEFAULT_WARPS_PER_BLOCK,
) -> torch.Tensor:
    """Gated-delta-rule output of every tree node along its root path; stores no per-node state.

    Args:
        q, k: [B, T, H, K] (bf16/fp16/fp32), node i of request b at [b, i].
        v: [B, T, HV, V]; a, b: [B, T, HV] (raw gate inputs, as SGLang passes them); A_log, dt_bias: [HV].
        state_pool: [slots, HV, V, K] committed states (fp32 or bf16; SGLang's layout), read only.
        state_indices: [B] int, the slot of each request.
        schedule: :func:`tree_schedule` of the batch's parents (shared by all layers of a step); with
            ``max_saved`` > 0 the call keeps up to that many branch states per request in an FP32 scratch
            [B, max_saved, HV, V, K] that lives for the call only.
        block_v / num_warps: the value tile; (4, 1) is SGLang's Hopper verify tile (bit parity with it).
        prefetch: load the next node's inputs during the current step (same arithmetic, shorter step latency).
        prepare_inputs: normalise q/k and form the gates once per token in a small first kernel
            (:func:`prepare_node_inputs`, FP32 [B, T, H, K] x 2 + [B, T, HV] x 2 for the call) instead of in
            each of the V / block_v tiles of every head.
        max_registers: registers per thread the compiler may use (None: its choice); fewer fit more programs
            on an SM at once. Neither option changes the arithmetic.
        lanes_per_column: run the step loop in CUDA with that many lanes per value column (4-32, :mod:`.lanes`;
            inputs prepared as with ``prepare_inputs``; bf16 q and v, K = 128, on a GPU), ``warps_per_block``
            warps to a block; same outputs bit for bit. None: the Triton kernel (block_v, num_warps, prefetch,
            max_registers are its options). "auto": the CUDA kernel where it applies and builds (8 lanes,
            8 warps: the fastest at B = 1-32 on the H200), else the Triton kernel.
    Returns:
        o: [B, T, HV, V] in q's dtype; nodes past ``num_nodes[b]`` are zero.
    """
    B, T, H, HV, K, V = _check_inputs(q, k, v, a, b, state_pool, state_indices)
    if schedule.order.shape != (B, T):
        raise ValueError(f"schedule is for {tuple(schedule.order.shape)} trees, inputs are [{B}, {T}]")
    o = torch.empty(v.shape, dtype=q.dtype, device=q.device)
    scale = scale if scale is not None else K**-0.5
    lanes_per_column = resolve_lanes(lanes_per_column, q, v, state_pool)
    if lanes_per_column is not None and not lanes_kernel_applies(q, v, state_pool):
        raise ValueError(
            "the CUDA kernel (lanes_per_column) takes bf16 q and v with K = 128 on a GPU and an FP32 "
            f"or bf16 pool; got q {q.dtype} on {q.device}, v {v.dtype}, K = {K}, pool {state_pool.dtype}"
        )
    if prepare_inputs or lanes_per_column is not None:
        q, k, a, b = prepare_node_inputs(
            q,
            k,
            a,
            b,
            A_log,
            dt_bias,
            scale=scale,
            use_qk_l2norm=use_qk_l2norm,
            softplus_beta=softplus_beta,
            softplus_threshold=softplus_threshold,
        )
    # kept branch states live only during this call (shared by the layers through the allocator)
    saved = torch.empty(
        (B, schedule.max_saved, HV, V, K) if schedule.max_saved else (1,), dtype=torch.float32, device=o.device
    )
    if lanes_per_column is not None:
        path_verify_lanes(
            q,
            k,
            v,
            a,
            b,
            state_pool,
            state_indices,
            schedule,
            o,
            saved,
            lanes_per_column=lanes_per_column,
            warps_per_block=warps_per_block,
        )
        return o
    grid = (triton.cdiv(V, block_v), B, HV)
    _path_verify_kernel[grid](
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state_pool,
        state_indices,
        schedule.order,
        schedule.replay_len,
        schedule.replay,
        schedule.restore_slot,
        schedule.save_slot,
        saved,
        schedule.num_nodes,
        o,
        0,
        softplus_beta,
        softplus_threshold,
        scale,
        T=T,
        H=H,
        HV=HV,
        K=K,
        V=V,
        BK=triton.next_power_of_2(K),
        BV=block_v,
        USE_QK_L2NORM=use_qk_l2norm,
        MAX_SAVED=schedule.max_saved,
        PREFETCH=prefetch,
        PREPARED=prepare_inputs,
        num_warps=num_warps,
        num_stages=3,
        maxnreg=max_registers,
    )
    return o
