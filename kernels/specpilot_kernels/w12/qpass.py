"""The Q pass's GEMM in Triton: y = x @ Wq^T read from the W12 8-bit view alone, in the exact pass's own records.

The weights are the view plane of the :class:`W12MmaTensor` the exact CUDA kernels read (no copy): each 16-row tile
and 32-column block is 512 bytes, lane-major (``mma.py``), so the 64 bytes of lane group ``g`` hold rows ``g`` and
``g + 8`` of the tile, the row picked by bit 1 of the byte's place. A program loads those 64-byte runs as they lie
(16-byte vector loads), converts each view byte to the FP16 value of its E4M3 number (``cvt.rn.f16x2.e4m3x2``: two
weights an instruction, E4M3 zeros stay zero), puts the dropped mantissa bits at their midpoint with one FMA
(``v + (sign|exponent of v) / 16``: exact, and 0 for 0), and multiplies with a doubled activation tile whose column
``(p, m)`` holds token ``m``'s activations on the bytes of row half ``p`` and zeros elsewhere, so one MMA sums both
row halves without moving a weight. The row's window ``2**(base - 120)`` multiplies the fp32 sums (a power of two:
no rounding), so no per-weight exponent add and no zero test is needed.

Activations enter the FP16 MMA as FP16: every BF16 value of magnitude 2**-17 .. 65504 converts exactly (BF16 has 8
significant bits), smaller ones round (their products are below 2**-17 of the row's), larger ones are clamped to
+-65504 (the Q pass only proposes tokens; the exact pass decides them).

Determinism: the partition (tiles a program, 32-column blocks a step, K splits) comes from (N, K, GPU); splits are
summed in split order, never atomically; token rows only widen the MMA's N side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .format import W12Error, W12Tensor
from .gemm import _split_reduce_kernel, interpreting
from .mma import W12MmaTensor
from .reference import qpass_weight_reference

MAX_ROWS_PER_LAUNCH = 32  # the doubled activation tile is 2 x 32 columns wide
FP16_MAX = 65504.0
LOW_BITS = {"truncated": 1, "midpoint": 2}

# 4 view bytes ($2) -> 4 FP16 weights ($0, $1); midpoint adds sign|exponent / 16 (0x2C00 = 1/16 in FP16).
_QPASS_ASM = {
    1: "{ .reg .b16 lo, hi; mov.b32 {lo, hi}, $2; cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi; }",
    2: "{ .reg .b16 lo, hi; .reg .b32 e0, e1, c; mov.b32 {lo, hi}, $2; mov.b32 c, 0x2C002C00;"
       " cvt.rn.f16x2.e4m3x2 $0, lo; cvt.rn.f16x2.e4m3x2 $1, hi;"
       " and.b32 e0, $0, 0xFC00FC00; and.b32 e1, $1, 0xFC00FC00;"
       " fma.rn.f16x2 $0, e0, c, $0; fma.rn.f16x2 $1, e1, c, $1; }",
}
QPASS_ASM_TRUNCATED = tl.constexpr(_QPASS_ASM[1])
QPASS_ASM_MIDPOINT = tl.constexpr(_QPASS_ASM[2])


@dataclass(frozen=True)
class QpassConfig:
    tiles: int = 2  # 16-row tiles a program (16 x tiles rows; 8 x tiles runs of 64 bytes)
    blocks: int = 4  # 32-column blocks a K step (a 128-column chunk: 4)
    splits: int = 1  # K splits, summed in split order through a workspace
    num_warps: int = 4
    num_stages: int = 4
    use_asm: bool = True  # the PTX conversion (sm_89+); plain Triton integer ops otherwise (the interpreter's path)

    def effective_splits(self, kp: int) -> int:
        """The largest divisor of the step count not above ``splits``: splits of equal length."""
        steps = kp // (32 * self.blocks)
        return max(d for d in range(1, min(self.splits, steps) + 1) if steps % d == 0)


def default_qpass_config(n: int, k: int, sms: int) -> QpassConfig:
    """About four programs a multiprocessor: 32 rows a program, K split when the rows alone give too few."""
    programs = -(-n // 32)
    steps = -(-k // 128)
    splits = 1 if programs >= 4 * sms else max(1, min(steps // 8, -(-4 * sms // programs)))
    return QpassConfig(splits=splits)


def select_qpass_config(n: int, k: int, device: torch.device) -> QpassConfig:
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return default_qpass_config(n, k, sms)


@triton.jit
def _e4m3_to_f16(v, LOW: tl.constexpr):
    """Plain-op twin of the PTX: FP16 bits of the E4M3 byte (bias 7 -> 15), the midpoint bit 0x40 on non-zeros."""
    b = v.to(tl.int32)
    magnitude = b & 0x7F
    bits = (magnitude << 7) + (8 << 10)
    if LOW == 2:
        bits = bits | 0x40
    bits = tl.where(magnitude == 0, 0, bits) | ((b & 0x80) << 8)
    return bits.to(tl.int16).to(tl.float16, bitcast=True)


@triton.jit
def _qpass_kernel(
    x_ptr, view_ptr, base_ptr, out_ptr, M, N, K, BLOCKS_K, stride_xm, stride_out_split, stride_out_m,
    TILES: tl.constexpr, BLOCKS: tl.constexpr, M_PAD: tl.constexpr, STEPS: tl.constexpr, LOW: tl.constexpr,
    USE_ASM: tl.constexpr, PARTIAL: tl.constexpr, DOT_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    RUNS: tl.constexpr = 8 * TILES  # 64-byte runs: (tile, lane group g)
    WIDTH: tl.constexpr = 64 * BLOCKS  # bytes of a run's K step
    run = tl.arange(0, RUNS)
    tile = pid_n * TILES + run // 8
    g = run % 8
    j = tl.arange(0, WIDTH)
    block_of_j = j // 64
    within = j % 64
    # byte `within` of lane group g: lane t4 = within // 16, byte i = within % 16 = 8 step + 4 q + 2 p + h, the weight
    # at row g + 8 p, column 8 t4 + 4 step + 2 q + h of its 32-column block
    col_in_block = 8 * (within // 16) + 4 * ((within // 8) % 2) + 2 * ((within // 4) % 2) + within % 2
    half_of_j = (within // 2) % 2
    n2 = tl.arange(0, 2 * M_PAD)
    half_of_n2 = n2 // M_PAD
    m = n2 % M_PAD
    x_rows = x_ptr + m[None, :] * stride_xm
    x_keep = (half_of_j[:, None] == half_of_n2[None, :]) & (m < M)[None, :]
    runs = view_ptr + (tile[:, None].to(tl.int64) * BLOCKS_K * 512 + g[:, None] * 64 + within[None, :])
    acc = tl.zeros((RUNS, 2 * M_PAD), dtype=tl.float32)
    first_block = pid_s * STEPS * BLOCKS
    for step in range(STEPS):
        b0 = first_block + step * BLOCKS
        v = tl.load(runs + (b0 + block_of_j)[None, :] * 512, eviction_policy="evict_first")
        if USE_ASM:
            if LOW == 2:
                w = tl.inline_asm_elementwise(QPASS_ASM_MIDPOINT, "=r,=r,r", [v], dtype=tl.float16, is_pure=True,
                                              pack=4)
            else:
                w = tl.inline_asm_elementwise(QPASS_ASM_TRUNCATED, "=r,=r,r", [v], dtype=tl.float16, is_pure=True,
                                              pack=4)
        else:
            w = _e4m3_to_f16(v, LOW)
        col = (b0 + block_of_j) * 32 + col_in_block
        xv = tl.load(x_rows + col[:, None], mask=x_keep & (col < K)[:, None], other=0.0)
        xv = tl.minimum(tl.maximum(xv.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
        if DOT_FP32:
            acc = tl.dot(w.to(tl.float32), xv.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, xv, acc)
    rows = tile[:, None] * 16 + 8 * half_of_n2[None, :] + g[:, None]
    # the row's window: 2**(base - 120) as fp32 bits (biased exponent base + 7), exact
    scale = ((tl.load(base_ptr + rows).to(tl.int32) + 7) << 23).to(tl.float32, bitcast=True)
    acc = acc * scale
    out = out_ptr + pid_s * stride_out_split + m[None, :] * stride_out_m + rows
    mask = (m < M)[None, :] & (rows < N)
    if PARTIAL:
        tl.store(out, acc, mask=mask)
    else:
        tl.store(out, acc.to(tl.bfloat16), mask=mask)


def w12_qpass_gemm(x: torch.Tensor, mma: W12MmaTensor, low_bits: str = "midpoint", *,
                   config: QpassConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """The Q pass's product y = x @ Wq^T, Wq the 8-bit view of ``mma`` with the 4 dropped bits at their midpoint
    ("midpoint", 1000) or zero ("truncated"); reads the view plane only, where the exact kernels read it.

    Args:
        x: bf16 [M, K], unit column stride, on the weight's device (CUDA, or CPU under TRITON_INTERPRET=1).
        mma: W12MmaTensor of an N x K weight (``to_mma_layout(encode(w))``), the exact pass's weight itself.
        low_bits: "midpoint" or "truncated".
        config: the partition (default: from (N, K, GPU)), for tuning only.
        out: optional bf16 [M, N] contiguous output.

    Returns y bf16 [M, N]: fp32 sums of the FP16 products, each row times its window's power of two, rounded once.
    Example: ``y = w12_qpass_gemm(x, to_mma_layout(encode(w)))``, close to
    ``x.float() @ qpass_weight_reference(encode(w)).float().t()`` (:func:`qpass_gemm_reference`).
    """
    if low_bits not in LOW_BITS:
        raise W12Error(f"unknown Q-pass low_bits {low_bits!r}", where="w12_qpass_gemm(low_bits)",
                       fix="use 'midpoint' (the paper's choice) or 'truncated'")
    if not isinstance(mma, W12MmaTensor):
        raise W12Error(f"w12_qpass_gemm reads a W12MmaTensor (the exact kernels' records), got {type(mma).__name__}",
                       where="w12_qpass_gemm(mma)", fix="pass to_mma_layout(w12), the tensor the exact pass reads")
    n, k = mma.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.bfloat16 or x.stride(1) != 1 or x.device != mma.device:
        raise W12Error(f"w12_qpass_gemm needs x bf16 [M, {k}] with unit column stride on {mma.device}, got {x.dtype} "
                       f"{tuple(x.shape)} strides {tuple(x.stride())} on {x.device}", where="w12_qpass_gemm(x)",
                       fix="pass x.contiguous().to(torch.bfloat16) flattened to 2-D, on the weight's device")
    m = x.shape[0]
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return y
    config = config or select_qpass_config(n, k, x.device)
    np_, kp = mma.padded_shape
    if np_ % (16 * config.tiles):
        config = QpassConfig(1, config.blocks, config.splits, config.num_warps, config.num_stages, config.use_asm)
    splits = config.effective_splits(kp)
    steps = kp // (32 * config.blocks) // splits
    interp = interpreting()
    workspace = None
    if splits > 1:
        workspace = torch.empty(splits * min(m, MAX_ROWS_PER_LAUNCH) * n, dtype=torch.float32, device=x.device)
    grid = (np_ // (16 * config.tiles), splits)
    for r0 in range(0, m, MAX_ROWS_PER_LAUNCH):
        xm, ym = x[r0:r0 + MAX_ROWS_PER_LAUNCH], y[r0:r0 + MAX_ROWS_PER_LAUNCH]
        rows = xm.shape[0]
        target = workspace[: splits * rows * n].view(splits, rows, n) if workspace is not None else ym
        _qpass_kernel[grid](
            xm, mma.view, mma.base, target, rows, n, k, kp // 32, xm.stride(0),
            target.stride(0) if workspace is not None else 0, target.stride(-2),
            TILES=config.tiles, BLOCKS=config.blocks, M_PAD=max(8, triton.next_power_of_2(rows)), STEPS=steps,
            LOW=LOW_BITS[low_bits], USE_ASM=config.use_asm and not interp, PARTIAL=workspace is not None,
            DOT_FP32=interp, num_warps=config.num_warps, num_stages=config.num_stages,
        )
        if workspace is not None:
            total = rows * n
            _split_reduce_kernel[(triton.cdiv(total, 1024),)](target, ym, total, SPLITS=splits, BLOCK=1024)
    return y


def qpass_gemm_reference(x: torch.Tensor, w12: W12Tensor | W12MmaTensor, low_bits: str = "midpoint") -> torch.Tensor:
    """x [M, K] bf16 -> fp32 [M, N]: x times the Q-pass weights (``qpass_weight_reference``) in fp32, unrounded.

    For a W12MmaTensor the view plane is un-shuffled first (the same bytes)."""
    if isinstance(w12, W12MmaTensor):
        from .mma import planes_from_mma_layout

        view, _ = planes_from_mma_layout(w12)
        w12 = W12Tensor(w12.shape, view, torch.zeros(view.shape[0], view.shape[1] // 2, dtype=torch.uint8,
                                                     device=view.device), w12.base,
                        torch.zeros(1, dtype=torch.int32), torch.zeros(0, dtype=torch.int16),
                        torch.zeros(0, dtype=torch.int16))
    return x.float() @ qpass_weight_reference(w12, low_bits).float().t()


__all__ = ["QpassConfig", "default_qpass_config", "qpass_gemm_reference", "select_qpass_config",
           "w12_qpass_gemm"]
