"""The INT8 pass in CUDA C++ (csrc/int8_pass.cu): the same bounds and candidate lists as the Triton pass.

A prologue scales each input row by a power of two into fp16 (exactly, or the row takes the full-head
fallback: :func:`.reference.scaled_fp16_rows` is its definition), then one persistent kernel streams
the offset-binary fragments (:mod:`.fragments`) once through per-warp cp.async rings into mma.sync and
lists rows that may win in a stage list, and a compaction keeps those that reach the final best lower
bound. All three launches are CUDA-graph capturable. The partition (:class:`CudaPassConfig`) never
changes which rows can be the argmax, only the speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..cuda_extension import cuda_extension_builds, load_cuda_extension
from .fragments import token_tiles
from .reference import BOUND_SLACK, NORM_INFLATION, CertifiedHead

CSRC = Path(__file__).with_name("csrc")
STAGE_FACTOR = 16  # the stage list holds 16x the candidate list: early warps see a low running best


@dataclass(frozen=True)
class CudaPassConfig:
    """tiles_per_warp (1, 2, 4): 16-row tiles sharing each activation load; warps_per_block (1-8), each
    with a ring of ``stages`` (2-12) 2 KB slots in shared memory; warps_per_sm: warps launched per
    multiprocessor (units of tiles are split evenly over them); shared_activations: the block's warps
    walk K in step and share each chunk's activations through shared memory (else each warp reads them
    through L1); chunks_per_barrier (with shared_activations): the activations come in batches of that many
    2 KB chunks and the block's warps meet once per batch (8, 4 or 1: the largest up to the asked value that
    divides a unit's chunks). With 3 stages, batches of 8 and 1-2 tiles the batched kernel runs (ring depth and
    batch fixed at compile time, addresses in running offsets), else the general one."""

    tiles_per_warp: int = 2
    warps_per_block: int = 8
    stages: int = 3
    warps_per_sm: int = 16
    shared_activations: bool = True
    chunks_per_barrier: int = 8


def default_cuda_config(rows: int) -> CudaPassConfig:
    """The partition for ``rows`` input rows (1-32): the H200 sweeps' fastest at every row count
    (``benchmarks/results/certified_head-cuda{11,12}-2026-11-30.json``: the batched kernel, 293 us at one row,
    335 us at 32 against the general kernel's 300 and 425-435 in the same runs): 8-warp blocks sharing the
    activations in batches of 8 chunks per barrier, two tiles and 3 ring slots per warp, 16 warps per
    multiprocessor."""
    return CudaPassConfig()


_EXTENSION = ("specpilot_certified_int8", CSRC, ("binding.cpp", "int8_pass.cu", "exact_head.cu"))


def _extension():
    return load_cuda_extension(*_EXTENSION)


def cuda_pass_available() -> bool:
    """Whether the CUDA pass can run here: a GPU of compute capability >= 8.0 on which the extension builds
    (a failed build is reported once as a warning; the Triton pass is then used)."""
    return cuda_extension_builds(*_EXTENSION, "the certified head's CUDA INT8 pass", "the Triton pass")


@dataclass(frozen=True)
class PassLists:
    """What the CUDA pass leaves: best_lower [M] fp32; count [M] int32, the rows reaching the final best lower bound
    (above the capacity: the full head); cand_idx [M, CAP] int32 and cand_upper [M, CAP] fp32, the first count
    valid; the stage lists the compaction reads: stage_count [M] int32, stage_idx [M, STAGE_FACTOR CAP] int32 and
    stage_upper fp32 (rows kept against the running best)."""

    best_lower: torch.Tensor
    count: torch.Tensor
    cand_idx: torch.Tensor
    cand_upper: torch.Tensor
    stage_count: torch.Tensor
    stage_idx: torch.Tensor
    stage_upper: torch.Tensor


def run_cuda_pass(
    x: torch.Tensor, head: CertifiedHead, *, max_survivors: int, config: CudaPassConfig | None, compact: bool
) -> PassLists:
    """The prologue and the pass, and (compact) the compaction into count and the candidate lists; without it count
    is left zero and the lists unwritten for :func:`.exact_cuda.certified_tokens_cuda`'s rescore, which compacts
    them itself. Shapes as :func:`int8_pass_cuda`'s."""
    if head.fragments is None:
        raise ValueError("the head has no fragments: quantize it with quantize_head(weight, fragments=True)")
    M, K = x.shape
    config = config or default_cuda_config(M)
    dev = x.device
    x16 = torch.empty((K // 32, token_tiles(M), 32, 8), dtype=torch.float16, device=dev)
    inv_scale = torch.empty(M, dtype=torch.float32, device=dev)
    norm = torch.empty(M, dtype=torch.float32, device=dev)
    lists = PassLists(
        best_lower=torch.empty(M, dtype=torch.float32, device=dev),
        count=torch.empty(M, dtype=torch.int32, device=dev),
        cand_idx=torch.empty((M, max_survivors), dtype=torch.int32, device=dev),
        cand_upper=torch.empty((M, max_survivors), dtype=torch.float32, device=dev),
        stage_count=torch.empty(M, dtype=torch.int32, device=dev),
        stage_idx=torch.empty((M, STAGE_FACTOR * max_survivors), dtype=torch.int32, device=dev),
        stage_upper=torch.empty((M, STAGE_FACTOR * max_survivors), dtype=torch.float32, device=dev),
    )
    _extension().int8_pass(
        x,
        x16,
        inv_scale,
        norm,
        head.fragments,
        head.scale,
        head.radius_coef,
        lists.best_lower,
        lists.stage_count,
        lists.stage_idx,
        lists.stage_upper,
        lists.count,
        lists.cand_idx,
        lists.cand_upper,
        BOUND_SLACK,
        NORM_INFLATION,
        config.tiles_per_warp,
        config.warps_per_block,
        config.stages,
        config.warps_per_sm,
        config.shared_activations,
        config.chunks_per_barrier,
        compact,
    )
    return lists


def int8_pass_cuda(
    x: torch.Tensor, head: CertifiedHead, *, max_survivors: int = 4096, config: CudaPassConfig | None = None
):
    """The CUDA INT8 pass: bounds and candidate lists, no rescoring.

    Args:
        x: [M, K] bf16 contiguous CUDA, M <= 32, K a multiple of 128; head: a :class:`CertifiedHead` with
            ``fragments``; max_survivors: candidate-list capacity per row; config: the partition.
    Returns:
        best_lower: [M] fp32; count: [M] int32, the rows whose upper bound reaches the final best lower
        bound (more than ``max_survivors`` where they overflow the list, the stage list overflowed or the
        row could not be scaled to fp16 exactly: the full head); cand_idx: [M, max_survivors] int32 and
        cand_upper: [M, max_survivors] fp32, the first ``count`` valid.
    """
    lists = run_cuda_pass(x, head, max_survivors=max_survivors, config=config, compact=True)
    return lists.best_lower, lists.count, lists.cand_idx, lists.cand_upper
