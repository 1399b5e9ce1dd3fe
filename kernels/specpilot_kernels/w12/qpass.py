"""The Q pass's GEMM in Triton: y = x @ Wq^T read from the W12 8-bit view alone, in the exact pass's own records.

The weights are the view plane of the :class:`W12MmaTensor` the exact CUDA kernels read (no copy): each 16-row tile
and 32-column block is 512 bytes, lane-major (``mma.py``), so the 64 bytes of lane group ``g`` hold rows ``g`` and
``g + 8`` of the tile, the row picked by bit 1 of the byte's place. A program loads those 64-byte runs as they lie
(16-byte vector loads) and turns each view byte ``s eeee mmm`` into the BF16 number ``s | eeee mmm << 4``: the E4M3
value times 2**-120, a normal BF16 number for every stored weight and exactly 0 for the view's zero code, so one
multiply by 2**120 (an FMA with -0) gives the E4M3 value with no zero test; the midpoint adds
``(sign|exponent) / 16`` with one more FMA (exact, 0 for 0). The row's window ``2**(base - 120)`` multiplies the fp32
sums (a power of two: no rounding), so no per-weight exponent add is needed. Activations enter the BF16 MMA as they
are; every product is exact in fp32, as in the reference.

The two row halves of a run are separated in registers (reshape, permute, split: free, the loaded tile already lies
in the MMA operand's layout) and multiplied with the activations in their natural order.

Determinism: the partition (tiles a program, 32-column blocks a step, K splits) comes from (N, K, GPU); K splits
are summed in split order by the last program of a row block to finish (a counter says which), in the same launch;
token rows only widen the MMA's N side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .format import W12Error, W12Tensor
from .gemm import interpreting
from .mma import W12MmaTensor
from .reference import qpass_weight_reference

MAX_ROWS_PER_LAUNCH = 64  # token rows a launch (the MMA N side): a 32-node tree and its root fit one
LOW_BITS = {"truncated": 1, "midpoint": 2}


def _qpass_asm(midpoint: bool) -> str:
    """4 view bytes ($2) -> 4 BF16 weights ($0: bytes 0-1, $1: bytes 2-3). Per pair: prmt spreads two bytes into
    16-bit lanes [sign byte | view byte]; << 4 and a mask leave s | eeee mmm << 4 (s from the sign byte's copy); an
    FMA by 2**120 (0x7B80) with -0 rescales it; midpoint: + (w & sign|exponent) * 1/16 (0x3D80)."""
    lines = [
        "{",
        ".reg .b32 u, e, c, z, h;",
        "mov.b32 c, 0x7B807B80;",
        "mov.b32 z, 0x80008000;",
        "mov.b32 h, 0x3D803D80;",
    ]
    for out, sel in ((0, "0x9180"), (1, "0xB3A2")):
        lines += [
            f"prmt.b32 u, $2, 0, {sel};",
            "shl.b32 u, u, 4;",
            "and.b32 u, u, 0x87F087F0;",
            f"fma.rn.bf16x2 ${out}, u, c, z;",
        ]
        if midpoint:
            lines += [f"and.b32 e, ${out}, 0xFF80FF80;", f"fma.rn.bf16x2 ${out}, e, h, ${out};"]
    lines.append("}")
    return "\n".join(lines)


QPASS_ASM_TRUNCATED = tl.constexpr(_qpass_asm(False))
QPASS_ASM_MIDPOINT = tl.constexpr(_qpass_asm(True))


@dataclass(frozen=True)
class QpassConfig:
    tiles: int = 2  # 16-row tiles a program (16 x tiles rows; 8 x tiles runs of 64 bytes)
    blocks: int = 4  # 32-column blocks a K step (a 128-column chunk: 4)
    splits: int = 1  # K splits, summed in split order through a workspace
    num_warps: int | None = None  # default: a warp a 32 rows (each warp's MMAs own 16 runs of the tile)
    num_stages: int = 4
    use_asm: bool = True  # the PTX decode; plain Triton integer ops otherwise (the interpreter's path)

    def __post_init__(self):
        if self.tiles not in (2, 4, 8):
            raise W12Error(
                f"QpassConfig(tiles={self.tiles}): a program takes 2, 4 or 8 tiles of 16 rows (the MMA needs 16 runs)",
                where="QpassConfig.tiles",
                fix="use tiles=2, 4 or 8",
            )

    def effective_splits(self, kp: int) -> int:
        """The largest divisor of the step count not above ``splits``: splits of equal length."""
        steps = kp // (32 * self.blocks)
        return max(d for d in range(1, min(self.splits, steps) + 1) if steps % d == 0)


WARPS_PER_SM = 16  # the decode sets the pace per warp: a multiprocessor needs about this many warps to stream the view


def default_qpass_config(n: int, k: int, sms: int) -> QpassConfig:
    """64 rows (two warps) a program and 64-column steps in 3 stages (12 KB of shared memory, so many programs fit a
    multiprocessor), K split until about ``WARPS_PER_SM`` warps a multiprocessor stream the view, at least 4 steps a
    split."""
    tiles, blocks = 4, 2
    warps = -(-n // (16 * tiles)) * (tiles // 2)
    steps = -(-k // (32 * blocks))
    splits = max(1, min(steps // 4, -(-WARPS_PER_SM * sms // warps)))
    return QpassConfig(tiles=tiles, blocks=blocks, splits=splits, num_stages=3)


def select_qpass_config(n: int, k: int, device: torch.device) -> QpassConfig:
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return default_qpass_config(n, k, sms)


@triton.jit
def _view_to_bf16(v, LOW: tl.constexpr):
    """Plain-op twin of the PTX: BF16 bits of the E4M3 byte (bias 7 -> 127), the midpoint bit 0x8 on non-zeros."""
    b = v.to(tl.int32)
    magnitude = b & 0x7F
    bits = (magnitude << 4) + (120 << 7)
    if LOW == 2:
        bits = bits | 0x8
    bits = tl.where(magnitude == 0, 0, bits) | ((b & 0x80) << 8)
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _decode(v, LOW: tl.constexpr, USE_ASM: tl.constexpr):
    if USE_ASM:
        if LOW == 2:
            w = tl.inline_asm_elementwise(QPASS_ASM_MIDPOINT, "=r,=r,r", [v], dtype=tl.bfloat16, is_pure=True, pack=4)
        else:
            w = tl.inline_asm_elementwise(QPASS_ASM_TRUNCATED, "=r,=r,r", [v], dtype=tl.bfloat16, is_pure=True, pack=4)
    else:
        w = _view_to_bf16(v, LOW)
    return w


@triton.jit
def _qpass_kernel(
    x_ptr,
    view_ptr,
    base_ptr,
    out_ptr,
    work_ptr,
    count_ptr,
    M,
    N,
    K,
    BLOCKS_K,
    stride_xm,
    stride_out_m,
    TILES: tl.constexpr,
    BLOCKS: tl.constexpr,
    M_PAD: tl.constexpr,
    STEPS: tl.constexpr,
    SPLITS: tl.constexpr,
    LOW: tl.constexpr,
    USE_ASM: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    RUNS: tl.constexpr = 8 * TILES  # 64-byte runs: (tile, lane group g)
    WIDTH: tl.constexpr = 64 * BLOCKS  # bytes of a run's K step
    run = tl.arange(0, RUNS)
    tile = pid_n * TILES + run // 8
    g = run % 8
    j = tl.arange(0, WIDTH)
    within = j % 64
    runs = view_ptr + (tile[:, None].to(tl.int64) * BLOCKS_K * 512 + g[:, None] * 64 + within[None, :])
    first_block = pid_s * STEPS * BLOCKS
    # natural columns c of the step: block c // 32, then 8 t4 + 4 step + 2 q + h
    c = tl.arange(0, 32 * BLOCKS)
    ms = tl.arange(0, M_PAD)
    x_tile = x_ptr + ms[None, :] * stride_xm + c[:, None]
    acc0 = tl.zeros((RUNS, M_PAD), dtype=tl.float32)
    acc1 = tl.zeros((RUNS, M_PAD), dtype=tl.float32)
    for step in range(STEPS):
        b0 = first_block + step * BLOCKS
        v = tl.load(runs + (b0 + j // 64)[None, :] * 512, eviction_policy="evict_first")
        w = _decode(v, LOW, USE_ASM)
        # byte j = 64 b + 16 t4 + 8 step + 4 q + 2 p + h: move p last, then split it off (in registers: the loaded
        # tile already has the MMA operand's layout)
        w = tl.reshape(w, (RUNS, 16 * BLOCKS, 2, 2))
        w = tl.permute(w, (0, 1, 3, 2))
        w = tl.reshape(w, (RUNS, 32 * BLOCKS, 2))
        w0, w1 = tl.split(w)
        col = b0 * 32 + c
        xv = tl.load(x_tile + b0 * 32, mask=(ms < M)[None, :] & (col < K)[:, None], other=0.0)
        if DOT_FP32:
            acc0 = tl.dot(w0.to(tl.float32), xv.to(tl.float32), acc0, input_precision="ieee")
            acc1 = tl.dot(w1.to(tl.float32), xv.to(tl.float32), acc1, input_precision="ieee")
        else:
            acc0 = tl.dot(w0, xv, acc0)
            acc1 = tl.dot(w1, xv, acc1)
    acc = tl.reshape(tl.permute(tl.join(acc0, acc1), (0, 2, 1)), (RUNS, 2 * M_PAD))
    # acc column (p, m): row 16 tile + 8 p + g, token m
    n2 = tl.arange(0, 2 * M_PAD)
    m = n2 % M_PAD
    rows = tile[:, None] * 16 + 8 * (n2 // M_PAD)[None, :] + g[:, None]
    # the row's window: 2**(base - 120) as fp32 bits (biased exponent base + 7), exact
    scale = ((tl.load(base_ptr + rows).to(tl.int32) + 7) << 23).to(tl.float32, bitcast=True)
    acc = acc * scale
    out = out_ptr + m[None, :] * stride_out_m + rows
    mask = (m < M)[None, :] & (rows < N)
    if SPLITS == 1:
        tl.store(out, acc.to(tl.bfloat16), mask=mask)
    else:
        # K splits: each program leaves its sums in the workspace; the last of a row block to finish (a counter)
        # adds them in split order and resets the counter, so no second launch and no order that depends on timing
        slot = (pid_n * RUNS + tl.arange(0, RUNS))[:, None] * (2 * M_PAD) + n2[None, :]
        rows_in = (m < M)[None, :]  # only the token rows there are travel through the workspace
        tl.store(work_ptr + pid_s * (tl.num_programs(0) * RUNS * 2 * M_PAD) + slot, acc, mask=rows_in)
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel") == SPLITS - 1:
            total = tl.zeros((RUNS, 2 * M_PAD), dtype=tl.float32)
            for split in range(SPLITS):
                total += tl.load(
                    work_ptr + split * (tl.num_programs(0) * RUNS * 2 * M_PAD) + slot,
                    mask=rows_in,
                    other=0.0,
                    cache_modifier=".cg",
                )
            tl.store(out, total.to(tl.bfloat16), mask=mask)
            tl.atomic_xchg(count_ptr + pid_n, 0)


def w12_qpass_gemm(
    x: torch.Tensor,
    mma: W12MmaTensor,
    low_bits: str = "midpoint",
    *,
    config: QpassConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Q pass's product y = x @ Wq^T, Wq the 8-bit view of ``mma`` with the 4 dropped bits at their midpoint
    ("midpoint", 1000) or zero ("truncated"); reads the view plane only, where the exact kernels read it.

    Args:
        x: bf16 [M, K], unit column stride, on the weight's device (CUDA, or CPU under TRITON_INTERPRET=1).
        mma: W12MmaTensor of an N x K weight (``to_mma_layout(encode(w))``), the exact pass's weight itself.
        low_bits: "midpoint" or "truncated".
        config: the partition (default: from (N, K, GPU)), for tuning only.
        out: optional bf16 [M, N] contiguous output.

    Returns y bf16 [M, N]: fp32 sums of the exact products, each row times its window's power of two, rounded once.
    Example: ``y = w12_qpass_gemm(x, to_mma_layout(encode(w)))``, close to
    ``x.float() @ qpass_weight_reference(encode(w)).float().t()`` (:func:`qpass_gemm_reference`).
    """
    if low_bits not in LOW_BITS:
        raise W12Error(
            f"unknown Q-pass low_bits {low_bits!r}",
            where="w12_qpass_gemm(low_bits)",
            fix="use 'midpoint' (the paper's choice) or 'truncated'",
        )
    if not isinstance(mma, W12MmaTensor):
        raise W12Error(
            f"w12_qpass_gemm reads a W12MmaTensor (the exact kernels' records), got {type(mma).__name__}",
            where="w12_qpass_gemm(mma)",
            fix="pass to_mma_layout(w12), the tensor the exact pass reads",
        )
    n, k = mma.shape
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.bfloat16 or x.stride(1) != 1 or x.device != mma.device:
        raise W12Error(
            f"w12_qpass_gemm needs x bf16 [M, {k}] with unit column stride on {mma.device}, got {x.dtype} "
            f"{tuple(x.shape)} strides {tuple(x.stride())} on {x.device}",
            where="w12_qpass_gemm(x)",
            fix="pass x.contiguous().to(torch.bfloat16) flattened to 2-D, on the weight's device",
        )
    m = x.shape[0]
    y = out if out is not None else torch.empty(m, n, dtype=torch.bfloat16, device=x.device)
    if m == 0:
        return y
    config = config or select_qpass_config(n, k, x.device)
    np_, kp = mma.padded_shape
    splits = config.effective_splits(kp)
    steps = kp // (32 * config.blocks) // splits
    interp = interpreting()
    programs = np_ // (16 * config.tiles)
    work = counts = y
    if splits > 1:
        work = torch.empty(
            splits * programs * 8 * config.tiles * 2 * MAX_ROWS_PER_LAUNCH, dtype=torch.float32, device=x.device
        )
        counts = _counters(x.device, programs)
    for r0 in range(0, m, MAX_ROWS_PER_LAUNCH):
        xm, ym = x[r0 : r0 + MAX_ROWS_PER_LAUNCH], y[r0 : r0 + MAX_ROWS_PER_LAUNCH]
        rows = xm.shape[0]
        _qpass_kernel[(programs, splits)](
            xm,
            mma.view,
            mma.base,
            ym,
            work,
            counts,
            rows,
            n,
            k,
            kp // 32,
            xm.stride(0),
            ym.stride(0),
            TILES=config.tiles,
            BLOCKS=config.blocks,
            STEPS=steps,
            SPLITS=splits,
            M_PAD=max(16, triton.next_power_of_2(rows)),
            LOW=LOW_BITS[low_bits],
            USE_ASM=config.use_asm and not interp,
            DOT_FP32=interp,
            num_warps=config.num_warps or max(1, config.tiles // 2),
            num_stages=config.num_stages,
        )
    return y


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(device: torch.device, programs: int) -> torch.Tensor:
    """Zeroed int32 counters, one a row block, kept per device: every launch leaves them zero again. Launches that
    split K on one device must therefore not run concurrently (one stream, as the engines use it)."""
    have = _COUNTERS.get(device)
    if have is None or have.numel() < programs:
        have = torch.zeros(max(programs, 4096), dtype=torch.int32, device=device)
        _COUNTERS[device] = have
    return have


def qpass_gemm_reference(x: torch.Tensor, w12: W12Tensor | W12MmaTensor, low_bits: str = "midpoint") -> torch.Tensor:
    """x [M, K] bf16 -> fp32 [M, N]: x times the Q-pass weights (``qpass_weight_reference``) in fp32, unrounded.

    For a W12MmaTensor the view plane is un-shuffled first (the same bytes)."""
    if isinstance(w12, W12MmaTensor):
        from .mma import planes_from_mma_layout

        view, _ = planes_from_mma_layout(w12)
        w12 = W12Tensor(
            w12.shape,
            view,
            torch.zeros(view.shape[0], view.shape[1] // 2, dtype=torch.uint8, device=view.device),
            w12.base,
            torch.zeros(1, dtype=torch.int32),
            torch.zeros(0, dtype=torch.int16),
            torch.zeros(0, dtype=torch.int16),
        )
    return x.float() @ qpass_weight_reference(w12, low_bits).float().t()


__all__ = ["QpassConfig", "default_qpass_config", "qpass_gemm_reference", "select_qpass_config", "w12_qpass_gemm"]
