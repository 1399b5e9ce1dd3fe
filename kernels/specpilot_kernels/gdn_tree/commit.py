"""GDN commit: replay each request's accepted root path into its state slot.

Runs the same per-step arithmetic as :mod:`.path_verify` (SGLang 0.5.23's, operation for operation)
from the committed state over the accepted nodes only, then writes the state back in place. On a
chain it is bit-identical to SGLang's verify-then-scatter commit (the snapshot of the last accepted
step copied into the pool) at the same value tile, without that verify ever storing a snapshot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .path_verify import _check_inputs, _gdn_node_update, _load_state_tile


@triton.jit
def _commit_kernel(k, v, a, b, A_log, dt_bias, state_pool, state_indices, accepted, accept_len,
                   softplus_beta, softplus_threshold,
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
    n_accepted = tl.load(accept_len + i_b)
    if n_accepted > 0:
        b_A_log = tl.load(A_log + i_hv).to(tl.float32)
        b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)
        b_h = _load_state_tile(state_pool, state_indices, i_b, i_hv, o_k, o_v, mask_h, HV, K, V)
        d = 0
        while d < n_accepted:  # a while loop: the interpreter cannot take a loaded scalar as a range bound
            node = tl.load(accepted + bos + d)
            # q is not needed to update the state: pass k in its place (its normalised copy is dropped).
            b_h, _ = _gdn_node_update(b_h, node, k, k, v, a, b, b_A_log, b_dt_bias, softplus_beta,
                                      softplus_threshold, 1.0, bos, i_h, i_hv, o_k, o_v, mask_k, mask_v,
                                      H, HV, K, V, USE_QK_L2NORM)
            d += 1
        slot = tl.load(state_indices + i_b).to(tl.int64)
        p_h = state_pool + slot * (HV * K * V) + i_hv * K * V + o_v[None, :] * K + o_k[:, None]
        tl.store(p_h, b_h.to(p_h.dtype.element_ty), mask=mask_h)


def gdn_tree_commit(k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                    dt_bias: torch.Tensor, state_pool: torch.Tensor, state_indices: torch.Tensor,
                    accepted: torch.Tensor, accept_len: torch.Tensor, *, use_qk_l2norm: bool = True,
                    softplus_beta: float = 1.0, softplus_threshold: float = 20.0, block_v: int = 4,
                    num_warps: int = 1) -> None:
    """Advance each request's committed state over its accepted root path, in place.

    Args:
        k: [B, T, H, K]; v: [B, T, HV, V]; a, b: [B, T, HV]; A_log, dt_bias: [HV] — the verify step's inputs.
        state_pool: [slots, HV, V, K] (fp32 or bf16), updated in place at ``state_indices`` [B].
        accepted: [B, T] int, accepted node indices root first (a root path of the tree);
        accept_len: [B] int, how many of them (0 leaves the slot untouched).
        block_v / num_warps: the value tile; (4, 1) is SGLang's Hopper verify tile (bit parity with it).
    """
    B, T, H, HV, K, V = _check_inputs(None, k, v, a, b, state_pool, state_indices)
    if accepted.shape != (B, T) or accept_len.shape != (B,):
        raise ValueError(f"accepted must be [{B}, {T}] and accept_len [{B}], got {tuple(accepted.shape)} and "
                         f"{tuple(accept_len.shape)}")
    grid = (triton.cdiv(V, block_v), B, HV)
    _commit_kernel[grid](
        k, v, a, b, A_log, dt_bias, state_pool, state_indices, accepted.to(torch.int32).contiguous(),
        accept_len.to(torch.int32).contiguous(), softplus_beta, softplus_threshold,
        T=T, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=block_v, USE_QK_L2NORM=use_qk_l2norm,
        num_warps=num_warps, num_stages=3,
    )
