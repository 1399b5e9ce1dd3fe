"""The W12 format: constants, the in-memory tensor, layouts and statistics.

docs/w12-format.md is the written specification; this module is its single code definition.

Per output channel (row ``n`` of a ``[N, K]`` weight) a window of exponents ``base+1 .. base+15`` is
chosen (version 2: the window that stores the most of the row's weights; version 1: the window topped by the
row's largest exponent); a BF16 weight ``s eeeeeeee mmm nnnn`` inside it is stored as

* the **8-bit view** byte ``s | (e - base) << 3 | mmm`` (E4M3 bit order: sign, 4-bit exponent offset,
  top 3 mantissa bits), and
* a **low-mantissa nibble** ``nnnn``.

Offsets 0 (an E4M3 subnormal) and the code ``s.1111.111`` (E4M3 NaN) are never used for stored weights,
so the 8-bit view always reads as a normal FP8 E4M3 number times ``2**(base - 120)``. Weights outside
(zeros, denormals, Inf/NaN, exponents outside the window, and offset 15 with ``mmm = 111``) are
*escapes*: their exact 16 bits go to an escape list, and their view byte holds the nearest FP8-readable
code (``s.0000.000`` = ±0 below the window, ``s.1111.110`` = ±448 at the top) so the view stays a
usable Q-pass weight.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

FORMAT_VERSION = 2  # the window covering the most weights; the planes are laid out as in version 1
SUPPORTED_VERSIONS = frozenset({1, 2})  # both decode alike: a record's bases say where its windows are
CONVERT_COMMAND = "python -m specpilot_kernels.w12.convert CHECKPOINT.safetensors OUT.safetensors"

TILE_N = 128  # canonical record tile: 128 output channels x 64 input columns
TILE_K = 64
RECORD_BYTES = TILE_N * TILE_K + TILE_N * TILE_K // 2  # 8 KB of 8-bit view, then 4 KB of nibbles
STEP_K = 128  # the kernel layout pairs column c with c + 64 inside each 128-column step
BUCKET = 128  # escapes are bucketed by 128x128 blocks so a kernel program finds its own
MAX_OFFSET = 15
ESCAPE_LOW_BYTE = 0x00  # s.0000.000: E4M3 zero, for zeros, denormals and weights below the window
ESCAPE_HIGH_BYTE = 0x7E  # s.1111.110: E4M3 448, for Inf/NaN and the excluded s.1111.111 code
HEADER_BYTES = 64  # magic, version, N, K, escape count: counted in bits per weight


class W12Error(ValueError):
    """A W12 tensor that cannot be encoded, decoded or loaded, saying what, where and how to fix.

    The kernel library is vendored into the SGLang fork without ``specpilot_mem``, so it carries its
    own error type with the same ``what``/``where``/``fix`` fields as ``specpilot_mem.errors``.
    """

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        super().__init__(what)
        self.what, self.where, self.fix = what, where, fix

    def __str__(self) -> str:
        parts = [self.what]
        if self.where:
            parts.append(f"where: {self.where}")
        if self.fix:
            parts.append(f"fix: {self.fix}")
        return "; ".join(parts)


def padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass
class W12Tensor:
    """A BF16 ``[N, K]`` weight in W12 form (kernel layout; rows padded to 128, columns to 128).

    view     uint8 [Np, Kp]     8-bit view, row-major; reads as float8_e4m3fn without a copy
    nibbles  uint8 [Np, Kp//2]  low mantissa bits; in each 128-column step byte j holds column j
                                (low nibble) and column j + 64 (high nibble)
    base     uint8 [Np]         per-row window base: exponent = base + offset
    esc_ptr  int32 [Np//128 * Kp//128 + 1]  CSR pointers into the escape list, per 128x128 bucket
    esc_loc  int16 [E]          (row % 128) << 7 | (col % 128), sorted within each bucket
    esc_val  int16 [E]          the escaped weight's exact BF16 bits
    """

    shape: tuple[int, int]
    view: torch.Tensor
    nibbles: torch.Tensor
    base: torch.Tensor
    esc_ptr: torch.Tensor
    esc_loc: torch.Tensor
    esc_val: torch.Tensor
    version: int = FORMAT_VERSION

    @property
    def device(self) -> torch.device:
        return self.view.device

    @property
    def padded_shape(self) -> tuple[int, int]:
        return tuple(self.view.shape)

    @property
    def num_escapes(self) -> int:
        return int(self.esc_val.numel())

    def to(self, device) -> "W12Tensor":
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device)
        return W12Tensor(**moved)

    def nbytes(self) -> int:
        """Every stored byte: both planes (padding included), bases, escapes, pointers and header."""
        tensors = (self.view, self.nibbles, self.base, self.esc_ptr, self.esc_loc, self.esc_val)
        return HEADER_BYTES + sum(t.numel() * t.element_size() for t in tensors)

    def stats(self) -> dict:
        n, k = self.shape
        return {
            "shape": [n, k],
            "bits_per_weight": 8.0 * self.nbytes() / (n * k),
            "escapes": self.num_escapes,
            "escape_fraction": self.num_escapes / (n * k),
            "bytes": self.nbytes(),
        }


def nibbles_to_kernel_layout(nib: torch.Tensor) -> torch.Tensor:
    """uint8 [Np, Kp] (one nibble per byte) -> uint8 [Np, Kp//2] packed as the kernels read it."""
    np_, kp = nib.shape
    steps = nib.view(np_, kp // STEP_K, 2, STEP_K // 2)
    return (steps[:, :, 0, :] | (steps[:, :, 1, :] << 4)).reshape(np_, kp // 2)


def nibbles_from_kernel_layout(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`nibbles_to_kernel_layout`: one nibble per byte, uint8 [Np, Kp]."""
    np_, half = packed.shape
    steps = packed.view(np_, half // (STEP_K // 2), 1, STEP_K // 2)
    return torch.cat((steps & 0xF, steps >> 4), dim=2).reshape(np_, half * 2)


def escape_positions(w12: W12Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Global (row, column) int64 of every escape, in list order."""
    _, kp = w12.padded_shape
    buckets_k = kp // BUCKET
    counts = (w12.esc_ptr[1:] - w12.esc_ptr[:-1]).long()
    bucket = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
    loc = w12.esc_loc.long() & 0x3FFF
    rows = (bucket // buckets_k) * BUCKET + (loc >> 7)
    cols = (bucket % buckets_k) * BUCKET + (loc & 127)
    return rows, cols


def to_canonical(w12: W12Tensor) -> dict[str, torch.Tensor]:
    """The canonical on-disk form (safetensors-ready): one 12 KB record per 128x64 tile.

    records  uint8 [Np//128 * Kp//64, 12288]: tiles in row-major tile order; each record is the
             tile's 8-bit view (128 rows x 64 bytes, row-major) then its nibbles (128 rows x 32 bytes,
             byte j = column 2j in the low nibble, column 2j+1 in the high nibble)
    base     uint8 [Np]; escapes int64 [E, 2] (row, col) sorted row-major; escape_bits int16 [E]
    header   int64 [4]: format version, N, K, E
    """
    np_, kp = w12.padded_shape
    tiles = (np_ // TILE_N) * (kp // TILE_K)
    view = w12.view.view(np_ // TILE_N, TILE_N, kp // TILE_K, TILE_K).permute(0, 2, 1, 3)
    nib = nibbles_from_kernel_layout(w12.nibbles).view(np_ // TILE_N, TILE_N, kp // TILE_K, TILE_K // 2, 2)
    nib = (nib[..., 0] | (nib[..., 1] << 4)).permute(0, 2, 1, 3)
    records = torch.cat((view.reshape(tiles, -1), nib.reshape(tiles, -1)), dim=1).contiguous()
    rows, cols = escape_positions(w12)
    order = torch.argsort(rows * kp + cols)
    n, k = w12.shape
    return {
        "records": records,
        "base": w12.base.clone(),
        "escapes": torch.stack((rows[order], cols[order]), dim=1),
        "escape_bits": w12.esc_val[order].clone(),
        "header": torch.tensor([w12.version, n, k, w12.num_escapes], dtype=torch.int64),
    }


def _require(ok: bool, what: str, where: str, fix: str = "re-convert the BF16 checkpoint: " + CONVERT_COMMAND):
    if not ok:
        raise W12Error(what, where=where, fix=fix)


def from_canonical(tensors: dict[str, torch.Tensor], name: str = "w12") -> W12Tensor:
    """Rebuild the kernel-layout tensor from :func:`to_canonical`'s form, checking everything before using it.

    Refused with what, where and how to fix (:class:`W12Error`), the input left as it was: a missing or
    mistyped field, an unknown format version, records or bases of the wrong size, escape counts that
    disagree with the header, escape positions outside the tensor or repeated, bases above 239."""
    for field, dtype in (
        ("header", torch.int64),
        ("records", torch.uint8),
        ("base", torch.uint8),
        ("escapes", torch.int64),
        ("escape_bits", torch.int16),
    ):
        _require(
            field in tensors and isinstance(tensors[field], torch.Tensor) and tensors[field].dtype == dtype,
            f"W12 record {name}: field {field!r} is missing or not {dtype}",
            f"{name}.{field}",
        )
    header = tensors["header"]
    _require(
        header.shape == (4,),
        f"W12 record {name}: header has shape {tuple(header.shape)}, expected (4,)",
        f"{name}.header",
    )
    version, n, k, count = (int(v) for v in header.tolist())
    if version not in SUPPORTED_VERSIONS:
        raise W12Error(
            f"W12 record {name} has format version {version}; this code reads versions {sorted(SUPPORTED_VERSIONS)}",
            where=f"{name}.header[0]",
            fix="re-convert the BF16 checkpoint with this code: " + CONVERT_COMMAND,
        )
    _require(
        n > 0 and k > 0 and count >= 0,
        f"W12 record {name}: header shape ({n}, {k}) / {count} escapes is invalid",
        f"{name}.header",
    )
    np_, kp = padded(n, TILE_N), padded(k, STEP_K)
    records, base = tensors["records"], tensors["base"]
    tiles = (np_ // TILE_N) * (kp // TILE_K)
    _require(
        tuple(records.shape) == (tiles, RECORD_BYTES),
        f"W12 record {name}: records have shape {tuple(records.shape)}, the header's ({n}, {k}) needs "
        f"({tiles}, {RECORD_BYTES}) (12 KB per 128x64 tile)",
        f"{name}.records",
        "the file is truncated or the records belong to another tensor: " + CONVERT_COMMAND,
    )
    _require(
        tuple(base.shape) == (np_,),
        f"W12 record {name}: base has {base.numel()} entries, expected {np_}",
        f"{name}.base",
    )
    _require(
        int(base.max()) <= 254 - MAX_OFFSET if base.numel() else True,
        f"W12 record {name}: a window base is {int(base.max())}, above {254 - MAX_OFFSET}",
        f"{name}.base",
    )
    escapes, bits = tensors["escapes"], tensors["escape_bits"]
    _require(
        tuple(escapes.shape) == (count, 2) and tuple(bits.shape) == (count,),
        f"W12 record {name}: {tuple(escapes.shape)} escape positions and {bits.numel()} escape values, the "
        f"header says {count}",
        f"{name}.escapes",
    )
    if count:
        rows, cols = escapes[:, 0], escapes[:, 1]
        inside = (rows >= 0) & (rows < n) & (cols >= 0) & (cols < k)
        if not bool(inside.all()):
            bad = int(torch.nonzero(~inside)[0, 0])
            raise W12Error(
                f"W12 record {name}: escape {bad} at ({int(rows[bad])}, {int(cols[bad])}) is outside the "
                f"({n}, {k}) tensor",
                where=f"{name}.escapes[{bad}]",
                fix="the escape list is corrupt: " + CONVERT_COMMAND,
            )
        flat = rows * kp + cols
        _require(
            bool((flat[1:] > flat[:-1]).all()),
            f"W12 record {name}: escape positions are not strictly increasing (row-major, no repeats)",
            f"{name}.escapes",
            "the escape list is corrupt: " + CONVERT_COMMAND,
        )
    grid = (np_ // TILE_N, kp // TILE_K)
    view = records[:, : TILE_N * TILE_K].reshape(*grid, TILE_N, TILE_K).permute(0, 2, 1, 3).reshape(np_, kp)
    packed = records[:, TILE_N * TILE_K :].reshape(*grid, TILE_N, TILE_K // 2).permute(0, 2, 1, 3)
    nib = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(np_, kp)
    rows, cols = escapes[:, 0], escapes[:, 1]
    esc_ptr, esc_loc, esc_val = bucket_escapes(rows, cols, bits, np_, kp)
    return W12Tensor(
        (n, k),
        view.contiguous(),
        nibbles_to_kernel_layout(nib.contiguous()),
        base.clone(),
        esc_ptr,
        esc_loc,
        esc_val,
        version,
    )


def bucket_escapes(rows: torch.Tensor, cols: torch.Tensor, bits: torch.Tensor, np_: int, kp: int):
    """Sort escapes into 128x128 buckets: (esc_ptr int32, esc_loc int16, esc_val int16)."""
    buckets_k = kp // BUCKET
    bucket = (rows // BUCKET) * buckets_k + cols // BUCKET
    loc = (rows % BUCKET) * BUCKET + cols % BUCKET
    order = torch.argsort(bucket * (BUCKET * BUCKET) + loc)
    counts = torch.bincount(bucket, minlength=(np_ // BUCKET) * buckets_k)
    esc_ptr = torch.zeros(counts.numel() + 1, dtype=torch.int32, device=rows.device)
    esc_ptr[1:] = torch.cumsum(counts, 0).to(torch.int32)
    return esc_ptr, loc[order].to(torch.int16), bits[order].to(torch.int16)
