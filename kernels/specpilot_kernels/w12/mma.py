"""W12 GEMM in CUDA C++ (csrc/): mma.sync kernels (sm_80+, the sm_120 variant, also run on the H200) and, on sm_90a,
warpgroup-MMA kernels, for any row count.

mma.sync m16n8k16 exists on sm_80 and later, including sm_120 (no wgmma there). One kernel for 1-64 rows
(1, 2, 4 or 8 token tiles of 8): each warp holds its next chunk of weights in registers (or, up to 16 rows
where a shape's tuning says so, in a shared-memory double buffer) while it decodes and multiplies the
current one, and reads activations through L1. The weight planes are re-laid out
once (:func:`to_mma_layout`) so each lane reads its own MMA fragments: per 16-row tile and 32-column
block, lane l = 4g + t holds rows g and g+8 of both k16 steps, 16 view bytes and 8 nibble bytes (two
nibbles a byte, placed so that one byte permute joins each register's view bytes with their nibbles).
Inside each 32-column block the MMA's k order is permuted so that lane t's activations are columns
8t .. 8t+7 (one 16-byte load). On sm_90a a shape's config may run 9-64 rows as warpgroup MMAs instead (wgmma, the
decoded fragments as its register operand; a small kernel first writes the activations in the same permuted k order,
and each K class brings a chunk of them into shared memory with one bulk copy), and 33-256 rows through the wide
kernel (csrc/w12_wide.cu: up to 256 token rows a wgmma, every weight read once a launch, the K classes and splits of a
tile group reduced in one cluster): the same bits at every row count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import torch

from ..cuda_extension import load_cuda_extension
from .format import STEP_K, W12Error, W12Tensor, escape_positions, nibbles_from_kernel_layout

CSRC = Path(__file__).with_name("csrc")
SOURCES = (
    "binding.cpp",
    "w12_launch.cu",
    "w12_warp.cu",
    "w12_shared_x.cu",
    "w12_wgmma.cu",
    "w12_wide.cu",
    "w12_wide_ss.cu",
)
LOW_BITS_CODES = {"exact": 0, "truncated": 1, "midpoint": 2}
MAX_ROWS_PER_LAUNCH = 64  # eight token tiles of 8 (the per-warp and warpgroup kernels)
MAX_WIDE_ROWS = 256  # the wide kernel: two slabs of up to 128 token rows
# token tiles of 8 rows a slab the wide kernel is built for (wgmma N = 48 ... 256)
WIDE_TOKEN_TILES = (6, 8, 12, 16, 24, 32)
WIDE_BUCKETS = (64, 128, 256)  # the wide kernel's row ranges with a launch setting each: 33-64, 65-128, 129-256
MAX_WIDE_SLOTS = 6  # activation slots a wide block (csrc/w12_common.cuh kMaxWideSlots)
MAX_WIDE_STAGES = 6  # weight stages a wide warp (kMaxWideStages)
MAX_WIDE_GROUPS = 4  # warpgroups a wide block (16 warps)
MAX_DECODED_SLOTS = 3  # decoded-weight slots of the decoded-weight wide kernel (csrc/w12_wide_ss.cu kMaxDecodedSlots)
MAX_WARPS_PER_BLOCK = 16  # of the per-warp kernels (the warpgroup kernel: MAX_WGMMA_WARPS_PER_BLOCK)


def _fragment_index(device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) inside a 16x32 block of byte i (0..15) of lane l (0..31): two int64 [32, 16]."""
    lane = torch.arange(32, device=device)[:, None]
    i = torch.arange(16, device=device)[None, :]
    g, t = lane // 4, lane % 4
    step, reg, high = i // 8, (i % 8) // 2, i % 2
    rows = g + 8 * (reg % 2)
    # MMA k-slot 2t + high + 8 * (reg // 2) of this step is column 8t + 4 * step + 2 * (reg // 2) + high, so
    # lane t's activations for both steps are the 8 consecutive columns 8t .. 8t + 7 (one 16-byte load)
    cols = 8 * t + 4 * step + 2 * (reg // 2) + high
    return rows.expand(32, 16), cols


@dataclass
class W12MmaTensor:
    """A W12 weight in the mma.sync fragment layout (same bytes as :class:`W12Tensor`, reordered).

    view       uint8 [Np/16, Kp/32, 32, 16]  8-bit view bytes, lane-major fragments
    nibbles    uint8 [Np/16, Kp/32, 32, 8]   per lane two nibbles a byte (:func:`_pack_nibbles`)
    base       uint8 [Np]
    esc_tile   int32 [Np/16 + 1]             index of each 16-row tile's first escape entry
    esc_chunk  int32 [Np/16 * Kp/128]        per (tile, 128-column chunk): (first entry - the tile's) << 12 | count
    esc_entry  int32 [E]                     fragment position << 16 | exact BF16 bits (:func:`escape_entries`)
    """

    shape: tuple[int, int]
    padded_shape: tuple[int, int]
    view: torch.Tensor
    nibbles: torch.Tensor
    base: torch.Tensor
    esc_tile: torch.Tensor
    esc_chunk: torch.Tensor
    esc_entry: torch.Tensor
    # row regions' views (:meth:`rows`), made once: a GEMM with a tail asks for them on every call
    _row_views: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def device(self) -> torch.device:
        return self.view.device

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.view, self.nibbles, self.base, self.esc_tile, self.esc_chunk, self.esc_entry)
        )

    def rows(self, first: int, end: int) -> W12MmaTensor:
        """Rows ``first`` .. ``end`` of W (multiples of 16, or ``end`` = N): views of the planes, no copy. The escape
        offsets stay absolute, so the entries are shared whole."""
        if (first, end) in self._row_views:
            return self._row_views[first, end]
        n, k = self.shape
        if first % 16 or not 0 <= first < end <= n or (end % 16 and end != n):
            raise W12Error(
                f"rows {first}..{end} of a W12 weight with {n} rows: a region starts on a 16-row tile and "
                "ends on one or at N",
                where="W12MmaTensor.rows",
                fix="use multiples of 16",
            )
        t0, t1 = first // 16, -(-end // 16)
        chunks = self.padded_shape[1] // STEP_K
        region = W12MmaTensor(
            (end - first, k),
            (16 * (t1 - t0), self.padded_shape[1]),
            self.view[t0:t1],
            self.nibbles[t0:t1],
            self.base[first : 16 * t1],
            self.esc_tile[t0 : t1 + 1],
            self.esc_chunk[t0 * chunks : t1 * chunks],
            self.esc_entry,
        )
        self._row_views[first, end] = region
        return region


