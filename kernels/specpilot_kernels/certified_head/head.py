"""Certified LM head: the exact head's argmax at the cost of streaming an INT8 copy.

All launches capturable in a CUDA graph: the INT8 pass with bounds and candidate rows (the CUDA pass of
:mod:`.cuda_pass` with its prologue, or two resets and the Triton pass of :mod:`.int8_bound`), the exact
rescoring of the candidates that reach the final best lower bound, and the reduction to one token per
row (on CUDA GPUs one launch of :mod:`.exact_cuda`, else the Triton kernels of :mod:`.rescore`). The exact
head's arithmetic is the one of that rescore: the full head (:func:`exact_head_logits`) takes the same
one. A row whose candidates overflow
``max_survivors`` gets token -1 from the graphable part; :func:`certified_argmax` then recomputes those
rows with the full exact head (the one host synchronisation, only to look at the flag).
"""

from __future__ import annotations

import os

import torch
import triton

from .cuda_pass import CudaPassConfig, cuda_pass_available, int8_pass_cuda
from .exact_cuda import INCUMBENT_MIN_PAIRS, certified_tokens_cuda, exact_head_logits_cuda, rescore_cuda
from .int8_bound import _int8_bound_kernel
from .reference import BOUND_SLACK, NORM_INFLATION, CertifiedHead, warp_order_depth
from .rescore import (
    EXACT_BLOCK_S,
    EXACT_NUM_WARPS,
    K_MULTIPLE,
    _exact_head_kernel,
    exact_block_k,
    exact_k_splits,
    rescore,
)

MAX_ROWS = 32


