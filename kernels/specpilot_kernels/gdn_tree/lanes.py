"""The path-verify step loop in CUDA C++ with lanes along V (csrc/path_verify_lanes.cu).

The Triton kernel's tile gives each of a warp's 32 lanes four K elements of each of four value columns,
so every sum over K ends in five shuffles per column and the scalars of a step (v's update, the gates)
are computed by all 32 lanes. Here ``lanes_per_column`` (P) lanes share one column and each holds
128 / P of its K elements, so most of each sum is in-thread and a column's arithmetic is done once.
The sums keep the Triton kernel's order exactly (its in-thread order, then its butterfly; see the .cu),
so the outputs are that kernel's bit for bit. Inputs are prepared once per token
(:func:`.path_verify.prepare_node_inputs`); the schedule is :func:`.path_verify.tree_schedule`'s. A block of
``warps_per_block`` warps serves one (request, value head) and first copies every node's prepared k/q rows,
its v columns, gates and schedule row into shared memory, so the steps wait on no global load.
"""

from __future__ import annotations

from pathlib import Path

import torch

CSRC = Path(__file__).with_name("csrc")
# fewer lanes per column hold more state per lane: 2 took 224 registers, 1 spilled (ptxas -v, sm_90a)
LANES_PER_COLUMN = (4, 8, 16, 32)
# the defaults ("auto"): fastest verify and commit at B = 1-32 on the H200 (NOTES.md, run 2)
DEFAULT_LANES_PER_COLUMN, DEFAULT_WARPS_PER_BLOCK = 8, 8


_EXTENSION = ("specpilot_gdn_tree", CSRC, ("binding.cpp", "path_verify_lanes.cu"))


def _extension():
    # imported here: the Triton path must import without the package's CUDA helper (an entry vendors this op
    # folder; it vendors ../cuda_extension.py beside it only when it uses this kernel)
    from ..cuda_extension import load_cuda_extension

    return load_cuda_extension(*_EXTENSION)


def lanes_kernel_applies(q: torch.Tensor, v: torch.Tensor, state_pool: torch.Tensor) -> bool:
    """Whether the CUDA kernel takes these inputs: CUDA, bf16 q and v, K = 128, an FP32 or bf16 pool."""
    return (
        q.is_cuda
        and q.dtype == torch.bfloat16
        and v.dtype == torch.bfloat16
        and q.shape[-1] == 128
        and state_pool.dtype in (torch.float32, torch.bfloat16)
    )


def lanes_kernel_available() -> bool:
    """Whether the CUDA kernel runs here: a GPU of compute capability >= 8.0 (cp.async) on which the extension
    builds. A failed build is reported once as a warning; the Triton kernel is then used."""
    from ..cuda_extension import cuda_extension_builds

    return cuda_extension_builds(*_EXTENSION, "the GDN tree CUDA kernel", "the Triton kernel")


def resolve_lanes(lanes_per_column, q: torch.Tensor, v: torch.Tensor, state_pool: torch.Tensor) -> int | None:
    """``"auto"``: the default lanes per column where the CUDA kernel applies and runs, else None (Triton)."""
    if lanes_per_column != "auto":
        return lanes_per_column
    if lanes_kernel_applies(q, v, state_pool) and lanes_kernel_available():
        return DEFAULT_LANES_PER_COLUMN
    return None


def path_verify_lanes(
    q_prepared: torch.Tensor,
    k_prepared: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    schedule,
    o: torch.Tensor,
    saved: torch.Tensor,
    *,
    lanes_per_column: int,
    warps_per_block: int,
    write_state: bool = False,
) -> None:
    """Fill ``o`` [B, T, HV, V] bf16 from prepared inputs (q, k FP32 [B, T, H, 128]; decay, beta FP32 [B, T, HV]).

    ``saved``: FP32 [B, max_saved, HV, V, 128] scratch for kept branch states (any tensor when max_saved is 0).
    ``write_state``: the commit — ``o`` is left alone and each request's state after its last visited node
    is written back into ``state_pool`` at ``state_indices``.
    """
    if lanes_per_column not in LANES_PER_COLUMN:
        raise ValueError(f"lanes_per_column must be one of {LANES_PER_COLUMN}, got {lanes_per_column}")
    if state_pool.dtype == torch.bfloat16 and lanes_per_column > 16:
        raise ValueError("a bf16 pool takes at most 16 lanes per column (its sums run over 16 runs of 8 elements)")
    columns = warps_per_block * 32 // lanes_per_column
    if v.shape[-1] % columns:
        raise ValueError(
            f"V = {v.shape[-1]} is not a multiple of a block's {columns} columns "
            f"({warps_per_block} warps x {32 // lanes_per_column})"
        )
    _extension().path_verify_lanes(
        q_prepared,
        k_prepared,
        v,
        decay,
        beta,
        state_pool,
        state_indices.to(torch.int32).contiguous(),
        schedule.order,
        schedule.replay_len,
        schedule.replay,
        schedule.restore_slot,
        schedule.save_slot,
        schedule.num_nodes,
        saved,
        o,
        schedule.max_saved,
        write_state,
        lanes_per_column,
        warps_per_block,
    )
