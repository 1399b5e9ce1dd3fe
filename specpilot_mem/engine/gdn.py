"""The gated delta rule (paper Eq. 2) in pure torch: recurrent, chunked, and over a draft tree.

    h_t = a_t (I - b_t k_t k_t^T) h_{t-1} + b_t k_t v_t^T,   o_t = h_t^T q_t

Shapes: q, k [B, H, T, K]; v [B, H, T, V]; log_decay (log a_t <= 0) and beta [B, H, T];
state h [B, H, K, V]. Everything runs in float32 whatever the inputs are.

A draft tree of R rows is given by its ancestor mask ``anc`` [R, R] (bool, anc[i, j] is true when
row j is row i or one of its ancestors; rows in topological order, so it is lower triangular). A chain
is the tree whose mask is the lower triangle, so one formula serves prefill chunks, chain verify and
tree verify. The masked WY form is the TreeWY idea of the paper's §4.2; ``tree_path_reference``
recomputes each row's state along its root path from the committed state, one step at a time, and is
the reference the WY form is checked against.
"""

from __future__ import annotations

import torch


def recurrent_step(state, q, k, v, log_decay, beta):
    """One token. state [B, H, K, V]; q, k [B, H, K]; v [B, H, V]; log_decay, beta [B, H].

    Returns (o [B, H, V], new state [B, H, K, V]).
    """
    state = state * log_decay.exp()[..., None, None]
    remembered = torch.einsum("bhk,bhkv->bhv", k, state)
    delta = (v - remembered) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", q, state)
    return o, state


def recurrent(q, k, v, log_decay, beta, state):
    """Token by token over T. Returns (o [B, H, T, V], final state [B, H, K, V])."""
    outs = []
    for t in range(q.shape[2]):
        o, state = recurrent_step(state, q[:, :, t], k[:, :, t], v[:, :, t], log_decay[:, :, t], beta[:, :, t])
        outs.append(o)
    return torch.stack(outs, dim=2), state


def masked_wy(q, k, v, log_decay, beta, state, anc, all_end_states: bool = True):
    """All rows of one chunk at once, each row seeing only its ancestors (``anc`` [R, R] bool).

    q, k [B, H, R, K]; v [B, H, R, V]; log_decay, beta [B, H, R]; state [B, H, K, V] (the committed
    state before row 0). Returns (o [B, H, R, V], end states): with ``all_end_states`` the state after
    each row's root path [B, H, R, K, V] (a verify pass commits the accepted row's), else only the
    last row's [B, H, K, V] (a prefill chunk, where the last row ends the chain).
    """
    with torch.autocast(q.device.type, enabled=False):  # the WY algebra needs float32 matmuls
        return _masked_wy(q, k, v, log_decay, beta, state, anc, all_end_states)


def _masked_wy(q, k, v, log_decay, beta, state, anc, all_end_states):
    q, k, v, log_decay, beta, state = (x.float() for x in (q, k, v, log_decay, beta, state))
    ancf = anc.to(q.dtype)
    path_decay = torch.einsum("ij,bhj->bhi", ancf, log_decay)  # sum of log a along each root path
    rel = (path_decay[..., :, None] - path_decay[..., None, :]).masked_fill(~anc, float("-inf")).exp()
    k_beta = k * beta[..., None]
    strict = anc & ~torch.eye(anc.shape[0], dtype=torch.bool, device=anc.device)
    lower = (k_beta @ k.transpose(-1, -2)) * rel * strict
    # (I + L)^-1 applied by a triangular solve: the WY representation of the chained rank-one updates.
    # (A product of powers of L is exact in theory but cancels catastrophically once keys align.)
    system = torch.eye(anc.shape[0], dtype=q.dtype, device=q.device) + lower
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * path_decay.exp()[..., None], upper=False, unitriangular=True)
    v_new = u - w @ state
    o = (q * path_decay.exp()[..., None]) @ state + ((q @ k.transpose(-1, -2)) * rel) @ v_new
    if not all_end_states:
        last = path_decay[..., -1]
        end = last.exp()[..., None, None] * state + (k * rel[..., -1, :, None]).transpose(-1, -2) @ v_new
        return o, end
    end_states = path_decay.exp()[..., None, None] * state[:, :, None] + torch.einsum(
        "bhij,bhjk,bhjv->bhikv", rel, k, v_new
    )
    return o, end_states


def chunked(q, k, v, log_decay, beta, state, chunk_size: int = 64):
    """A sequence in chunks of ``chunk_size`` (the masked WY form with a causal mask per chunk).

    Shapes as in ``recurrent``. Returns (o [B, H, T, V], final state). Used for prefill and training.
    """
    T = q.shape[2]
    outs = []
    for start in range(0, T, chunk_size):
        end = min(start + chunk_size, T)
        n = end - start
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        o, state = masked_wy(
            q[:, :, start:end],
            k[:, :, start:end],
            v[:, :, start:end],
            log_decay[:, :, start:end],
            beta[:, :, start:end],
            state,
            causal,
            all_end_states=False,
        )
        outs.append(o)
    return torch.cat(outs, dim=2), state


def tree_path_reference(q, k, v, log_decay, beta, state, parents):
    """Reference tree verify: each row's state recomputed step by step from its parent's state.

    ``parents`` is a list of R ints (-1 for the root row, else an earlier row). Because a row's parent
    state is itself the end of the parent's root path, this is exactly the recurrence along every root
    path from the committed state. Returns (o [B, H, R, V], end states [B, H, R, K, V]).
    """
    q, k, v, log_decay, beta, state = (x.float() for x in (q, k, v, log_decay, beta, state))
    outs, ends = [], []
    for i, parent in enumerate(parents):
        start = state if parent < 0 else ends[parent]
        o, end = recurrent_step(start, q[:, :, i], k[:, :, i], v[:, :, i], log_decay[:, :, i], beta[:, :, i])
        outs.append(o)
        ends.append(end)
    return torch.stack(outs, dim=2), torch.stack(ends, dim=2)
