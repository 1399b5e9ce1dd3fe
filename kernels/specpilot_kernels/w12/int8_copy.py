"""The INT8 Q-pass copy: a second, per-channel INT8 copy of a weight for GPUs where the 8-bit view cannot feed the
tensor cores well (no FP8 conversion: the paper's RTX PRO 6000 and DSpark deployments kept INT6/INT8 copies).

Unlike the 8-bit view it costs memory: N x K bytes plus a 4-byte scale a row on top of the W12 weight (8.0 more
bits a weight, 20 in all against the view's 12). ``weight[n, k] * scale[n]`` is the Q-pass weight, symmetric round
to nearest with ``scale = max |w[n]| / 127``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .format import W12Error
from .gemm import _split_reduce_kernel, interpreting

MAX_ROWS_PER_LAUNCH = 64


@dataclass
class Int8Copy:
    """weight int8 [N, K] row-major; scale fp32 [N]."""

    weight: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size() + self.scale.numel() * self.scale.element_size()


def int8_copy(weight: torch.Tensor) -> Int8Copy:
    """Per-channel symmetric INT8 copy of a BF16 ``[N, K]`` weight (same device). A row of zeros gets scale 1."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point():
        raise W12Error(
            f"int8_copy takes a 2-D floating-point weight, got {getattr(weight, 'shape', type(weight))}",
            where="int8_copy(weight)",
            fix="pass the linear layer's [out_features, in_features] weight",
        )
    w = weight.float()
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Copy(q.contiguous(), scale.contiguous())


def int8_weight_reference(copy: Int8Copy) -> torch.Tensor:
    """The Q-pass weight fp32 [N, K] the copy stands for."""
    return copy.weight.float() * copy.scale[:, None]


@triton.jit
def _int8_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_out_split,
    stride_out_m,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    M_PAD: tl.constexpr,
    STEPS: tl.constexpr,
    PARTIAL: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    ms = tl.arange(0, M_PAD)
    acc = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    k0 = pid_s * STEPS * BLOCK_K
    for step in range(STEPS):
        cols = k0 + step * BLOCK_K + ks
        w = tl.load(
            w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
            mask=(rows < N)[:, None] & (cols < K)[None, :],
            other=0,
            eviction_policy="evict_first",
        )
        xv = tl.load(
            x_ptr + ms[None, :] * stride_xm + cols[:, None], mask=(ms < M)[None, :] & (cols < K)[:, None], other=0.0
        )
        if DOT_FP32:
            acc = tl.dot(w.to(tl.float32), xv.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w.to(tl.bfloat16), xv, acc)  # |int8| <= 127 is exact in BF16
    acc = acc * tl.load(scale_ptr + rows, mask=rows < N, other=1.0)[:, None]
    out = out_ptr + pid_s * stride_out_split + ms[None, :] * stride_out_m + rows[:, None]
    mask = (ms < M)[None, :] & (rows < N)[:, None]
    if PARTIAL:
        tl.store(out, acc, mask=mask)
    else:
        tl.store(out, acc.to(tl.bfloat16), mask=mask)


def int8_qpass_gemm(
    x: torch.Tensor,
    copy: Int8Copy,
    *,
    block_n: int = 64,
    block_k: int = 128,
    splits: int | None = None,
    num_warps: int = 2,
    num_stages: int = 3,
) -> torch.Tensor:
    """y = x @ (weight * scale)^T from the INT8 copy, BF16 tensor-core MMA (INT8 values are exact in BF16), fp32 sums.

    Args:
        x: bf16 [M, K], unit column stride, on the copy's device (CUDA, or CPU under TRITON_INTERPRET=1).
        copy: :func:`int8_copy` of an N x K weight.
        block_n, block_k, splits, num_warps, num_stages: the partition (default splits: about 16 warps a
            multiprocessor).

    Returns y bf16 [M, N]. Example: ``y = int8_qpass_gemm(x, int8_copy(w))``.
    """
    n, k = copy.shape
    if (
        x.dim() != 2
        or x.shape[1] != k
        or x.dtype != torch.bfloat16
        or x.stride(1) != 1
        or x.device != copy.weight.device
    ):
        raise W12Error(
            f"int8_qpass_gemm needs x bf16 [M, {k}] on {copy.weight.device}, got {x.dtype} "
            f"{tuple(x.shape)} on {x.device}",
            where="int8_qpass_gemm(x)",
            fix="pass x.contiguous().to(torch.bfloat16) flattened to 2-D, on the copy's device",
        )
    m = x.shape[0]
    y = torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return y
    programs = -(-n // block_n)
    steps_total = -(-k // block_k)
    if splits is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4
        # as the view's Q pass: about 16 warps a multiprocessor, at least 4 steps a split
        splits = max(1, min(steps_total // 4, -(-16 * sms // (programs * num_warps))))
    splits = max(d for d in range(1, min(splits, steps_total) + 1) if steps_total % d == 0)
    steps = steps_total // splits
    workspace = (
        torch.empty(splits * min(m, MAX_ROWS_PER_LAUNCH) * n, dtype=torch.float32, device=x.device)
        if splits > 1
        else None
    )
    for r0 in range(0, m, MAX_ROWS_PER_LAUNCH):
        xm, ym = x[r0 : r0 + MAX_ROWS_PER_LAUNCH], y[r0 : r0 + MAX_ROWS_PER_LAUNCH]
        rows = xm.shape[0]
        target = workspace[: splits * rows * n].view(splits, rows, n) if workspace is not None else ym
        _int8_kernel[(programs, splits)](
            xm,
            copy.weight,
            copy.scale,
            target,
            rows,
            n,
            k,
            xm.stride(0),
            target.stride(0) if workspace is not None else 0,
            target.stride(-2),
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            M_PAD=max(16, triton.next_power_of_2(rows)),
            STEPS=steps,
            PARTIAL=workspace is not None,
            DOT_FP32=interpreting(),
            num_warps=num_warps,
            num_stages=num_stages,
        )
        if workspace is not None:
            _split_reduce_kernel[(triton.cdiv(rows * n, 1024),)](target, ym, rows * n, SPLITS=splits, BLOCK=1024)
    return y