MAX_ESCAPES_PER_TILE = 1 << 20  # a chunk word's 20 bits of offset within the tile's entries


def escape_entries(rows: torch.Tensor, cols: torch.Tensor, bits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sort key int64, entry int32) of escapes at global (rows, cols) with exact BF16 bits: the entry is the weight's
    place in its chunk's fragments, position << 16 | bits, with position = group << 8 | lane << 3 | (register & 3) << 1
    | half (group = 2 x 32-column block + k16 step: one m16n8k16 A fragment), as csrc/w12_common.cuh patches it."""
    r, c = rows % 16, cols % STEP_K
    block, cc = c // 32, c % 32
    step, q, half = (cc >> 2) & 1, (cc >> 1) & 1, cc & 1
    lane = (r & 7) * 4 + ((cc >> 3) & 3)
    position = ((2 * block + step) << 8) | (lane << 3) | ((2 * q + (r >> 3)) << 1) | half
    return position, (position << 16) | (bits.to(torch.int64) & 0xFFFF)


def to_mma_layout(w12: W12Tensor) -> W12MmaTensor:
    """Re-lay a W12 tensor's planes and escapes for the mma.sync kernel (on the tensor's device)."""
    np_, kp = w12.padded_shape
    rows, cols = _fragment_index(w12.device)
    blocks = (np_ // 16, 16, kp // 32, 32)

    def fragments(plane: torch.Tensor) -> torch.Tensor:
        tiles = plane.view(*blocks).permute(0, 2, 1, 3)  # [T, B, 16, 32]
        return tiles[:, :, rows, cols]  # [T, B, 32, 16]

    view = fragments(w12.view).contiguous()
    nib = fragments(nibbles_from_kernel_layout(w12.nibbles))  # [T, B, 32, 16], one nibble per view byte
    nibbles = _pack_nibbles(nib)

    e_rows, e_cols = escape_positions(w12)
    tiles, chunks = np_ // 16, kp // STEP_K
    position, entry = escape_entries(e_rows, e_cols, w12.esc_val)
    bucket = (e_rows // 16) * chunks + e_cols // STEP_K
    order = torch.argsort(bucket * 2048 + position)  # by tile, chunk, then fragment position
    counts = torch.bincount(bucket, minlength=tiles * chunks).view(tiles, chunks)
    per_tile = counts.sum(1)
    if per_tile.numel() and int(per_tile.max()) >= MAX_ESCAPES_PER_TILE:
        raise W12Error(
            f"a 16-row tile has {int(per_tile.max())} escapes, more than the kernel layout's "
            f"{MAX_ESCAPES_PER_TILE - 1}",
            where="to_mma_layout",
            fix="keep this tensor in BF16",
        )
    esc_tile = torch.zeros(tiles + 1, dtype=torch.int64, device=w12.device)
    esc_tile[1:] = torch.cumsum(per_tile, 0)
    within = torch.cumsum(counts, 1) - counts  # each chunk's first entry relative to its tile's
    esc_chunk = ((within << 12) | counts).view(-1).to(torch.int32)
    return W12MmaTensor(
        w12.shape, (np_, kp), view, nibbles, w12.base, esc_tile.to(torch.int32), esc_chunk, entry[order].to(torch.int32)
    )


def _pack_nibbles(nib: torch.Tensor) -> torch.Tensor:
    """Nibbles of a lane's 16 view bytes -> its 8 nibble bytes: byte b (b < 4) holds view byte b's nibble high
    and view byte 4 + b's low; byte 4 + b holds view bytes 8 + b (high) and 12 + b (low). The kernel reads
    view word w's nibbles from nibble word w // 2, shifted left by 4 when w is odd, high halves."""
    nib = nib.to(torch.uint8)
    high = torch.cat((nib[..., 0:4], nib[..., 8:12]), dim=-1)
    low = torch.cat((nib[..., 4:8], nib[..., 12:16]), dim=-1)
    return ((high << 4) | low).contiguous()


