"""The exact head's CUDA arithmetic (csrc/exact_head.cu): the full head and the rescoring of listed candidates.

One warp computes one logit in a fixed order (per lane: its 16-byte pieces l, l + 32, ... of the row, products
added one after another by FMA in FP32; then a xor butterfly over the 32 lanes; the pure-torch definition is
:func:`.reference.exact_head_warp_order`), the same device function in both kernels, so a rescored logit is
the full head's bits. The rescore takes every input row's listed
candidates over one persistent grid (each block an equal share of them, its input rows read once into shared
memory, a whole bf16 head row in flight per warp) and reduces each row's argmax
through a 64-bit atomic max of (logit, lowest index) in the same launch (its last block writes the tokens), so
the call is one kernel; on sm_90+ it is launched to overlap the kernel before it (programmatic dependent
launch: nothing is read before it waits for that kernel).
"""

from __future__ import annotations

import torch

from .cuda_pass import CudaPassConfig, PassLists, _extension, cuda_pass_available, run_cuda_pass
from .reference import CertifiedHead, warp_order_depth

RESCORE_BLOCKS_PER_SM = 0  # the kernel's own: 2 blocks of whole weight rows up to 16 rows, 3 of half rows above
# Listed pairs from which the compacting rescore first computes each row's incumbent (the exact logit of its listed row
# of largest upper bound) and rescores only the candidates whose upper bound reaches it; negative: never. H200, runs 31
# and 33 (paired rounds, incumbents always against never): 1.7-1.9 us less at 16 rows (~2,700 listed pairs), 4.4-7.8 us
# less at 32 (~6,800), but 0.7-1.7 us more at 8 rows (~1,300) and 3.6-5.1 us more at one row, where the few pairs are
# rescored at once anyway.
INCUMBENT_MIN_PAIRS = 2048


def default_exact_depth(weight: torch.Tensor) -> int:
    """The summation depth :func:`.reference.quantize_head` covers by default: the CUDA exact head's where it runs
    (a CUDA GPU on which the extension builds), else K (any order: the Triton exact head)."""
    k = weight.shape[1]
    if weight.is_cuda and k % 8 == 0 and cuda_pass_available():
        return warp_order_depth(k)
    return k


def overlaps_prior_launch(device: torch.device) -> bool:
    """Programmatic dependent launch needs sm_90+."""
    return torch.cuda.get_device_capability(device) >= (9, 0)


def exact_head_logits_cuda(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits [M, N] fp32 of x [M, K] bf16 against weight [N, K] bf16 (K a multiple of 8), CUDA arithmetic.
    A warp per head row, read through L1 once for all input rows."""
    logits = torch.empty((x.shape[0], weight.shape[0]), dtype=torch.float32, device=x.device)
    _extension().exact_head(x, weight, logits, False)
    return logits


_STATE: dict[tuple[int, int], torch.Tensor] = {}


def _rescore_state(x: torch.Tensor) -> torch.Tensor:
    """The rescore's keys, incumbents, barrier count and ticket (R, R, 1 and 1 int64, R >= M), zero between calls
    (each call leaves them zero): one per device and stream, so calls that may run at the same time never share it;
    grown to the largest row count seen."""
    key = (x.device.index, torch.cuda.current_stream(x.device).cuda_stream)
    state = _STATE.get(key)
    if state is None or state.numel() < 2 * x.shape[0] + 2:
        state = _STATE[key] = torch.zeros(2 * max(x.shape[0], 32) + 2, dtype=torch.int64, device=x.device)
    return state


def rescore_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    best_lower: torch.Tensor,
    count: torch.Tensor,
    cand_idx: torch.Tensor,
    cand_upper: torch.Tensor,
    *,
    blocks_per_sm: int = RESCORE_BLOCKS_PER_SM,
) -> torch.Tensor:
    """The exact head's argmax over each row's candidates that reach its best lower bound (one graphable launch).

    Args:
        x: [M, K] bf16; weight: [N, K] bf16; best_lower: [M] fp32; count: [M] int32 (above the list's capacity:
            the row's token is -1); cand_idx: [M, CAP] int32 and cand_upper: [M, CAP] fp32, the first count valid.
        blocks_per_sm: the persistent grid's 8-warp blocks per multiprocessor (tuning only; 0: 2 up to 16 rows, where
            a warp holds a whole weight row, 3 above, where it holds half a row at a time).
    Returns:
        tokens: [M] int64, lowest index on ties (INT32_MAX for a row with no candidate reaching its bound).
    """
    tokens = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    _extension().rescore(
        x,
        weight,
        best_lower,
        count,
        cand_idx,
        cand_upper,
        tokens,
        _rescore_state(x),
        blocks_per_sm,
        overlaps_prior_launch(x.device),
    )
    return tokens


def compact_and_rescore_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    lists: PassLists,
    *,
    blocks_per_sm: int = RESCORE_BLOCKS_PER_SM,
    incumbent_min_pairs: int = INCUMBENT_MIN_PAIRS,
) -> torch.Tensor:
    """The rescore of a CUDA pass run without its compaction launch (:func:`.cuda_pass.run_cuda_pass`, compact=False):
    one launch whose grid first compacts the stage lists into ``lists.count`` and the candidate lists, as the
    compaction launch would, meets (a grid barrier; the launch is cooperative, so all its blocks are resident at once,
    and where the runtime refuses that the compaction launch and the plain rescore run instead), then takes the
    exact head's argmax over them as :func:`rescore_cuda`. Launched to overlap the pass's end on sm_90+. Where the lists
    hold at least ``incumbent_min_pairs`` pairs (negative: never), it first computes each row's incumbent, the exact
    logit of its listed row of largest upper bound, and rescores only the candidates whose upper bound reaches it: the
    same tokens from far fewer head rows (22 instead of 213 per input row at 32 rows on the synthetic head).

    Args:
        x: [M, K] bf16; weight: [N, K] bf16; lists: the pass's lists (count zero, as the pass leaves it).
    Returns:
        tokens: [M] int64, as :func:`rescore_cuda`'s.
    """
    tokens = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    _extension().compact_and_rescore(
        x,
        weight,
        lists.best_lower,
        lists.stage_count,
        lists.stage_idx,
        lists.stage_upper,
        lists.count,
        lists.cand_idx,
        lists.cand_upper,
        tokens,
        _rescore_state(x),
        blocks_per_sm,
        incumbent_min_pairs,
        overlaps_prior_launch(x.device),
    )
    return tokens


def certified_tokens_cuda(
    x: torch.Tensor,
    head: CertifiedHead,
    *,
    max_survivors: int = 4096,
    config: CudaPassConfig | None = None,
    incumbent_min_pairs: int = INCUMBENT_MIN_PAIRS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The certified argmax through the CUDA pass and this arithmetic in three launches: the pass's prologue, the
    pass, and :func:`compact_and_rescore_cuda` (no compaction launch between them).

    Args:
        x: [M, K] bf16, M <= 32, K a multiple of 128; head: quantized with fragments; max_survivors: candidate-list
            capacity per row; config: the pass's partition; incumbent_min_pairs: as :func:`compact_and_rescore_cuda`'s.
    Returns:
        tokens: [M] int64 (-1 where the list overflowed or the row could not be scaled to fp16 exactly);
        count: [M] int32, the rows reaching the final best lower bound (the pass's count).
    """
    lists = run_cuda_pass(x, head, max_survivors=max_survivors, config=config, compact=False)
    return compact_and_rescore_cuda(x, head.weight, lists, incumbent_min_pairs=incumbent_min_pairs), lists.count