def interpreting() -> bool:
    """Under the Triton interpreter bf16 dots are broken: kernels then take their FP32 path."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _check(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int]:
    if x.dim() != 2 or x.dtype != torch.bfloat16 or not x.is_contiguous():
        raise ValueError(f"x must be a contiguous [M, K] bf16 tensor, got {x.dtype} {tuple(x.shape)}")
    if x.shape[1] != weight.shape[1]:
        raise ValueError(f"x has K={x.shape[1]}, the head K={weight.shape[1]}")
    if x.shape[1] % K_MULTIPLE:
        raise ValueError(f"K={x.shape[1]} must be a multiple of {K_MULTIPLE}")
    return x.shape[0], x.shape[1]


def _check_rows(x: torch.Tensor, head: CertifiedHead) -> tuple[int, int]:
    M, K = _check(x, head.weight)
    if M > MAX_ROWS:
        raise ValueError(f"at most {MAX_ROWS} rows per call, got {M}")
    return M, K


def uses_cuda_exact(x: torch.Tensor, exact: str, k_splits: int | None) -> bool:
    """Which arithmetic the exact head and the rescore share. ``exact``: "cuda" (:mod:`.exact_cuda`: one warp a
    logit), "triton" (:mod:`.rescore`: MMA parts over ``k_splits`` K ranges), or "auto": CUDA where its extension
    runs, unless ``k_splits`` (the Triton order's parameter) is given."""
    if exact not in ("auto", "cuda", "triton"):
        raise ValueError(f"exact must be 'auto', 'cuda' or 'triton', got {exact!r}")
    if exact == "cuda" and k_splits is not None:
        raise ValueError("k_splits is the Triton exact head's summation order; the CUDA one has none")
    if exact == "auto":
        return k_splits is None and x.is_cuda and cuda_pass_available()
    return exact == "cuda"


def exact_head_logits(
    x: torch.Tensor, weight: torch.Tensor, *, k_splits: int | None = None, exact: str = "auto"
) -> torch.Tensor:
    """The exact head: logits [M, N] fp32 of x [M, K] bf16 against weight [N, K] bf16.

    Every logit is computed by the same arithmetic as the certified head's rescoring (bitwise) with the
    same ``exact`` and ``k_splits`` (:func:`uses_cuda_exact`; the Triton order's default is
    :func:`.rescore.exact_k_splits`: the summation order, not a tuning knob). The reference and fallback, not
    the fast path.
    """
    M, K = _check(x, weight)
    if uses_cuda_exact(x, exact, k_splits):
        return exact_head_logits_cuda(x, weight)
    N = weight.shape[0]
    out = torch.empty((M, N), dtype=torch.float32, device=x.device)
    _exact_head_kernel[(M, triton.cdiv(N, EXACT_BLOCK_S))](
        x,
        weight,
        out,
        N,
        out,
        K=K,
        SPLITS=k_splits or exact_k_splits(K),
        BS=EXACT_BLOCK_S,
        BLOCK_K=exact_block_k(K),
        DOT_FP32=interpreting(),
        GUARDED=False,
        num_warps=EXACT_NUM_WARPS,
    )
    return out


def uses_cuda_pass(x: torch.Tensor, head: CertifiedHead, backend: str) -> bool:
    """``backend``: "cuda" (the head must carry fragments), "triton", or "auto" (CUDA where it can run)."""
    if backend not in ("auto", "cuda", "triton"):
        raise ValueError(f"backend must be 'auto', 'cuda' or 'triton', got {backend!r}")
    if backend == "cuda" and head.fragments is None:
        raise ValueError("backend='cuda' needs a head quantized with fragments (quantize_head(weight, fragments=True))")
    if backend == "auto":
        return head.fragments is not None and x.is_cuda and cuda_pass_available()
    return backend == "cuda"


def int8_pass(
    x: torch.Tensor,
    head: CertifiedHead,
    *,
    max_survivors: int = 4096,
    backend: str = "auto",
    cuda_config: CudaPassConfig | None = None,
    block_n: int = 64,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 4,
):
    """The INT8 pass alone (its reset included): bounds and candidate lists, no rescoring.

    Args:
        x: [M, K] bf16, M <= 32; head: :func:`.reference.quantize_head` of the [N, K] bf16 head.
        max_survivors: candidate-list capacity per row; backend: "auto", "cuda" or "triton"
            (:func:`uses_cuda_pass`); cuda_config: the CUDA pass's partition; block_n, block_k, num_warps,
            num_stages: the Triton pass's tile.
    Returns:
        best_lower: [M] fp32, the best lower bound; count: [M] int32, rows appended to each list (above
        ``max_survivors``: the row takes the full head); cand_idx: [M, max_survivors] int32 and
        cand_upper: [M, max_survivors] fp32, the first ``count`` valid.
    """
    M, K = _check_rows(x, head)
    if uses_cuda_pass(x, head, backend):
        return int8_pass_cuda(x, head, max_survivors=max_survivors, config=cuda_config)
    N = head.vocab
    dev = x.device
    best_lower = torch.full((M,), float("-inf"), dtype=torch.float32, device=dev)
    count = torch.zeros(M, dtype=torch.int32, device=dev)
    cand_idx = torch.empty((M, max_survivors), dtype=torch.int32, device=dev)
    cand_upper = torch.empty((M, max_survivors), dtype=torch.float32, device=dev)
    _int8_bound_kernel[(triton.cdiv(N, block_n),)](
        x,
        head.qweight,
        head.scale,
        head.radius_coef,
        best_lower,
        count,
        cand_idx,
        cand_upper,
        M,
        N,
        K=K,
        CAP=max_survivors,
        SLACK=BOUND_SLACK,
        NORM_INFLATION=NORM_INFLATION,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        BLOCK_M=max(16, triton.next_power_of_2(M)),
        DOT_FP32=interpreting(),
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return best_lower, count, cand_idx, cand_upper


def certified_argmax_graphable(
    x: torch.Tensor,
    head: CertifiedHead,
    *,
    max_survivors: int = 4096,
    backend: str = "auto",
    cuda_config: CudaPassConfig | None = None,
    block_n: int = 64,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 4,
    rescore_programs: int = 64,
    k_splits: int | None = None,
    exact: str = "auto",
    incumbent_min_pairs: int = INCUMBENT_MIN_PAIRS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The certified argmax without host synchronisation (CUDA-graph capturable).

    Args:
        x: [M, K] bf16, M <= 32; head: :func:`.reference.quantize_head` of the [N, K] bf16 head.
        max_survivors: candidate-list capacity per row; beyond it the row's token is -1.
        backend, cuda_config: which INT8 pass and its partition (:func:`int8_pass`).
        block_n, block_k, num_warps, num_stages: the Triton INT8 pass's tile; rescore_programs: programs per row
            and K range sharing its candidate list in the Triton rescore (64 programs of 32-candidate blocks rescore
            the first 2048 candidates in one block each, so its serial chain is one block of K / k_splits long).
            Tuning only: the tokens do not depend on them. exact, k_splits: the exact head's arithmetic
            (:func:`uses_cuda_exact`; :func:`exact_head_logits` with the same values gives the logits whose
            argmax this is); the head's radius must cover its summation depth (``head.exact_depth``).
            incumbent_min_pairs: where the CUDA pass and exact head run, the listed pairs from which the rescore
            first settles each row's incumbent (:func:`.exact_cuda.compact_and_rescore_cuda`); tuning only.
    Returns:
        tokens: [M] int64 (the exact head's argmax, lowest index on ties; -1 where the list overflowed or
            the CUDA pass could not scale the row to fp16 exactly);
        candidates: [M] int32, rows appended to each candidate list (overflow when > max_survivors).
    """
    cuda_exact = uses_cuda_exact(x, exact, k_splits)
    depth = warp_order_depth(x.shape[1]) if cuda_exact else x.shape[1]
    if depth > head.max_exact_depth:  # the radius would not cover this exact head's float error
        raise ValueError(
            f"the head's radius covers exact heads whose sums pass through at most "
            f"{head.max_exact_depth} additions, the {'CUDA' if cuda_exact else 'Triton'} one takes "
            f"{depth}: quantize the head with exact_depth={depth} (or exact='cuda')"
        )
    if cuda_exact and uses_cuda_pass(x, head, backend):  # the rescore compacts the pass's lists: no launch between
        _check_rows(x, head)
        return certified_tokens_cuda(
            x, head, max_survivors=max_survivors, config=cuda_config, incumbent_min_pairs=incumbent_min_pairs
        )
    best_lower, count, cand_idx, cand_upper = int8_pass(
        x,
        head,
        max_survivors=max_survivors,
        backend=backend,
        cuda_config=cuda_config,
        block_n=block_n,
        block_k=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    if cuda_exact:
        tokens = rescore_cuda(x, head.weight, best_lower, count, cand_idx, cand_upper)
    else:
        tokens = rescore(
            x,
            head.weight,
            best_lower,
            count,
            cand_idx,
            cand_upper,
            programs=rescore_programs,
            dot_fp32=interpreting(),
            k_splits=k_splits,
        )
    return tokens, count


def certified_argmax(
    x: torch.Tensor, head: CertifiedHead, *, max_survivors: int = 4096, **tile
) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax of the exact head ``x @ head.weight.T`` (lowest index on ties), certified from the INT8 copy.

    x: [M, K] bf16 (M <= 32). Returns (tokens [M] int64, candidates [M] int32). Rows whose candidate
    list overflowed (or that the CUDA pass flagged) are recomputed with the full exact head (:func:`exact_head_logits`).
    """
    tokens, count = certified_argmax_graphable(x, head, max_survivors=max_survivors, **tile)
    overflow = count > max_survivors
    if bool(overflow.any()):
        rows = overflow.nonzero().squeeze(1)
        tokens[rows] = exact_head_logits(
            x[rows].contiguous(), head.weight, k_splits=tile.get("k_splits"), exact=tile.get("exact", "auto")
        ).argmax(1)
    return tokens, count


def certified_argmax_in_graph(
    x: torch.Tensor,
    head: CertifiedHead,
    fallback_logits: torch.Tensor,
    *,
    max_survivors: int = 4096,
    k_splits: int | None = None,
    **tile,
) -> torch.Tensor:
    """The certified argmax with its fallback inside the same launches (no host synchronisation at all).

    Args:
        x: [M, K] bf16, M <= 32; head: :func:`.reference.quantize_head` of the [N, K] bf16 head with
            ``exact_depth=K`` (the Triton exact head sums over all of K).
        fallback_logits: [M, N] fp32 scratch, preallocated once (e.g. ``torch.empty(32, N, device="cuda")``).
        max_survivors, tile: as :func:`certified_argmax_graphable` (its Triton exact head).
    Returns:
        tokens: [M] int64, the exact head's argmax (lowest index on ties). Rows whose survivor list overflowed
        are recomputed by the guarded full exact head, whose programs return at once for every other row.

    Example: ``tokens = certified_argmax_in_graph(h, quantize_head(w, exact_depth=w.shape[1]), scratch)``.
    """
    tokens, _ = certified_argmax_graphable(
        x, head, max_survivors=max_survivors, exact="triton", k_splits=k_splits, **tile
    )
    M, K = _check_rows(x, head)
    N = head.vocab
    if fallback_logits.shape[0] < M or fallback_logits.shape[1] != N or fallback_logits.dtype != torch.float32:
        raise ValueError(
            f"fallback_logits must be fp32 [>= {M}, {N}], got {fallback_logits.dtype} {tuple(fallback_logits.shape)}"
        )
    scratch = fallback_logits[:M]
    _exact_head_kernel[(M, triton.cdiv(N, EXACT_BLOCK_S))](
        x,
        head.weight,
        scratch,
        N,
        tokens,
        K=K,
        SPLITS=k_splits or exact_k_splits(K),
        BS=EXACT_BLOCK_S,
        BLOCK_K=exact_block_k(K),
        DOT_FP32=interpreting(),
        GUARDED=True,
        num_warps=EXACT_NUM_WARPS,
    )
    return torch.where(tokens < 0, scratch.argmax(1), tokens)
