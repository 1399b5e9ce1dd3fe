"""The TLV Q pass on the FP8 tensor cores (CUDA, sm_89+): y = x @ Wq^T from the W12 8-bit view in place.

The view plane of a :class:`W12MmaTensor` is E4M3 bytes already (every stored weight's view byte is a normal E4M3
number, ``format.py``) laid out per lane as the BF16 kernels' fragments: per 16-row tile and 32-column block, lane
``4g + t`` holds rows ``g`` and ``g + 8`` at columns ``8t .. 8t + 7``, the rows alternating every two bytes. That is
the ``mma.m16n8k32`` E4M3 A fragment up to one byte permute a register (``csrc/w12_qpass_fp8.cu``), so the Q pass
feeds the view to the FP8 tensor cores with no copy and no decode; the BF16 Q mode of the exact kernels spends three
to five instructions a register decoding it and twice the MMAs. The price: the activations enter as E4M3 too,
quantized per token row (``scale = max |x| / 448``, round to nearest) by a small kernel that writes them in the
B fragments' order. The row window ``2**(base - 120)`` and the token's scale multiply the fp32 sums.

"midpoint" (the dropped mantissa bits at 1000, the paper's choice) adds ``(v & sign|exponent) / 16`` per weight: a
second MMA over the view bytes masked to sign and exponent, exact in the same arithmetic; "truncated" is the first
MMA alone. The Q-pass weights are therefore exactly ``qpass_weight_reference``'s; only the activations differ from
the BF16 Q pass. The Q pass only proposes (the exact pass alone accepts), so this can cost τ, never correctness.

Partition: a warp owns ``tiles_per_warp`` 16-row weight tiles (so each activation fragment it loads feeds that many
MMAs) and a range of K shared by ``warps_k`` warps, summed in warp order; chosen from (N, K, rows, GPU). A token
row's quantization and sums do not depend on the other rows' values, and a tile's sums depend on ``warps_k`` alone:
a row's bits are the same at every row count whose partition has the same ``warps_k``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from ..cuda_extension import cuda_extension_builds, load_cuda_extension
from .format import W12Error, W12Tensor
from .mma import W12MmaTensor
from .reference import qpass_weight_reference

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("w12_qpass_fp8.cu", "w12_qpass_fp8_f16.cu", "w12_qpass_fp8_wgmma.cu", "w12_qpass_fp8_binding.cpp")
EXTENSION = "specpilot_w12_qpass_fp8"
E4M3_MAX = 448.0
MAX_ROWS_PER_LAUNCH = 64  # 8 token tiles of 8 (csrc/w12_qpass_fp8.cuh kQpassFp8MaxRows)
MAX_WARPS_PER_BLOCK = 8  # kQpassFp8MaxWarps: up to 255 registers a thread
MAX_ACCUMULATORS = 20  # kQpassFp8MaxAccumulators: token tiles x weight tiles x MMAs a block a warp may accumulate
TILES_PER_WARP = (1, 2, 4)  # the built weight tiles a warp (4: E4M3 operands only)
# the MMAs' operands: E4M3 m16n8k32, both planes' bytes as f16 on m16n8k16, or f16 warpgroup MMAs (sm_90a: a warp
# one tile, a warpgroup four, the activations' f16 image in shared memory; csrc/w12_qpass_fp8_wgmma.cu)
OPERANDS = ("e4m3", "f16", "wgmma_f16")
OPERAND_CODES = {kind: code for code, kind in enumerate(OPERANDS)}  # csrc binding's `operands`
MAX_WARPGROUPS = 2  # kQpassWgmmaMaxGroups: warpgroups a block of the wgmma_f16 kind
WARPS_PER_SM = 16  # warps a multiprocessor the partition aims at: each keeps about 4 KB of view bytes in flight
MIN_PAIRS_PER_CLASS = 4  # 64-column pairs a K class at least: its partial sums stay a fraction of its weight bytes
BLOCK_WARPS = 4  # warps a block the default partition aims at
MAX_GROUPS = 1 << 16  # tile groups a launch (the split counters' length): 1M output rows at one tile a warp
LOW_BITS = ("midpoint", "truncated")


def built_token_tiles(m: int) -> int:
    """The kernel's token tiles of 8 rows for m rows (1, 2, 4, 5 or 8: csrc dispatch)."""
    tiles8 = -(-min(m, MAX_ROWS_PER_LAUNCH) // 8)
    return tiles8 if tiles8 <= 2 else 4 if tiles8 <= 4 else 5 if tiles8 <= 5 else 8


def tiles_per_warp_fits(m: int, tiles_per_warp: int, midpoint: bool, operands: str = "e4m3") -> bool:
    """Whether the kernel is built for ``tiles_per_warp`` at m rows (csrc qpass_fp8_tiles_per_warp_fits): the E4M3
    midpoint's second MMA doubles the accumulators, the f16 midpoint (a bit of the operand) does not; the wgmma_f16
    kind is one tile a warp at every row count."""
    if operands == "wgmma_f16":
        return tiles_per_warp == 1
    f16 = operands == "f16"
    mmas = 2 if midpoint and not f16 else 1
    built = TILES_PER_WARP[:2] if f16 else TILES_PER_WARP
    return tiles_per_warp in built and tiles_per_warp * built_token_tiles(m) * mmas <= MAX_ACCUMULATORS


@dataclass(frozen=True)
class Fp8QpassConfig:
    warps_k: int = 1  # warps of a block sharing a tile group's K, summed in warp order
    groups_per_block: int = 4  # tile groups a block
    tiles_per_warp: int = 1  # 16-row weight tiles a warp: each activation fragment feeds that many MMAs
    splits: int = 1  # blocks sharing a tile group's K (a workspace and the last block's sum in split order)
    operands: str = "e4m3"  # "e4m3" (m16n8k32), "f16" (both planes' bytes as f16, m16n8k16), "wgmma_f16" (sm_90a)

    def __post_init__(self):
        if self.operands not in OPERANDS:
            raise W12Error(
                f"Fp8QpassConfig(operands={self.operands!r}): the kernel is built for {OPERANDS}",
                where="Fp8QpassConfig",
                fix=f"use one of {OPERANDS}",
            )
        if self.splits < 1:
            raise W12Error(
                f"Fp8QpassConfig(splits={self.splits}): at least one block a tile group",
                where="Fp8QpassConfig",
                fix="use splits >= 1",
            )
        if min(self.warps_k, self.groups_per_block) < 1 or self.warps_k * self.groups_per_block > MAX_WARPS_PER_BLOCK:
            raise W12Error(
                f"Fp8QpassConfig(warps_k={self.warps_k}, groups_per_block={self.groups_per_block}): a block has "
                f"1-{MAX_WARPS_PER_BLOCK} warps",
                where="Fp8QpassConfig",
                fix=f"keep warps_k x groups_per_block <= {MAX_WARPS_PER_BLOCK}",
            )
        if self.operands == "wgmma_f16" and (
            self.warps_k != 1 or self.tiles_per_warp != 1 or self.groups_per_block > MAX_WARPGROUPS
        ):
            raise W12Error(
                f"Fp8QpassConfig(warps_k={self.warps_k}, tiles_per_warp={self.tiles_per_warp}, groups_per_block="
                f"{self.groups_per_block}, operands={self.operands!r}): a warpgroup is 4 tiles of one K range",
                where="Fp8QpassConfig",
                fix=f"use warps_k=1, tiles_per_warp=1, groups_per_block (warpgroups a block) 1-{MAX_WARPGROUPS}",
            )
        if self.tiles_per_warp not in TILES_PER_WARP:
            raise W12Error(
                f"Fp8QpassConfig(tiles_per_warp={self.tiles_per_warp}): the kernel is built for {TILES_PER_WARP}",
                where="Fp8QpassConfig",
                fix=f"use one of {TILES_PER_WARP}",
            )


def default_tiles_per_warp(m: int, midpoint: bool) -> int:
    """Two weight tiles a warp where the accumulators allow (one otherwise): each activation fragment then feeds two
    MMAs, and a warp keeps 4 KB of view in flight in 2 x 2 registers' steps. Four fill the registers (spills at 33+
    rows, and too few warps a multiprocessor); they pay only where a tuned table says so (the LM head at 33 rows)."""
    return 2 if tiles_per_warp_fits(m, 2, midpoint) else 1


def fp8_qpass_partition(n: int, k: int, sms: int, tiles_per_warp: int = 1) -> Fp8QpassConfig:
    """Enough warps to stream the view (about ``WARPS_PER_SM`` a multiprocessor): where tile groups are fewer, their
    K is shared by K classes of at least ``MIN_PAIRS_PER_CLASS`` pairs, up to 8 warps of a block and then more
    blocks. Small blocks (about ``BLOCK_WARPS``): a grid of whole blocks then spreads evenly over the
    multiprocessors."""
    groups, pairs = -(-n // (16 * tiles_per_warp)), -(-k // 128) * 2
    classes = max(1, min(-(-WARPS_PER_SM * sms // groups), pairs // MIN_PAIRS_PER_CLASS))
    splits = -(-classes // MAX_WARPS_PER_BLOCK)
    warps_k = -(-classes // splits)
    return Fp8QpassConfig(warps_k, max(1, BLOCK_WARPS // warps_k), tiles_per_warp, splits)


def default_fp8_qpass_config(n: int, k: int, sms: int, m: int = 1, midpoint: bool = True) -> Fp8QpassConfig:
    """The partition for m rows: ``default_tiles_per_warp`` weight tiles a warp, ``fp8_qpass_partition``'s K."""
    return fp8_qpass_partition(n, k, sms, default_tiles_per_warp(m, midpoint))


TUNED_PATH = Path(__file__).with_name("qpass_fp8_configs.json")


@lru_cache(maxsize=None)
def _tuned() -> dict:
    return json.loads(TUNED_PATH.read_text()) if TUNED_PATH.exists() else {}


def tuned_key(m: int, midpoint: bool) -> str:
    """A tuned partition's key under its (N, K): the mode and the kernel's token tiles ("truncated_5": 33-40 rows)."""
    return f"{'midpoint' if midpoint else 'truncated'}_{built_token_tiles(m)}"


def select_fp8_qpass_config(n: int, k: int, device: torch.device, m: int = 1, midpoint: bool = True) -> Fp8QpassConfig:
    """The partition for (N, K) at m rows on this GPU: tuned (``qpass_fp8_configs.json``, keyed by the GPU's name,
    then "N,K", then ``tuned_key``) or ``default_fp8_qpass_config``."""
    props = torch.cuda.get_device_properties(device)
    tuned = _tuned().get(props.name, {}).get(f"{n},{k}", {}).get(tuned_key(m, midpoint))
    if tuned:
        return Fp8QpassConfig(**tuned)
    return default_fp8_qpass_config(n, k, props.multi_processor_count, m, midpoint)


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device) -> torch.Tensor:
    """The device's split counters (int32 [MAX_GROUPS], zero): made once, outside any graph capture's first use
    (the first call of a captured function runs eagerly), and left zero by every launch."""
    device = torch.device(device)
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_GROUPS, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def fp8_qpass_available(device: torch.device | str) -> bool:
    """Whether the FP8 Q pass runs on ``device``: a CUDA GPU with FP8 tensor cores (sm_89+) on which it builds."""
    device = torch.device(device)
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return False
    return cuda_extension_builds(EXTENSION, CSRC, SOURCES, "the FP8 Q pass", "the BF16 Q mode")


def fp8_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The quantizer's numbers in torch: (float8_e4m3fn [M, K], fp32 scale [M]) with x ~ q * scale. Bit for bit the
    kernel's for bf16 x: ``inv = 448 / max|x|`` and ``scale = max|x| / 448`` (1 and 1 for a zero row), ``q = x * inv``
    rounded to nearest E4M3, saturated."""
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    nonzero = amax > 0
    top = torch.full_like(amax, E4M3_MAX)  # tensor / tensor: a true division on every device (a scalar divisor
    inv = torch.where(nonzero, top / amax, torch.ones_like(amax))  # becomes a multiply by its reciprocal on CUDA)
    scale = torch.where(nonzero, amax / top, torch.ones_like(amax))
    q = (xf * inv[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_qpass_linear_reference(x: torch.Tensor, qweight: torch.Tensor) -> torch.Tensor:
    """The FP8 Q pass's product with Q-pass weights ``qweight`` [N, K] (``qpass_weight_reference``'s values), in
    x's dtype: E4M3 activations times the weights with fp32 sums, times each row's scale. The same numbers as the
    kernel up to the order of the fp32 sums (an fp32 or bf16 x alike: the quantizer sees x as given)."""
    q, scale = fp8_rows_reference(x)
    y = F.linear(q.float(), qweight.float()) * scale[..., None]
    return y.to(x.dtype)


def fp8_qpass_reference(x: torch.Tensor, w12: W12Tensor, low_bits: str = "midpoint") -> torch.Tensor:
    """fp32 [M, N]: ``w12_fp8_qpass_gemm``'s numbers before the bf16 rounding, from a W12Tensor on any device."""
    q, scale = fp8_rows_reference(x)
    return (q.float() @ qpass_weight_reference(w12, low_bits).float().t()) * scale[:, None]


def w12_fp8_qpass_gemm(
    x: torch.Tensor,
    mma: W12MmaTensor,
    low_bits: str = "midpoint",
    *,
    config: Fp8QpassConfig | None = None,
    out: torch.Tensor | None = None,
    overlap_prior: bool | None = None,
) -> torch.Tensor:
    """The Q pass's y = x @ Wq^T on the FP8 tensor cores, Wq the 8-bit view of ``mma`` read in place.

    Args:
        x: bf16 [M, K] on CUDA (sm_89+), unit column stride, any M (64 rows a launch).
        mma: :func:`to_mma_layout` of the N x K weight: the exact pass's own records.
        low_bits: "midpoint" (the dropped bits at 1000) or "truncated" (at 0000).
        config: the partition (default from (N, K, rows, GPU)), for tuning only; its ``tiles_per_warp`` must be
            built for the launch's rows (``tiles_per_warp_fits``).
        out: optional bf16 [M, N] contiguous output.
        overlap_prior: launch the quantizer so that it overlaps the kernel before (sm_90+ default); the GEMM always
            overlaps the quantizer, prefetching its weights while the activations are made.

    Returns y bf16 [M, N]. Example: ``y = w12_fp8_qpass_gemm(x, to_mma_layout(encode(w)))``, close to
    ``fp8_qpass_reference(x, encode(w))``.
    """
    if low_bits not in LOW_BITS:
        raise W12Error(
            f"unknown Q-pass low_bits {low_bits!r}", where="w12_fp8_qpass_gemm(low_bits)", fix=f"use one of {LOW_BITS}"
        )
    if not isinstance(mma, W12MmaTensor):
        raise W12Error(
            f"w12_fp8_qpass_gemm reads a W12MmaTensor (the exact kernels' records), got {type(mma).__name__}",
            where="w12_fp8_qpass_gemm(mma)",
            fix="pass to_mma_layout(w12), the tensor the exact pass reads",
        )
    n, k = mma.shape
    if not x.is_cuda or x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise W12Error(
            f"w12_fp8_qpass_gemm needs CUDA bf16 x [M, {k}] with unit column stride, got {x.dtype} "
            f"{tuple(x.shape)} on {x.device}",
            where="w12_fp8_qpass_gemm(x)",
            fix="pass a contiguous CUDA bf16 2-D input",
        )
    kp = mma.padded_shape[1]
    if k % 8 or x.stride(0) % 8 or x.data_ptr() % 16:  # the quantizer reads 16-byte pieces of rows
        x = F.pad(x, (0, kp - k))
    m_total = x.shape[0]
    y = out if out is not None else torch.empty(m_total, n, dtype=torch.bfloat16, device=x.device)
    midpoint = low_bits == "midpoint"
    config = config or select_fp8_qpass_config(n, k, x.device, min(m_total, MAX_ROWS_PER_LAUNCH), midpoint)
    if not tiles_per_warp_fits(min(m_total, MAX_ROWS_PER_LAUNCH), config.tiles_per_warp, midpoint, config.operands):
        raise W12Error(
            f"{config} is not built for {m_total} rows ({low_bits}): its accumulators pass {MAX_ACCUMULATORS}",
            where="w12_fp8_qpass_gemm(config)",
            fix="use fewer tiles_per_warp (tiles_per_warp_fits) or leave config to the default",
        )
    wgmma = config.operands == "wgmma_f16"
    if wgmma and torch.cuda.get_device_capability(x.device) != (9, 0):
        raise W12Error(
            f"{config}: warpgroup MMAs run on sm_90 (Hopper) only, not on {torch.cuda.get_device_name(x.device)}",
            where="w12_fp8_qpass_gemm(config)",
            fix="use operands='e4m3' or 'f16' (or leave config to the default)",
        )
    ext = load_cuda_extension(EXTENSION, CSRC, SOURCES)
    groups = -(-mma.view.shape[0] // config.tiles_per_warp)
    if config.splits > 1 and groups > MAX_GROUPS:
        raise W12Error(
            f"{config} has {groups} tile groups, more than the {MAX_GROUPS} split counters",
            where="w12_fp8_qpass_gemm(config)",
            fix="use splits=1 (many groups fill the GPU without splitting K) or more tiles_per_warp",
        )
    counters = split_counters(x.device) if config.splits > 1 else None
    pdl = torch.cuda.get_device_capability(x.device) >= (9, 0)
    overlap = pdl if overlap_prior is None else overlap_prior and pdl
    for r0 in range(0, m_total, MAX_ROWS_PER_LAUNCH):
        xm, ym = x[r0 : r0 + MAX_ROWS_PER_LAUNCH], y[r0 : r0 + MAX_ROWS_PER_LAUNCH]
        rows = xm.shape[0]
        token_tiles = built_token_tiles(rows) if wgmma else -(-rows // 8)
        image = torch.empty(token_tiles * 8 * kp * (2 if wgmma else 1), dtype=torch.uint8, device=x.device)
        scale = torch.empty(rows, dtype=torch.float32, device=x.device)
        if wgmma:  # the warpgroup kernel's f16 B image: its token tiles, rows past M zero
            ext.quantize_rows_wgmma(xm, image, scale, kp, token_tiles, overlap)
        else:
            ext.quantize_rows(xm, image, scale, kp, overlap)
        sums = config.tiles_per_warp * built_token_tiles(rows) * 4 * 32  # fp32 partials a group and split
        workspace = torch.empty(groups * config.splits * sums if counters is not None else 0, device=x.device)
        ext.gemm_rows(mma.view, mma.base, image, scale, ym, n, config.warps_k, config.tiles_per_warp,
                      config.groups_per_block, config.splits, workspace,
                      counters if counters is not None else workspace, OPERAND_CODES[config.operands], midpoint,
                      pdl)  # fmt: skip
    return y


__all__ = [
    "Fp8QpassConfig",
    "default_fp8_qpass_config",
    "fp8_qpass_available",
    "fp8_qpass_linear_reference",
    "fp8_qpass_partition",
    "fp8_qpass_reference",
    "fp8_rows_reference",
    "tiles_per_warp_fits",
    "tuned_key",
    "w12_fp8_qpass_gemm",
]
