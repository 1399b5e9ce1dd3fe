"""Pure-torch definition of gated-delta-rule (GDN) verification over a draft tree.

Eq. 2 of the paper, with SGLang 0.5.23's conventions
(``sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py``, GDN branch):

    g_t    = -exp(A_log) * softplus(a_t + dt_bias)          (log-space decay, per value head)
    beta_t = sigmoid(b_t)
    q_t, k_t  l2-normalised (x / sqrt(sum x^2 + 1e-6)), q_t scaled by ``scale`` (K^-0.5 by default)
    h_t = exp(g_t) h_{t-1};  u_t = beta_t (v_t - h_t^T k_t);  h_t += k_t u_t^T;  o_t = h_t^T q_t

States are FP32 ``[K, V]`` per value head, stored as SGLang's pool stores them: ``[slots, HV, V, K]``.
A tree is given by ``parents[b, i]`` (``-1``: child of the committed state; otherwise a node index
``< i``), so index order is a topological order and a node's ancestors sorted by index are its root
path. Node ``i`` of request ``b`` is valid when ``i < num_nodes[b]``.
"""

from __future__ import annotations

import torch


def _wide(x: torch.Tensor) -> torch.Tensor:
    """FP32, or FP64 when given FP64 (the reference then runs in double precision)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def gdn_gates(A_log, a, dt_bias, b, softplus_beta: float = 1.0, softplus_threshold: float = 20.0):
    """Log-space decay ``g`` and write strength ``beta`` (FP32 or FP64), both shaped like ``a`` / ``b``."""
    x = _wide(a) + _wide(dt_bias)
    beta_x = softplus_beta * x
    softplus = torch.where(beta_x <= softplus_threshold, (1.0 / softplus_beta) * torch.log1p(torch.exp(beta_x)), x)
    g = -torch.exp(_wide(A_log)) * softplus
    beta = torch.sigmoid(_wide(b))
    return g, beta


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _prepare(q, k, v, a, b, A_log, dt_bias, scale, use_qk_l2norm, softplus_beta, softplus_threshold):
    """FP32 per-node inputs with value heads expanded: q, k ``[B, T, HV, K]``, v ``[B, T, HV, V]``."""
    H, HV = q.shape[2], v.shape[2]
    qf, kf = _wide(q), _wide(k)
    if use_qk_l2norm:
        qf, kf = _normalise(qf), _normalise(kf)
    qf = qf * (scale if scale is not None else q.shape[-1] ** -0.5)
    group = HV // H
    qf = qf.repeat_interleave(group, dim=2)
    kf = kf.repeat_interleave(group, dim=2)
    g, beta = gdn_gates(A_log, a, dt_bias, b, softplus_beta, softplus_threshold)
    return qf, kf, _wide(v), g, beta


def gdn_step(h, k, v, g, beta):
    """One recurrence step for all heads: ``h [HV, K, V]``, ``k [HV, K]``, ``v [HV, V]``, ``g, beta [HV]``."""
    h = h * torch.exp(g)[:, None, None]
    u = (v - torch.einsum("hkv,hk->hv", h, k)) * beta[:, None]
    return h + k[:, :, None] * u[:, None, :]


def root_path(parents_row: list[int], node: int) -> list[int]:
    """Node indices from the root down to ``node`` (inclusive)."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents_row[node]
    return path[::-1]


def path_verify_reference(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    state_indices,
    parents,
    num_nodes,
    *,
    scale=None,
    use_qk_l2norm=True,
    softplus_beta=1.0,
    softplus_threshold=20.0,
):
    """Output of every tree node along its root path from the committed state.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; a, b: [B, T, HV]; A_log, dt_bias: [HV];
    state_pool: [slots, HV, V, K] (FP32 or BF16); state_indices: [B]; parents: [B, T]; num_nodes: [B].
    Returns o: [B, T, HV, V] in q's dtype; padding nodes (``i >= num_nodes[b]``) are zero.
    """
    qf, kf, vf, g, beta = _prepare(
        q, k, v, a, b, A_log, dt_bias, scale, use_qk_l2norm, softplus_beta, softplus_threshold
    )
    B, T = q.shape[:2]
    out = torch.zeros(v.shape, dtype=qf.dtype, device=v.device)
    for r in range(B):
        h0 = state_pool[int(state_indices[r])].to(qf.dtype).transpose(-1, -2)  # [HV, K, V]
        par = [int(p) for p in parents[r]]
        for node in range(int(num_nodes[r])):
            h = h0
            for step in root_path(par, node):
                h = gdn_step(h, kf[r, step], vf[r, step], g[r, step], beta[r, step])
            out[r, node] = torch.einsum("hkv,hk->hv", h, qf[r, node])
    return out.to(q.dtype)


