"""GDN commit: replay each request's accepted root path into its state slot.

The commit is the path-verify kernel itself, run over the accepted nodes as a chain with
``write_state`` set, so every step is the very code the verify ran. A separate, leaner kernel (the
state update without q's output) was measured one FP32 ulp off SGLang 0.5.23's verify-then-scatter
commit on the H200: without q's reduction next to it, the compiler sums k's squares over each
thread's four elements in the order 0,1,2,3 instead of SGLang's 1,0,2,3 (read off the sm_90 PTX).
In the shared kernel both q and k follow SGLang's order, and the float instruction stream of the
verify is unchanged by the state store. Target: bit-identical on chains to SGLang's commit (the
snapshot of the last accepted step copied into the pool), without any snapshot stored.
The CUDA path kernel (``lanes.py``) commits the same way (its state store on, no outputs) from inputs
prepared by :func:`.path_verify.prepare_node_inputs`; its sums are explicit intrinsics in SGLang's order,
so no compiler contraction can move them, and on the H200 it matched SGLang bit for bit on chains.
"""

from __future__ import annotations

import torch
import triton

from .lanes import DEFAULT_WARPS_PER_BLOCK, lanes_kernel_applies, path_verify_lanes, resolve_lanes
from .path_verify import TreeSchedule, _check_inputs, _path_verify_kernel, prepare_node_inputs


_CONTINUE_ALL: dict = {}


def _continue_all(numel: int, device: torch.device) -> torch.Tensor:
    """An int32 vector of -1 (every step continues from the one before), made once per size and device.

    Kept across calls so a commit is a single launch per layer; never cached while a CUDA graph is being
    captured (the graph's memory pool would own it).
    """
    key = (numel, str(device))
    if key not in _CONTINUE_ALL:
        minus_ones = torch.full((numel,), -1, dtype=torch.int32, device=device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return minus_ones
        _CONTINUE_ALL[key] = minus_ones
    return _CONTINUE_ALL[key]


def _triton_commit_fits_one_wave(B: int, HV: int, V: int, block_v: int, device: torch.device) -> bool:
    """Whether the Triton commit's one-warp programs (117 registers: 16 per SM) all run at once. Then it was
    faster than the CUDA commit on the H200 (B=1: 418 vs 473 µs; the CUDA one pays a preparation kernel
    and a staging round trip per call); with a second wave the CUDA commit was (B=4: 786 vs 1377 µs)."""
    programs = B * HV * triton.cdiv(V, block_v)
    return programs <= 16 * torch.cuda.get_device_properties(device).multi_processor_count


def gdn_tree_commit(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    accepted: torch.Tensor,
    accept_len: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    softplus_beta: float = 1.0,
    softplus_threshold: float = 20.0,
    block_v: int = 4,
    num_warps: int = 1,
    prefetch: bool = True,
    max_registers: int | None = None,
    lanes_per_column: int | str | None = "auto",
    warps_per_block: int = DEFAULT_WARPS_PER_BLOCK,
) -> None:
    """Advance each request's committed state over its accepted root path, in place.

    Args:
        q, k: [B, T, H, K]; v: [B, T, HV, V]; a, b: [B, T, HV]; A_log, dt_bias: [HV] — the verify step's inputs.
        state_pool: [slots, HV, V, K] (fp32 or bf16), updated in place at ``state_indices`` [B].
        accepted: [B, T] int, accepted node indices root first (a root path of the tree);
        accept_len: [B] int, how many of them (0 leaves the slot's values unchanged).
        block_v / num_warps: the value tile; (4, 1) is SGLang's Hopper verify tile (bit parity with it).
        prefetch: load the next node's inputs during the current step (the path kernel's option; both
            settings were bit-identical to SGLang on chains on the H200).
        max_registers: registers per thread the compiler may use (None: its choice); a limit for ptxas only,
            the PTX and so the arithmetic are unchanged.
        lanes_per_column: replay in CUDA with lanes along V (:mod:`.lanes`, 4-32 lanes per value column,
            ``warps_per_block`` warps to a block) from inputs prepared once per token; its sums keep the
            Triton kernel's order (bf16 q and v, K = 128, on a GPU). None: the Triton kernel. "auto": the CUDA
            kernel where it applies and builds (bit-identical to SGLang on chains on the H200), unless the
            Triton commit's programs all fit on the GPU at once (B <= 2 on the H200), where that was faster.
    """
    B, T, H, HV, K, V = _check_inputs(q, k, v, a, b, state_pool, state_indices)
    if accepted.shape != (B, T) or accept_len.shape != (B,):
        raise ValueError(
            f"accepted must be [{B}, {T}] and accept_len [{B}], got {tuple(accepted.shape)} and "
            f"{tuple(accept_len.shape)}"
        )
    # the accepted path as a schedule that never restarts; int32, as the kernel measured bit-identical ran
    # (the commit's float code is sensitive to its surroundings: it is kept exactly as verified on the H200)
    order, lengths = accepted.to(torch.int32).contiguous(), accept_len.to(torch.int32).contiguous()
    continue_all = _continue_all(B * T, q.device)
    scale = scale if scale is not None else K**-0.5
    if lanes_per_column == "auto" and q.is_cuda and _triton_commit_fits_one_wave(B, HV, V, block_v, q.device):
        lanes_per_column = None
    lanes_per_column = resolve_lanes(lanes_per_column, q, v, state_pool)
    if lanes_per_column is not None:
        if not lanes_kernel_applies(q, v, state_pool):
            raise ValueError(
                "the CUDA commit (lanes_per_column) takes bf16 q and v with K = 128 on a GPU and an FP32 "
                f"or bf16 pool; got q {q.dtype} on {q.device}, v {v.dtype}, K = {K}, pool {state_pool.dtype}"
            )
        prepared = prepare_node_inputs(
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
        no_restarts = continue_all.view(B, T)
        chain = TreeSchedule(order, no_restarts, no_restarts, lengths, no_restarts, no_restarts)
        untouched = torch.empty(0, device=q.device)  # outputs and kept states: the commit has neither
        path_verify_lanes(
            *prepared[:2],
            v,
            *prepared[2:],
            state_pool,
            state_indices,
            chain,
            untouched,
            untouched,
            lanes_per_column=lanes_per_column,
            warps_per_block=warps_per_block,
            write_state=True,
        )
        return
    scratch = torch.empty(v.shape, dtype=q.dtype, device=q.device)  # the path's outputs, not needed here
    grid = (triton.cdiv(V, block_v), B, HV)
    _path_verify_kernel[grid](  # MAX_SAVED=0: the kept-state arrays are never read
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
        continue_all,
        continue_all,
        continue_all,
        continue_all,
        continue_all,
        lengths,
        scratch,
        1,
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
        MAX_SAVED=0,
        PREFETCH=prefetch,
        PREPARED=False,
        num_warps=num_warps,
        num_stages=3,
        maxnreg=max_registers,
    )