def planes_from_mma_layout(mma: W12MmaTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of the fragment shuffle: (view uint8 [Np, Kp], one nibble per byte uint8 [Np, Kp])."""
    np_, kp = mma.padded_shape
    rows, cols = _fragment_index(mma.device)
    high, low = mma.nibbles >> 4, mma.nibbles & 0xF
    nib = torch.cat((high[..., 0:4], low[..., 0:4], high[..., 4:8], low[..., 4:8]), dim=-1)  # view byte order
    view = torch.empty(np_ // 16, kp // 32, 16, 32, dtype=torch.uint8, device=mma.device)
    low_plane = torch.empty_like(view)
    view[:, :, rows, cols] = mma.view
    low_plane[:, :, rows, cols] = nib
    unblock = lambda t: t.permute(0, 2, 1, 3).reshape(np_, kp)  # noqa: E731
    return unblock(view), unblock(low_plane)


# Step plans the kernel is built with for 17-32 and 33-64 rows (up to 16 rows: (4, 1)): (32-column blocks a warp
# decodes per step, a chunk or a half; 16-row tiles a warp, two sharing one activation load). Half steps hold
# fewer registers (more warps a multiprocessor) at more instructions; two tiles a warp halve the activation reads
# at twice the registers. No plan changes an output bit: every accumulator sums its blocks in the same order.
STEP_PLANS = {32: ((4, 1), (2, 1), (2, 2)), 64: ((4, 1), (2, 2))}
# Up to 16 rows a launch may instead stage each warp's next step of weights in a shared-memory double buffer
# (cp.async) rather than registers: the same bytes in flight in fewer registers, so more resident warps, at the price
# of the L1 left for the activations; each shape's tuned config says up to how many rows it stages (``staged_rows``).
MAX_STAGED_ROWS = 16
# At 17-32 rows, one tile a warp, sm_90+: the warps of a block may read their activations from a shared-memory ring
# filled once per block by a producer warp (bulk copies) instead of each warp loading 8 lines per token tile from
# L1. That pays on grids of one wave of blocks and costs on multi-wave ones, so it is per shape:
# ``shared_x_32`` = (tiles a block, ring slots).
MAX_SHARED_X_RING = 8
# sm_90a, 9-64 rows: warpgroup MMAs (wgmma: weights from registers, activations from shared memory), per row range
# (9-16, 17-32, 33-64) a number of warpgroups of 4 tiles a K class a block (0: per-warp mma.sync). 4-tile warpgroups
# make few blocks, which one-wave grids feel most, so it is per shape and row range.
MAX_WGMMA_WARPS_PER_BLOCK = 32
# sm_90a, 33-256 rows: the wide kernel, ``wide`` = (warpgroups a block, activation slots, weight stages a warp) at
# every row count, or ``wide_rows`` = one (warpgroups, slots, stages, largest slab in token tiles of 8 rows[, multicast])
# per WIDE_BUCKETS range; the launch picks the smallest built slab that holds the rows (one slab where the largest
# allows, so each weight is decoded once). Multicast (1, 2 or 4, one slab only): that many neighbouring tile groups
# form a cluster along x and share each activation copy. 0 warpgroups: 64 rows a launch of the kernels above.
# Row regions: a grid whose blocks run in rounds (all resident at once, all as long) and end a little way into a last
# round leaves most multiprocessors idle there: gate_up at 16 rows is 2.06 rounds of 16 warps a multiprocessor, so its
# last 64 tiles ran alone for ~13 of 80 us. A shape's partition may therefore give its last rows (``tail_rows``) a
# partition of their own with shorter K chains (more K classes or splits), launched right after the first region; the
# first region lets it start once all its blocks have waited for x, so the tail's blocks fill the multiprocessors the
# first region's last round leaves (programmatic dependent launch, sm_90+; elsewhere one after the other). Which
# partition sums a row is fixed by (N, K, GPU), so its bits are still the same at every row count.


@dataclass(frozen=True)
class MmaConfig:
    """A partition of the (16-row tile, 128-column chunk) work, fixed per (N, K, GPU), never by M, the step
    plans (:data:`STEP_PLANS`) used at 17-32 and 33-64 rows, up to how many rows weights are staged through
    shared memory (:data:`MAX_STAGED_ROWS`), whether 17-32 rows share activations (:data:`MAX_SHARED_X_RING`) and
    where warpgroup MMAs run instead of per-warp ones (:data:`MAX_WGMMA_WARPS_PER_BLOCK`)."""

    warps_n: int = 4  # warps on distinct tiles in a block
    warps_k: int = 1  # warps sharing one tile, reduced in warp order through shared memory
    splits: int = 1  # K splits, reduced in split order (in a cluster on sm_90+, else through a workspace)
    plan_32: tuple[int, int] = (4, 1)
    plan_64: tuple[int, int] = (4, 1)
    staged_rows: int = 0  # launches of up to this many rows stage the weights through shared memory
    shared_x_32: tuple[int, int] = (0, 0)  # 17-32 rows: (tiles a block, ring slots) of shared activations; 0: off
    # 9-16, 17-32 and 33-64 rows: warpgroups a K class a block of warpgroup MMAs (0: per-warp mma.sync)
    wgmma: tuple[int, int, int] = (0, 0, 0)
    # the last ``tail_rows`` rows of W as a second row region partitioned by ``tail`` = (warps_n, warps_k, splits),
    # everything else as above (row regions, above); 0: one region
    tail_rows: int = 0
    tail: tuple[int, int, int] = (0, 0, 0)
    # 33-256 rows (sm_90a): the wide kernel's (warpgroups a block, activation slots, weight stages); 0 warpgroups: off
    wide: tuple[int, int, int] = (1, 2, 3)
    # per WIDE_BUCKETS range (33-64, 65-128, 129-256): (warpgroups, slots, stages, largest slab in token tiles
    # [, multicast]); empty: ``wide`` everywhere with slabs of up to 16 token tiles, no multicast
    wide_rows: tuple = ()

    def __post_init__(self):
        if not 0 <= self.staged_rows <= MAX_STAGED_ROWS:
            raise W12Error(
                f"staged_rows={self.staged_rows}: the staged kernel is built for up to {MAX_STAGED_ROWS} rows",
                where="MmaConfig.staged_rows",
                fix=f"use 0 (never) to {MAX_STAGED_ROWS}",
            )
        for rows, built in STEP_PLANS.items():
            plan = tuple(getattr(self, f"plan_{rows}"))
            if plan not in built:
                raise W12Error(
                    f"step plan {plan} for up to {rows} rows is not built into the kernel",
                    where=f"MmaConfig.plan_{rows}",
                    fix=f"use one of {list(built)}",
                )
            object.__setattr__(self, f"plan_{rows}", plan)  # JSON lists become tuples
        object.__setattr__(self, "shared_x_32", tuple(self.shared_x_32))  # JSON lists become tuples
        object.__setattr__(self, "wgmma", tuple(self.wgmma))
        if len(self.wgmma) != 3 or any(g < 0 or 4 * g * self.warps_k > MAX_WGMMA_WARPS_PER_BLOCK for g in self.wgmma):
            raise W12Error(
                f"wgmma={self.wgmma} with warps_k={self.warps_k}: warpgroups a K class a block at 9-16, "
                f"17-32 and 33-64 rows, each 0 (off) or with 4 x warpgroups x warps_k <= {MAX_WGMMA_WARPS_PER_BLOCK}"
                " warps",
                where="MmaConfig.wgmma",
                fix="use e.g. (0, 0, 1) or fewer warpgroups",
            )
        object.__setattr__(self, "tail", tuple(self.tail))
        object.__setattr__(self, "wide", tuple(self.wide))
        groups, slots, stages = self.wide if len(self.wide) == 3 else (-1, 0, 0)
        if not _wide_setting_ok(groups, slots, stages, 16):
            raise W12Error(
                f"wide={self.wide}: (warpgroups a block 0-{MAX_WIDE_GROUPS}, activation slots 2-"
                f"{MAX_WIDE_SLOTS}, weight stages 2-{MAX_WIDE_STAGES})",
                where="MmaConfig.wide",
                fix="use e.g. (1, 2, 3), or (0, 2, 2) for off",
            )
        object.__setattr__(self, "wide_rows", tuple(tuple(w) for w in self.wide_rows))
        if self.wide_rows and (
            len(self.wide_rows) != len(WIDE_BUCKETS)
            or not all(len(w) in (4, 5, 6) and _wide_setting_ok(*w) for w in self.wide_rows)
        ):
            raise W12Error(
                f"wide_rows={self.wide_rows}: one (warpgroups 0-{MAX_WIDE_GROUPS}, slots 2-{MAX_WIDE_SLOTS}, "
                f"stages 2-{MAX_WIDE_STAGES}, largest slab in {WIDE_TOKEN_TILES} token tiles[, multicast 1, "
                f"2 or 4[, decoded 0 or 1: then multicast 1 and 2-{MAX_DECODED_SLOTS} stages]]) for each of 33-64, "
                "65-128 and 129-256 rows",
                where="MmaConfig.wide_rows",
                fix="e.g. ((4, 4, 2, 8), (4, 3, 2, 16), (2, 2, 2, 32)), or () for `wide` everywhere",
            )
        warps_n, warps_k, splits = self.tail if len(self.tail) == 3 else (-1, -1, -1)
        one_region = self.tail_rows == 0 and self.tail == (0, 0, 0)
        if not one_region and not (
            self.tail_rows > 0
            and self.tail_rows % 16 == 0
            and min(warps_n, warps_k, splits) >= 1
            and warps_n * warps_k <= MAX_WARPS_PER_BLOCK
        ):
            raise W12Error(
                f"tail_rows={self.tail_rows}, tail={self.tail}: a tail is a positive multiple of 16 rows with "
                f"a partition (warps_n, warps_k, splits) of at most {MAX_WARPS_PER_BLOCK} warps a block",
                where="MmaConfig.tail",
                fix="e.g. tail_rows=1024, tail=(1, 8, 1); or 0 and (0, 0, 0)",
            )
        tiles, ring = self.shared_x_32
        if ring and not (
            2 <= ring <= MAX_SHARED_X_RING
            and tiles >= 1
            and tiles * self.warps_k <= MAX_WARPS_PER_BLOCK
            and self.plan_32[1] == 1
        ):
            raise W12Error(
                f"shared_x_32={self.shared_x_32} with warps_k={self.warps_k}, plan_32={self.plan_32}: "
                "shared activations need 2-8 ring slots, at most 16 warps a block and one tile a warp",
                where="MmaConfig.shared_x_32",
                fix="use (0, 0) (off) or fewer tiles a block, or plan_32 (4, 1)",
            )

    @lru_cache(maxsize=256)  # noqa: B019 - configs are few, frozen and hashable; a GEMM with a tail asks every call
    def regions(self, n: int) -> tuple[tuple[int, int, MmaConfig], ...]:
        """[(first row, end row, partition)] of W's n rows: one region, or whole rounds and the tail. The tail keeps the
        step plans, staging and warpgroup choices (fewer warpgroups a block where its K classes need it), and reads its
        activations warp by warp (a shared ring's block was sized for the first region's K classes)."""
        if self.tail_rows == 0:
            return ((0, n, self),)
        split = n - self.tail_rows
        if split <= 0 or n % 16:
            raise W12Error(
                f"tail_rows={self.tail_rows} for N={n}: a tail leaves a first region of whole 16-row tiles",
                where="MmaConfig.tail_rows",
                fix="use fewer tail rows, or no tail where N % 16 != 0",
            )
        warps_n, warps_k, splits = self.tail
        wgmma = tuple(min(g, MAX_WGMMA_WARPS_PER_BLOCK // (4 * warps_k)) for g in self.wgmma)
        one = replace(self, tail_rows=0, tail=(0, 0, 0))
        return (
            (0, split, one),
            (split, n, replace(one, warps_n=warps_n, warps_k=warps_k, splits=splits, shared_x_32=(0, 0), wgmma=wgmma)),
        )

    def chunks_per_split(self, kp: int) -> int:
        chunks = kp // STEP_K
        return -(-chunks // min(self.splits, chunks))

    def step_plan(self, m: int) -> tuple[int, int]:
        """(blocks a step, tiles a warp) for a launch of ``m`` rows."""
        return (4, 1) if m <= 16 else self.plan_32 if m <= 32 else self.plan_64

    def stages_weights(self, m: int) -> bool:
        """Whether a launch of ``m`` rows stages the weights through shared memory (no bit depends on it)."""
        return m <= self.staged_rows

    def shares_activations(self, m: int) -> tuple[int, int]:
        """(tiles a block, ring slots) of a launch of ``m`` rows, (0, 0) without shared activations (no bit depends
        on it)."""
        return self.shared_x_32 if 16 < m <= 32 and self.shared_x_32[1] else (0, 0)

    def wide_launch(self, m: int) -> tuple[int, int, int, int, int]:
        """(warpgroups a block, activation slots, weight stages, largest slab in token tiles, multicast) of a wide
        launch of ``m`` rows (33-256); 0 warpgroups: the wide kernel is off there."""
        if self.wide_rows:
            setting = self.wide_rows[next(i for i, top in enumerate(WIDE_BUCKETS) if m <= top)]
            return (*setting, 1)[:5]
        return (*self.wide, 16, 1)

    def wide_decoded(self, m: int) -> bool:
        """Whether a wide launch of ``m`` rows runs the decoded-weight kernel (csrc/w12_wide_ss.cu: ``groups`` tile
        groups a block decoded once into shared memory, ``stages`` decoded slots) instead of csrc/w12_wide.cu."""
        if not self.wide_rows:
            return False
        setting = self.wide_rows[next(i for i, top in enumerate(WIDE_BUCKETS) if m <= top)]
        return len(setting) == 6 and setting[5] == 1

    def uses_wide(self, m: int, capability: tuple[int, int]) -> bool:
        """Whether a launch of ``m`` rows runs the wide kernel (33-256 rows on sm_90a; no bit depends on it)."""
        return 32 < m <= MAX_WIDE_ROWS and capability[0] == 9 and self.wide_launch(m)[0] > 0

    def warpgroups(self, m: int, capability: tuple[int, int]) -> int:
        """Warpgroups a K class a block of a launch of ``m`` rows with warpgroup MMAs on a GPU of this compute
        capability (sm_90 only), 0 without (no bit depends on it)."""
        if m <= 8 or capability[0] != 9:
            return 0
        return self.wgmma[0 if m <= 16 else 1 if m <= 32 else 2]


def default_mma_config(n: int, k: int, sms: int) -> MmaConfig:
    """A partition from N and the multiprocessor count alone, fitted to H200 sweeps of the 27B-class projections, LM
    head and 8B-class shapes. No K splits: up to 2 tiles of 16 rows per multiprocessor, 8 warps share a tile's K; up
    to 3, 5 warps; up to 8, 3 (640 tiles x 3 warps fill one wave of 132 multiprocessors); up to 20, 4; beyond, 4
    tiles of one warp a block. Step plans: grids of up to 8 tiles a multiprocessor step through half chunks at 17-32
    rows (the registers, not the tiles, limit their warps) and whole chunks at 33-64; larger grids take two tiles a
    warp in half steps at 17-64 rows (half the activation reads; they have warps to spare). ``mma_configs.json``
    holds the tuned ones."""
    tiles = -(-n // 16)
    if tiles <= 2 * sms:
        return MmaConfig(warps_n=1, warps_k=8, plan_32=(2, 1))
    if tiles <= 3 * sms:
        return MmaConfig(warps_n=1, warps_k=5, plan_32=(2, 1))
    if tiles <= 8 * sms:
        return MmaConfig(warps_n=1, warps_k=3, plan_32=(2, 1))
    if tiles <= 20 * sms:
        return MmaConfig(warps_n=1, warps_k=4, plan_32=(2, 2), plan_64=(2, 2))
    return MmaConfig(warps_n=4, warps_k=1, plan_32=(2, 2), plan_64=(2, 2))


TUNED_PATH = Path(__file__).with_name("mma_configs.json")


@lru_cache(maxsize=None)
def _tuned() -> dict:
    return json.loads(TUNED_PATH.read_text()) if TUNED_PATH.exists() else {}


def select_mma_config(n: int, k: int, device: torch.device) -> MmaConfig:
    """The partition for (N, K) on this GPU: tuned (``mma_configs.json``, keyed by the GPU's name) or default."""
    props = torch.cuda.get_device_properties(device)
    tuned = _tuned().get(props.name, {}).get(f"{n},{k}")
    return MmaConfig(**tuned) if tuned else default_mma_config(n, k, props.multi_processor_count)


def _wide_setting_ok(
    groups: int, slots: int, stages: int, slab_tiles: int, multicast: int = 1, decoded: int = 0
) -> bool:
    return groups == 0 or (
        1 <= groups <= MAX_WIDE_GROUPS
        and 2 <= slots <= MAX_WIDE_SLOTS
        and 2 <= stages <= MAX_WIDE_STAGES
        and slab_tiles in WIDE_TOKEN_TILES
        and multicast in (1, 2, 4)
        and decoded in (0, 1)
        and (decoded == 0 or (multicast == 1 and stages <= MAX_DECODED_SLOTS))
    )


def wide_token_tiles(m: int, largest: int = 16) -> tuple[int, int]:
    """(token tiles of 8 rows a slab, slabs) of a wide launch of ``m`` rows (33-256): as few slabs of at most
    ``largest`` token tiles as hold m, each the smallest built size that holds its share."""
    slabs = -(-m // (8 * largest))
    rows = -(-m // slabs)
    return next(t for t in WIDE_TOKEN_TILES if 8 * t >= rows), slabs


def w12_mma_gemm(
    x: torch.Tensor,
    mma: W12MmaTensor,
    *,
    config: MmaConfig | None = None,
    low_bits: str = "exact",
    out: torch.Tensor | None = None,
    overlap_prior: bool | None = None,
    launched: list[int] | None = None,
) -> torch.Tensor:
    """y = x @ W^T through the W12 CUDA kernels, for any number of rows.

    Args:
        x: bf16 [M, K] on CUDA, unit column stride (any M: up to 256 rows a launch on sm_90a, 64 elsewhere).
        mma: :func:`to_mma_layout` of the weight, N x K.
        config: the partition (default: ``select_mma_config`` from (N, K, GPU), never from M).
        low_bits: "exact" (the lossless weights) or the Q pass's "truncated" / "midpoint" 8-bit view: the view plane
            alone (and the escape list's zero codes) through the per-warp kernel, 64 rows a launch.
        out: optional bf16 [M, N] contiguous output.

    Returns y bf16 [M, N]. Example: ``y = w12_mma_gemm(x, to_mma_layout(encode(w)))``.

    ``overlap_prior`` (default: on sm_90 and later) launches the kernel so that its prologue, which reads only the
    weights, overlaps the tail of the kernel before it in the stream (programmatic dependent launch); it reads x
    and writes y only after that kernel has finished, so no bit depends on it. The weights are read before that
    wait: pass ``overlap_prior=False`` if the kernel just before wrote them (weights converted at load time, as
    everywhere in this project, are long done). A partition with a tail (row regions, above) launches twice a chunk of
    rows, the tail right behind the first region. ``launched``, when given, receives the warpgroups a block each
    launch ran (0: per-warp mma.sync; a warpgroup block that fits no multiprocessor runs with fewer, or per-warp).
    """
    n, k = mma.shape
    if not x.is_cuda or x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise W12Error(
            f"w12_mma_gemm needs CUDA bf16 x [M, {k}], got {x.dtype} {tuple(x.shape)} on {x.device}",
            where="w12_mma_gemm(x)",
            fix="pass a contiguous CUDA bf16 2-D input",
        )
    kp = mma.padded_shape[1]
    config = config or select_mma_config(n, k, x.device)
    if k != kp or x.stride(0) % 8 or x.data_ptr() % 16:  # the kernel reads Kp columns in 16-byte rows
        x = torch.nn.functional.pad(x, (0, kp - k))
    m_total = x.shape[0]
    y = out if out is not None else torch.empty(m_total, n, dtype=torch.bfloat16, device=x.device)
    ext = load_cuda_extension("specpilot_w12_mma", CSRC, SOURCES)
    capability = torch.cuda.get_device_capability(x.device)
    if overlap_prior is None:
        overlap_prior = capability >= (9, 0)
    code = LOW_BITS_CODES[low_bits]
    parts = config.regions(n)
    regions = [(first, end, part, mma.rows(first, end) if len(parts) > 1 else mma) for first, end, part in parts]
    # the workspace of K splits: [splits, rows, N] a region (a second region's may still be read by the first's sums)
    splits = [-(-(kp // STEP_K) // part.chunks_per_split(kp)) for _, _, part, _ in regions]
    r0 = 0
    while r0 < m_total:
        wide = code == 0 and m_total - r0 > 32 and config.uses_wide(min(m_total - r0, MAX_WIDE_ROWS), capability)
        rows = min(m_total - r0, MAX_WIDE_ROWS if wide else MAX_ROWS_PER_LAUNCH)
        xm, ym = x[r0 : r0 + rows], y[r0 : r0 + rows]
        if not (wide and _launch_wide(ext, xm, ym, regions, splits, kp, n, overlap_prior, code, launched)):
            for c0 in range(0, rows, MAX_ROWS_PER_LAUNCH):  # 64 rows a launch: the same bits
                _launch_rows(
                    ext,
                    xm[c0 : c0 + MAX_ROWS_PER_LAUNCH],
                    ym[c0 : c0 + MAX_ROWS_PER_LAUNCH],
                    regions,
                    splits,
                    kp,
                    n,
                    capability,
                    overlap_prior,
                    code,
                    launched,
                )
        r0 += rows
    return y


def _overlap(overlap_prior: bool, regions: int, index: int, writes_image: bool) -> int:
    """The W12Overlap code (csrc/w12_mma.cuh) of region ``index``'s launch: one region overlaps the kernel before; a
    first region lets the second start early, which reads x (or the image) without waiting, unless it must write the
    image itself: then it waits like any kernel."""
    if not overlap_prior:
        return 0
    return 1 if regions == 1 else 2 if index == 0 else 1 if writes_image else 3


def _launch_wide(ext, xm, ym, regions, splits, kp, n, overlap_prior, code, launched) -> bool:
    """One launch a region of the wide kernel for up to 256 rows; False (nothing left to trust) where its block fits
    no multiprocessor, so the caller runs the rows 64 at a time."""
    m = xm.shape[0]
    tiles8, slabs = wide_token_tiles(m, regions[0][2].wide_launch(m)[3])
    image = torch.empty(slabs * (kp // STEP_K) * tiles8 * 8 * STEP_K, dtype=torch.bfloat16, device=xm.device)
    workspace = torch.empty(sum(s for s in splits if s > 1) * m * n, dtype=torch.float32, device=xm.device)
    ran, offset = [], 0
    for index, ((first, end, part, weights), part_splits) in enumerate(zip(regions, splits)):
        partial = workspace[offset : offset + part_splits * m * n] if part_splits > 1 else workspace[:0]
        offset += partial.numel()
        groups, slots, stages, _, multicast = part.wide_launch(m)
        got = ext.w12_mma_gemm(
            xm,
            weights.view,
            weights.nibbles,
            weights.base,
            weights.esc_tile,
            weights.esc_chunk,
            weights.esc_entry,
            ym[:, first:end],
            partial,
            n,
            weights.padded_shape[0],
            kp,
            part.warps_n,
            part.warps_k,
            part.chunks_per_split(kp),
            4,
            1,
            0,
            0,
            0,
            0,
            image,
            int(index > 0),
            _overlap(overlap_prior, len(regions), index, False),
            code,
            groups,
            slots,
            stages,
            tiles8,
            multicast,
            int(part.wide_decoded(m)),
        )
        if got < 0:
            return False
        ran.append(got)
    if launched is not None:
        launched.extend(ran)
    return True


def _launch_rows(ext, xm, ym, regions, splits, kp, n, capability, overlap_prior, code, launched) -> None:
    """Up to 64 rows through the per-warp, shared-activation or warpgroup kernels, each region once."""
    m = xm.shape[0]
    workspace = torch.empty(sum(s for s in splits if s > 1) * m * n, dtype=torch.float32, device=xm.device)
    # warpgroup MMAs: every chunk's activations as wgmma's B image (token rows padded to 16, 32 or 64), written by
    # the first region's launch and read by both
    # the Q pass (code != 0) runs on the per-warp kernel alone (csrc/w12_warp.cu), never warpgroups or a shared ring
    wants_image = code == 0 and any(part.warpgroups(m, capability) for _, _, part, _ in regions)
    x_image = torch.empty(
        (kp // STEP_K) * max(16, 1 << (m - 1).bit_length()) * STEP_K if wants_image else 0,
        dtype=torch.bfloat16,
        device=xm.device,
    )
    image_written, offset = False, 0
    for index, ((first, end, part, weights), part_splits) in enumerate(zip(regions, splits)):
        partial = workspace[offset : offset + part_splits * m * n] if part_splits > 1 else workspace[:0]
        offset += partial.numel()
        warpgroups = part.warpgroups(m, capability) if code == 0 else 0  # in place of staged weights or a ring
        overlap = _overlap(overlap_prior, len(regions), index, bool(warpgroups) and not image_written)
        groups = ext.w12_mma_gemm(
            xm,
            weights.view,
            weights.nibbles,
            weights.base,
            weights.esc_tile,
            weights.esc_chunk,
            weights.esc_entry,
            ym[:, first:end],
            partial,
            n,
            weights.padded_shape[0],
            kp,
            part.warps_n,
            part.warps_k,
            part.chunks_per_split(kp),
            *part.step_plan(m),
            int(part.stages_weights(m) and not warpgroups and code == 0),  # Q: two register steps in flight
            *((0, 0) if warpgroups or code else part.shares_activations(m)),
            warpgroups,
            x_image,
            int(image_written),
            overlap,
            code,
            0,
            0,
            0,
            0,
            1,
            0,
        )
        image_written = image_written or groups > 0
        if launched is not None:
            launched.append(groups)