def commit_reference(
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    state_indices,
    accepted,
    accept_len,
    *,
    use_qk_l2norm=True,
    softplus_beta=1.0,
    softplus_threshold=20.0,
):
    """The state pool after replaying each request's accepted root path (a new tensor; input unchanged).

    k: [B, T, H, K]; v: [B, T, HV, V]; a, b: [B, T, HV]; accepted: [B, T] node indices, root first;
    accept_len: [B] (0 keeps the committed state).
    """
    kf = _wide(k)
    if use_qk_l2norm:
        kf = _normalise(kf)
    kf = kf.repeat_interleave(v.shape[2] // k.shape[2], dim=2)
    g, beta = gdn_gates(A_log, a, dt_bias, b, softplus_beta, softplus_threshold)
    vf = _wide(v)
    new_pool = state_pool.clone()
    for r in range(k.shape[0]):
        slot = int(state_indices[r])
        h = state_pool[slot].to(kf.dtype).transpose(-1, -2)
        for step in [int(n) for n in accepted[r, : int(accept_len[r])]]:
            h = gdn_step(h, kf[r, step], vf[r, step], g[r, step], beta[r, step])
        new_pool[slot] = h.transpose(-1, -2).to(state_pool.dtype)
    return new_pool


def wy_verify_reference(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    state_indices,
    parents,
    num_nodes,
    *,
    scale=None,
    use_qk_l2norm=True,
    softplus_beta=1.0,
    softplus_threshold=20.0,
):
    """The same outputs as :func:`path_verify_reference`, computed in the WY (chunked) form in float64.

    With ``G_i`` the decay summed along node i's root path and ``M`` the ancestor-or-self mask
    (lower-triangular in topological order):
        A = strict(M) * beta_i exp(G_i - G_j) k_i.k_j,   U = (I + A)^-1 diag(beta) (V - diag(exp G) K S)
        O = diag(exp G) Q S + (M * exp(G_i - G_j) * Q K^T) U
    This is the identity the WY kernel implements; the test that it equals the recurrence pins it.
    """
    qf, kf, vf, g, beta = _prepare(
        q, k, v, a, b, A_log, dt_bias, scale, use_qk_l2norm, softplus_beta, softplus_threshold
    )
    B, T = q.shape[:2]
    out = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    for r in range(B):
        n = int(num_nodes[r])
        mask = ancestor_mask(parents[r, :n])  # [n, n] bool, self included
        gd = g[r, :n].double()  # [n, HV]
        G = mask.double() @ gd  # path-accumulated decay
        S = state_pool[int(state_indices[r])].double().transpose(-1, -2)  # [HV, K, V]
        Q, Kk, Vv, bt = qf[r, :n].double(), kf[r, :n].double(), vf[r, :n].double(), beta[r, :n].double()
        for hv in range(v.shape[2]):
            decay = torch.exp(G[:, hv, None] - G[None, :, hv]).masked_fill(~mask, 0.0)
            strict = decay.masked_fill(torch.eye(n, dtype=torch.bool), 0.0)
            A = bt[:, hv, None] * strict * (Kk[:, hv] @ Kk[:, hv].T)
            rhs = bt[:, hv, None] * (Vv[:, hv] - torch.exp(G[:, hv, None]) * (Kk[:, hv] @ S[hv]))
            U = torch.linalg.solve_triangular(torch.eye(n, dtype=torch.float64) + A, rhs, upper=False)
            out[r, :n, hv] = torch.exp(G[:, hv, None]) * (Q[:, hv] @ S[hv]) + (decay * (Q[:, hv] @ Kk[:, hv].T)) @ U
    return out.to(q.dtype)


def ancestor_mask(parents_row: torch.Tensor) -> torch.Tensor:
    """``mask[i, j]`` = node j is on node i's root path (i itself included): ``[n, n]`` bool, lower-triangular."""
    n = parents_row.shape[0]
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(n):
        p = int(parents_row[i])
        if p >= 0:
            mask[i] |= mask[p]
    return mask
