"""The INT8 copy in the mma.sync fragment layout, offset-binary, for the CUDA INT8 pass (csrc/int8_pass.cu).

Per 16-row tile and 32-column block, lane ``l = 4g + t`` of a warp holds 16 bytes: byte ``i`` is
register ``i // 2`` of the two m16n8k16 k-steps (registers 0-3: step 0, 4-7: step 1; A registers
``a0..a3`` = rows g, g+8, g, g+8 at k-slots 2t.., 2t.., 2t+8.., 2t+8..), low half for even ``i``. The
k order inside a block is permuted so that lane t's activations for both steps are the 8 consecutive
columns ``8t .. 8t+7`` (one 16-byte load): k-slot ``2t + h + 8q`` of step s is column ``8t + 4s + 2q + h``.
Bytes are ``q + 128`` (uint8), so ``prmt`` under 0x64 gives the fp16 value ``1024 + q + 128`` and one
subtraction of 1152 gives ``q`` exactly. Rows are padded to a multiple of 64 with ``q = 0``.

The activations (fp16, from :func:`.reference.scaled_fp16_rows`) are laid out to match
(:func:`activation_fragments`): per 32-column block and token tile of 8 rows, lane ``4g + t`` holds row
``8j + g``, columns ``8t .. 8t+7`` (both k-steps' B registers), so a warp's load is 512 contiguous bytes.
"""

from __future__ import annotations

import torch

ROW_PAD = 64  # up to 4 tiles of 16 rows per warp unit
OFFSET = 128


def fragment_index(device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) inside a 16x32 block of byte i (0..15) of lane l (0..31): two int64 [32, 16]."""
    lane = torch.arange(32, device=device)[:, None]
    i = torch.arange(16, device=device)[None, :]
    g, t = lane // 4, lane % 4
    reg, high = i // 2, i % 2
    step, a_reg = reg // 4, reg % 4
    rows = g + 8 * (a_reg % 2)
    cols = 8 * t + 4 * step + 2 * (a_reg // 2) + high
    return rows, cols


def to_fragments(qweight: torch.Tensor, chunk_rows: int = 8192) -> torch.Tensor:
    """Offset-binary fragments of an INT8 copy: qweight int8 [N, K] (K a multiple of 32) ->
    uint8 [ceil(N / 64) * 4, K / 32, 32, 16], on qweight's device."""
    n, k = qweight.shape
    if qweight.dtype != torch.int8 or k % 32:
        raise ValueError(
            f"qweight must be int8 [N, K] with K a multiple of 32, got {qweight.dtype} {tuple(qweight.shape)}"
        )
    n_padded = -(-n // ROW_PAD) * ROW_PAD
    rows, cols = fragment_index(qweight.device)
    out = torch.empty((n_padded // 16, k // 32, 32, 16), dtype=torch.uint8, device=qweight.device)
    step = chunk_rows - chunk_rows % ROW_PAD
    for start in range(0, n_padded, step):
        stop = min(start + step, n_padded)
        block = torch.full((stop - start, k), OFFSET, dtype=torch.uint8, device=qweight.device)
        real = qweight[start : min(stop, n)]
        block[: real.shape[0]] = (real.to(torch.int16) + OFFSET).to(torch.uint8)
        tiles = block.view((stop - start) // 16, 16, k // 32, 32).permute(0, 2, 1, 3)  # [T, B, 16, 32]
        out[start // 16 : stop // 16] = tiles[:, :, rows, cols]
    return out


def from_fragments(fragments: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`to_fragments`: uint8 [Np/16, K/32, 32, 16] -> the int8 copy [n, K]."""
    tiles, blocks = fragments.shape[:2]
    rows, cols = fragment_index(fragments.device)
    out = torch.empty((tiles, blocks, 16, 32), dtype=torch.uint8, device=fragments.device)
    out[:, :, rows, cols] = fragments
    unsigned = out.permute(0, 2, 1, 3).reshape(tiles * 16, blocks * 32)[:n]
    return (unsigned.to(torch.int16) - OFFSET).to(torch.int8)


def token_tiles(rows: int) -> int:
    """Token tiles of 8 the CUDA pass multiplies for ``rows`` input rows (1, 2 or 4; padding rows are zero)."""
    return 1 if rows <= 8 else 2 if rows <= 16 else 4


def activation_fragments(x16: torch.Tensor) -> torch.Tensor:
    """fp16 rows [M, K] -> [K/32, tiles, 32, 8] in B-fragment order, rows padded with zeros to 8 * tiles."""
    m, k = x16.shape
    tiles = token_tiles(m)
    padded = torch.zeros((8 * tiles, k), dtype=x16.dtype, device=x16.device)
    padded[:m] = x16
    # [tile j, g, block, t, 8] -> [block, j, g, t, 8]: lane 4g + t
    return padded.view(tiles, 8, k // 32, 4, 8).permute(2, 0, 1, 3, 4).reshape(k // 32, tiles, 32, 8).contiguous()
