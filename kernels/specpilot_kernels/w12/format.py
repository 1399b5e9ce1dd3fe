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

FORMAT_VERSION = 3  # version 2's window in one compact byte record (planes unpadded, bases and escapes packed)
SUPPORTED_VERSIONS = frozenset({1, 2, 3})  # all decode alike: a record's bases say where its windows are
TILE_RECORD_VERSIONS = frozenset({1, 2})  # the versions stored as 12 KB tile records plus side tensors
CONVERT_COMMAND = "python -m specpilot_kernels.w12.convert CHECKPOINT.safetensors OUT.safetensors"

TILE_N = 128  # canonical record tile: 128 output channels x 64 input columns
TILE_K = 64
RECORD_BYTES = TILE_N * TILE_K + TILE_N * TILE_K // 2  # 8 KB of 8-bit view, then 4 KB of nibbles
STEP_K = 128  # the kernel layout pairs column c with c + 64 inside each 128-column step
BUCKET = 128  # escapes are bucketed by 128x128 blocks so a kernel program finds its own
MAX_OFFSET = 15
ESCAPE_LOW_BYTE = 0x00  # s.0000.000: E4M3 zero, for zeros, denormals and weights below the window
ESCAPE_HIGH_BYTE = 0x7E  # s.1111.110: E4M3 448, for Inf/NaN and the excluded s.1111.111 code
HEADER_BYTES = 64  # the in-memory tensor's shape, version and escape count, counted in its memory size
RECORD_MAGIC = 0x52323157  # b"W12R" read as a little-endian int32: the first word of a version 3 record
RECORD_HEADER_WORDS = 8  # int32: magic, version, N, K, base0 | width << 8, base exceptions, escapes, gap bytes
RECORD_HEADER_BYTES = 4 * RECORD_HEADER_WORDS
MAX_BASE = 254 - MAX_OFFSET  # base + 15 <= 254: the decode's add never carries into the sign


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
        """Bytes held in memory in this (kernel) layout: both planes (padding included), bases, escapes, pointers
        and header. What a GEMM reads; the stored record (:meth:`stored_nbytes`) is smaller."""
        tensors = (self.view, self.nibbles, self.base, self.esc_ptr, self.esc_loc, self.esc_val)
        return HEADER_BYTES + sum(t.numel() * t.element_size() for t in tensors)

    def stored_nbytes(self) -> int:
        """Bytes of the version 3 record :func:`to_canonical` writes (every byte on disk)."""
        return sum(record_sections(self).values())

    def stats(self) -> dict:
        """bits_per_weight: the stored record's; memory_bits_per_weight: this kernel layout's (what the GEMM
        reads, and what :func:`~specpilot_kernels.w12.codec.encode_or_keep` judges)."""
        n, k = self.shape
        sections = record_sections(self)
        stored = sum(sections.values())
        return {
            "shape": [n, k],
            "bits_per_weight": 8.0 * stored / (n * k),
            "memory_bits_per_weight": 8.0 * self.nbytes() / (n * k),
            "escapes": self.num_escapes,
            "escape_fraction": self.num_escapes / (n * k),
            "bytes": stored,
            "memory_bytes": self.nbytes(),
            "record_bytes": sections,
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


def to_tile_records(w12: W12Tensor) -> dict[str, torch.Tensor]:
    """Format versions 1 and 2's on-disk form (safetensors-ready): one 12 KB record per 128x64 tile.

    Kept so that checkpoints written before version 3 can be re-created and their reader tested;
    :func:`to_canonical` writes version 3.

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
        "header": torch.tensor([min(w12.version, 2), n, k, w12.num_escapes], dtype=torch.int64),  # v3 = v2's window
    }


def _require(ok: bool, what: str, where: str, fix: str = "re-convert the BF16 checkpoint: " + CONVERT_COMMAND):
    if not ok:
        raise W12Error(what, where=where, fix=fix)


def _from_tile_records(tensors: dict[str, torch.Tensor], name: str) -> W12Tensor:
    """Rebuild the kernel-layout tensor from :func:`to_tile_records`'s form, checking everything before using it.

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
    if version not in TILE_RECORD_VERSIONS:
        raise W12Error(
            f"W12 record {name} has format version {version} in tile records; this code reads tile records of "
            f"versions {sorted(TILE_RECORD_VERSIONS)} (version 3 is one byte record, {name}.record)",
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
        int(base.max()) <= MAX_BASE if base.numel() else True,
        f"W12 record {name}: a window base is {int(base.max())}, above {MAX_BASE}",
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


# Version 3: one uint8 record per tensor, every byte counted in bits per weight (docs/w12-format.md):
#   header   int32 [8], little-endian: RECORD_MAGIC, 3, N, K, base0 | width << 8, base exceptions X, escapes E,
#            escape-gap bytes G
#   view     N * K bytes, row-major, unpadded
#   nibbles  ceil(N * K / 2) bytes: weight i (row-major) in byte i // 2, low nibble when i is even
#   base     ceil(N * width / 8) bytes: per row a width-bit code (little-endian bit stream), base = base0 + code;
#            the code 2**width - 1 marks a row whose base is the next byte of the exception list
#   base exceptions  X bytes, in row order
#   escape bits      E int16, the exact BF16 bits, in row-major position order
#   escape gaps      G bytes: per escape the distance from the previous one less 1 (the first: its position),
#                    LEB128 (7 bits a byte, high bit set on all but the last byte)
# The loader pads the planes and buckets the escapes into the kernel layout; padding is never stored.
MAX_GAP_BYTES = 9  # 63 bits: every row-major position of an int64-indexed tensor


def _pack_codes(codes: torch.Tensor, width: int) -> torch.Tensor:
    """uint8 bit stream of width-bit codes: bit j of code i is bit i * width + j of the stream."""
    if width == 0 or codes.numel() == 0:
        return torch.zeros(0, dtype=torch.uint8, device=codes.device)
    bits = (codes.long()[:, None] >> torch.arange(width, device=codes.device)) & 1
    bits = torch.nn.functional.pad(bits.reshape(-1), (0, -bits.numel() % 8))
    return (bits.view(-1, 8) << torch.arange(8, device=codes.device)).sum(1).to(torch.uint8)


def _unpack_codes(stream: torch.Tensor, width: int, count: int) -> torch.Tensor:
    bits = (stream.long()[:, None] >> torch.arange(8, device=stream.device)) & 1
    bits = bits.reshape(-1)[: count * width].view(count, width)
    return (bits << torch.arange(width, device=stream.device)).sum(1)


def choose_base_code(base: torch.Tensor) -> tuple[int, int]:
    """(base0, width) of the smallest base stream for the row bases uint8 [N]: ceil(N * width / 8) bytes of codes
    plus one byte per row outside base0 .. base0 + 2**width - 2. width 0 stores nothing (every row is base0).

    One histogram of the bases scores every (base0, width) at once (O(rows), on the bases' device). Ties: the
    smaller width, then the lower base0."""
    n = base.numel()
    hist = torch.bincount(base.long(), minlength=MAX_BASE + 1)[: MAX_BASE + 1]
    cum = torch.nn.functional.pad(torch.cumsum(hist, 0), (1, 0))  # cum[b] = rows whose base is below b
    starts = torch.arange(MAX_BASE + 1, device=base.device)
    spans = (1 << torch.arange(1, 9, device=base.device)) - 1
    cover = cum[(starts[None, :] + spans[:, None]).clamp(max=MAX_BASE + 1)] - cum[starts][None, :]  # [8, 240]
    best = torch.argmax(cover, dim=1)  # the first maximum: the lowest base0
    covered = cover.gather(1, best[:, None])[:, 0]
    uniform = torch.argmax(hist)
    best_l, covered_l, top, b0 = best.tolist(), covered.tolist(), int(hist[uniform]), int(uniform)
    choices = [(0 if top == n else float("inf"), 0, b0)]
    choices += [(-(-n * w // 8) + n - covered_l[w - 1], w, best_l[w - 1]) for w in range(1, 9)]
    _, width, base0 = min(choices, key=lambda c: (c[0], c[1]))
    return base0, width


def _side_streams(w12: W12Tensor) -> dict[str, torch.Tensor]:
    """The version 3 record's sections other than the planes, as uint8 tensors on the tensor's device."""
    n, k = w12.shape
    device = w12.device
    base = w12.base[:n].long()
    base0, width = choose_base_code(w12.base[:n])
    if width:
        escape_code = (1 << width) - 1
        delta = base - base0
        outside = (delta < 0) | (delta >= escape_code)
        codes = torch.where(outside, escape_code, delta)
        exceptions = w12.base[:n][outside].contiguous()
    else:
        codes = base[:0]
        exceptions = w12.base[:0]
    rows, cols = escape_positions(w12)
    flat = rows * k + cols
    order = torch.argsort(flat)
    flat = flat[order]
    gaps = flat - torch.nn.functional.pad(flat[:-1], (1, 0), value=-1) - 1 if flat.numel() else flat
    slot = torch.arange(MAX_GAP_BYTES, device=device)
    chunks = gaps[:, None] >> (7 * slot)
    length = (chunks > 0).sum(1).clamp(min=1)
    leb = (chunks & 0x7F) | ((slot < (length - 1)[:, None]).long() << 7)
    gap_stream = leb[slot < length[:, None]].to(torch.uint8)
    header = torch.tensor(
        [RECORD_MAGIC, 3, n, k, base0 | width << 8, exceptions.numel(), flat.numel(), gap_stream.numel()],
        dtype=torch.int32,
        device=device,
    )
    return {
        "header": header.view(torch.uint8),
        "base": _pack_codes(codes, width),
        "base_exceptions": exceptions,
        "escape_bits": w12.esc_val[order].contiguous().view(torch.uint8),
        "escape_gaps": gap_stream,
    }


def record_sections(w12: W12Tensor) -> dict[str, int]:
    """Bytes of each section of the version 3 record (the planes are sized, not built)."""
    n, k = w12.shape
    sizes = {name: t.numel() for name, t in _side_streams(w12).items()}
    return {"header": sizes.pop("header"), "view": n * k, "nibbles": -(-n * k // 2), **sizes}


def to_canonical(w12: W12Tensor) -> dict[str, torch.Tensor]:
    """The canonical on-disk form, version 3 (safetensors-ready): ``{"record": uint8 [bytes]}``, on the tensor's
    device. Layout: the comment above; docs/w12-format.md. Every byte of it is counted in bits per weight."""
    n, k = w12.shape
    side = _side_streams(w12)
    view = w12.view[:n, :k].reshape(-1)
    nib = nibbles_from_kernel_layout(w12.nibbles)[:n, :k].reshape(-1)
    nib = torch.nn.functional.pad(nib, (0, nib.numel() % 2)).view(-1, 2)
    nib = nib[:, 0] | (nib[:, 1] << 4)
    parts = (side["header"], view, nib, side["base"], side["base_exceptions"], side["escape_bits"], side["escape_gaps"])
    return {"record": torch.cat(parts)}


def _from_record(record: torch.Tensor, name: str) -> W12Tensor:
    """Rebuild the kernel-layout tensor from a version 3 record, checking everything before using it."""
    where = f"{name}.record"
    reconvert = "re-convert the BF16 checkpoint: " + CONVERT_COMMAND
    _require(
        record.dim() == 1 and record.numel() >= RECORD_HEADER_BYTES,
        f"W12 record {name}: {record.numel()} bytes of shape {tuple(record.shape)}, not a 1-D record with its "
        f"{RECORD_HEADER_BYTES}-byte header",
        where,
        "the file is truncated: " + CONVERT_COMMAND,
    )
    magic, version, n, k, code, exceptions, count, gap_bytes = (
        record[:RECORD_HEADER_BYTES].clone().view(torch.int32).tolist()
    )
    _require(magic == RECORD_MAGIC, f"W12 record {name} does not start with the W12 magic", f"{where}[0:4]", reconvert)
    if version != 3:
        raise W12Error(
            f"W12 record {name} has format version {version}; this code reads byte records of version 3 "
            f"(versions 1 and 2 are tile records: {name}.records, .base, .escapes, .escape_bits, .header)",
            where=f"{where}[4:8]",
            fix="re-convert the BF16 checkpoint with this code: " + CONVERT_COMMAND,
        )
    base0, width = code & 0xFF, code >> 8
    _require(
        n > 0 and k > 0 and 0 <= width <= 8 and base0 <= MAX_BASE and min(exceptions, count, gap_bytes) >= 0,
        f"W12 record {name}: header (N {n}, K {k}, base0 {base0}, width {width}, {exceptions} base exceptions, "
        f"{count} escapes, {gap_bytes} gap bytes) is invalid",
        f"{where}[0:{RECORD_HEADER_BYTES}]",
        reconvert,
    )
    sizes = (n * k, -(-n * k // 2), -(-n * width // 8), exceptions, 2 * count, gap_bytes)
    expected = RECORD_HEADER_BYTES + sum(sizes)
    _require(
        record.numel() == expected,
        f"W12 record {name} is {record.numel()} bytes; its header's ({n}, {k}) planes, {width}-bit bases, "
        f"{exceptions} base exceptions and {count} escapes ({gap_bytes} gap bytes) need {expected}",
        where,
        "the file is truncated or the record belongs to another tensor: " + CONVERT_COMMAND,
    )
    offsets = [RECORD_HEADER_BYTES]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    view_s, nib_s, base_s, exc_s, bits_s, gaps_s = (record[a:b] for a, b in zip(offsets, offsets[1:]))
    if width:
        codes = _unpack_codes(base_s, width, n)
        marked = codes == (1 << width) - 1
        _require(
            int(marked.sum()) == exceptions,
            f"W12 record {name}: the base stream marks {int(marked.sum())} rows as exceptions, the header says "
            f"{exceptions}",
            f"{where} (base stream)",
            "the base stream is corrupt: " + CONVERT_COMMAND,
        )
        base = torch.where(marked, 0, codes + base0)
        base[marked] = exc_s.long()
    else:
        _require(
            exceptions == 0,
            f"W12 record {name}: {exceptions} base exceptions with a 0-bit base stream",
            f"{where} (base stream)",
            "the base stream is corrupt: " + CONVERT_COMMAND,
        )
        base = torch.full((n,), base0, dtype=torch.long, device=record.device)
    if bool((base > MAX_BASE).any()):
        row = int(torch.nonzero(base > MAX_BASE)[0, 0])
        raise W12Error(
            f"W12 record {name}: row {row}'s window base is {int(base[row])}, above {MAX_BASE}",
            where=f"{where} (base stream, row {row})",
            fix="the base stream is corrupt: " + CONVERT_COMMAND,
        )
    flat = _escape_positions_from_gaps(gaps_s, count, n * k, name, where)
    bits = bits_s.clone().view(torch.int16)
    view_flat = view_s
    if count:
        code7 = view_flat[flat].long() & 0x7F
        bad = (code7 != ESCAPE_LOW_BYTE) & (code7 != ESCAPE_HIGH_BYTE)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise W12Error(
                f"W12 record {name}: escape {i} at ({int(flat[i]) // k}, {int(flat[i]) % k}) sits on a stored "
                f"weight's view byte",
                where=f"{where} (escape {i})",
                fix="the escape list is corrupt: " + CONVERT_COMMAND,
            )
        low = int((code7 == ESCAPE_LOW_BYTE).sum())
    else:
        low = 0
    _require(
        int(((view_flat & 0x7F) == ESCAPE_LOW_BYTE).sum()) == low,
        f"W12 record {name}: the view holds escape codes at positions the escape list does not name",
        f"{where} (escape list)",
        "the escape list is corrupt: " + CONVERT_COMMAND,
    )
    np_, kp = padded(n, TILE_N), padded(k, STEP_K)
    view = torch.zeros(np_, kp, dtype=torch.uint8, device=record.device)
    view[:n, :k] = view_s.view(n, k)
    pairs = torch.stack((nib_s & 0xF, nib_s >> 4), dim=1).reshape(-1)[: n * k]
    nib = torch.zeros(np_, kp, dtype=torch.uint8, device=record.device)
    nib[:n, :k] = pairs.view(n, k)
    full_base = torch.zeros(np_, dtype=torch.uint8, device=record.device)
    full_base[:n] = base.to(torch.uint8)
    esc_ptr, esc_loc, esc_val = bucket_escapes(flat // k, flat % k, bits, np_, kp)
    return W12Tensor((n, k), view, nibbles_to_kernel_layout(nib), full_base, esc_ptr, esc_loc, esc_val, 3)


def _escape_positions_from_gaps(stream: torch.Tensor, count: int, size: int, name: str, where: str) -> torch.Tensor:
    """Row-major int64 positions of the escapes from their LEB128 gap stream, refused unless it holds exactly
    count gaps and every position lies inside the tensor."""
    fix = "the escape list is corrupt: " + CONVERT_COMMAND
    b = stream.long()
    last = (b & 0x80) == 0
    complete = int(last.sum())
    _require(
        complete == count and (count == 0 or bool(last[-1])),
        f"W12 record {name}: the escape gap stream holds {complete} complete gaps"
        + ("" if count == 0 or bool(last[-1]) else " and ends inside one")
        + f", the header says {count} escapes",
        f"{where} (escape gaps)",
        fix,
    )
    if not count:
        return b[:0]
    first = torch.ones_like(last)
    first[1:] = last[:-1]
    starts = torch.nonzero(first)[:, 0]
    group = torch.cumsum(first.long(), 0) - 1
    slot = torch.arange(b.numel(), device=b.device) - starts[group]
    _require(
        int(slot.max()) < MAX_GAP_BYTES,
        f"W12 record {name}: an escape gap runs over {MAX_GAP_BYTES} bytes",
        f"{where} (escape gaps)",
        fix,
    )
    gaps = torch.zeros(count, dtype=torch.long, device=b.device).index_add_(0, group, (b & 0x7F) << (7 * slot))
    # the float sum bounds the exact cumsum below, which cannot then overflow
    _require(
        float((gaps.double() + 1).sum()) <= size + 1,
        f"W12 record {name}: the escape gaps run past the {size}-weight tensor",
        f"{where} (escape gaps)",
        fix,
    )
    flat = torch.cumsum(gaps + 1, 0) - 1
    if int(flat[-1]) >= size:
        raise W12Error(
            f"W12 record {name}: escape {count - 1} at position {int(flat[-1])} is outside the {size}-weight tensor",
            where=f"{where} (escape {count - 1})",
            fix=fix,
        )
    return flat


def from_canonical(tensors: dict[str, torch.Tensor], name: str = "w12") -> W12Tensor:
    """Rebuild the kernel-layout tensor from the stored form: a version 3 ``{"record": uint8}`` (:func:`to_canonical`)
    or versions 1 and 2's tile records (:func:`to_tile_records`), on the record's device.

    Refused with what, where and how to fix (:class:`W12Error`), the input left as it was: a missing or mistyped
    field, an unknown format version, planes of the wrong size, a corrupt base stream, escapes outside the tensor,
    repeated, or not on escape codes of the view."""
    if "record" in tensors:
        record = tensors["record"]
        _require(
            isinstance(record, torch.Tensor) and record.dtype == torch.uint8,
            f"W12 record {name}: field 'record' is not torch.uint8",
            f"{name}.record",
        )
        return _from_record(record, name)
    return _from_tile_records(tensors, name)


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
