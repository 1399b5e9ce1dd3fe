"""The FP8 Q pass (``w12_fp8_qpass_gemm``): the W12 view plane is the m16n8k32 E4M3 A fragment after one byte
permute a register, checked on the CPU by running the kernel's per-lane data flow through the PTX fragment layout;
the midpoint's second MMA is exact; the quantizer's reference; the kernel builds for sm_90a without spills; on a GPU
the kernel against its emulation."""

import re
import shutil
import subprocess

import pytest
import torch

from specpilot_kernels.cuda_extension import SHARED_HEADERS
from specpilot_kernels.w12 import W12Error, encode, to_mma_layout
from specpilot_kernels.w12.qpass_fp8 import (
    CSRC,
    Fp8QpassConfig,
    default_fp8_qpass_config,
    fp8_qpass_linear_reference,
    fp8_qpass_partition,
    fp8_qpass_reference,
    fp8_rows_reference,
    tiles_per_warp_fits,
    w12_fp8_qpass_gemm,
)
from specpilot_kernels.w12.reference import qpass_weight_reference

CUDA_FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def weight_with_escapes(n=48, k=256, seed=0, device="cpu"):
    torch.manual_seed(seed)
    w = (torch.randn(n, k) * 0.02).bfloat16()
    w[3, 5] = 0.0
    w[10, 100] = 4.0  # above the row's window: the view's top code
    w[11, 64] = 1e-9  # below: zero
    w[20] = 0.0  # a row of zeros
    return w.to(device)


def permute_bytes(a: torch.Tensor, b: torch.Tensor, selector: int) -> torch.Tensor:
    """prmt.b32 on int64 tensors holding 32-bit words: byte i of the result is byte (selector >> 4i) & 7 of {b, a}."""
    both = a | (b << 32)
    out = torch.zeros_like(a)
    for i in range(4):
        pick = (selector >> (4 * i)) & 7
        out |= ((both >> (8 * pick)) & 0xFF) << (8 * i)
    return out


def words(data: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 4w] -> int64 [..., w] little-endian 32-bit words."""
    b = data.to(torch.int64).view(*data.shape[:-1], -1, 4)
    return b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)


def e4m3_values(word: torch.Tensor) -> torch.Tensor:
    """int64 words [...] -> fp32 [..., 4]: their bytes read as E4M3 numbers."""
    b = torch.stack([(word >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)
    return b.view(torch.float8_e4m3fn).float()


def image_of(q: torch.Tensor, kp: int) -> torch.Tensor:
    """The quantizer's B image as the kernel's header states it: column c = 64p + 32h + 8t + i of token 8j + g at
    image[j][p][4g + t][8h + i]."""
    m, k = q.shape
    tiles8 = -(-m // 8)
    rows = torch.zeros(tiles8 * 8, kp, dtype=torch.uint8)
    rows[:m, :k] = q.view(torch.uint8)
    return rows.view(tiles8, 8, kp // 64, 2, 4, 8).permute(0, 2, 1, 4, 3, 5).reshape(tiles8, kp // 64, 32, 16)


def lane_level_qpass(x: torch.Tensor, mma, low_bits: str) -> torch.Tensor:
    """The kernel's data flow, lane by lane, through the PTX ISA's m16n8k32 E4M3 fragment layout (lane 4g + t: A
    byte j of a[r] is row g + 8 (r % 2), k 4t + j + 16 (r // 2); B byte j of b[r] is k 4t + j + 16 r, column g;
    D d[i] is row g + 8 (i // 2), column 2t + i % 2). Returns fp32 [M, N] before the bf16 rounding."""
    q, scale = fp8_rows_reference(x)
    m = x.shape[0]
    n, _ = mma.shape
    tiles, blocks = mma.view.shape[:2]
    kp = blocks * 32
    image = image_of(q, kp)  # [J, P, 32, 16]
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    a_row = torch.stack([g, g + 8, g, g + 8], dim=1)  # [32, 4] (register r)
    a_k = torch.stack([4 * t, 4 * t, 4 * t + 16, 4 * t + 16], dim=1)
    b_k = torch.stack([4 * t, 4 * t + 16], dim=1)
    y = torch.zeros(tiles * 16, image.shape[0] * 8)
    for blk in range(blocks):
        v = words(mma.view[:, blk])  # [T, 32, 4]
        a = torch.stack(
            [
                permute_bytes(v[..., 0], v[..., 1], 0x5410),
                permute_bytes(v[..., 0], v[..., 1], 0x7632),
                permute_bytes(v[..., 2], v[..., 3], 0x5410),
                permute_bytes(v[..., 2], v[..., 3], 0x7632),
            ],
            dim=-1,
        )  # [T, 32, 4 registers]
        ops = [a] if low_bits == "truncated" else [a, a & 0xF8F8F8F8]
        xb = words(image[:, blk // 2, :, 8 * (blk % 2) : 8 * (blk % 2) + 8])  # [J, 32, 2]
        B = torch.zeros(image.shape[0], 32, 8)  # [J, k, column]
        for r in range(2):
            vals = e4m3_values(xb[..., r])  # [J, 32, 4]
            for j in range(4):
                B[:, b_k[:, r] + j, g] = vals[:, :, j]
        for index, op in enumerate(ops):
            A = torch.zeros(tiles, 16, 32)
            for r in range(4):
                vals = e4m3_values(op[..., r])  # [T, 32, 4]
                for j in range(4):
                    A[:, a_row[:, r], a_k[:, r] + j] = vals[:, :, j]
            D = torch.einsum("trk,jkc->trjc", A, B).reshape(tiles * 16, -1)
            y += D * (1.0 if index == 0 else 1.0 / 16)
    window = torch.exp2(mma.base.float() - 120.0)
    return (y[:n, :m] * window[:n, None]).t() * scale[:, None]


def f16_pairs(word: torch.Tensor) -> torch.Tensor:
    """cvt.rn.f16x2.e4m3x2 of the low 16 bits of int64 words [...] -> int64 f16 bit patterns [..., 2] (low byte
    first)."""
    b = torch.stack([word & 0xFF, (word >> 8) & 0xFF], dim=-1).to(torch.uint8)
    return b.view(torch.float8_e4m3fn).to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF


def f16_midpoint(h: torch.Tensor) -> torch.Tensor:
    """The kernel's f16x2_midpoint on one half's bits: bit 6 set where bit 13 or 14 is (every nonzero E4M3 code)."""
    return h | (((h >> 7) | (h >> 8)) & 0x40)


def f16_values(bits: torch.Tensor) -> torch.Tensor:
    return bits.to(torch.int16).view(torch.float16).float()


def lane_level_f16_qpass(x: torch.Tensor, mma, low_bits: str) -> torch.Tensor:
    """The f16-operand kernel's data flow, lane by lane, through the PTX ISA's m16n8k16 f16 fragment layout (lane
    4g + t: a[r] holds row g + 8 (r % 2) at k 2t + 8 (r // 2) + {0, 1}; b[r] holds k 2t + 8 r + {0, 1} of column g;
    D as for k32). A 32-column block is two k16 MMAs: MMA q takes view words 2q, 2q + 1 and the image's bytes
    4q .. 4q + 3 of the lane's 8. Returns fp32 [M, N] before the bf16 rounding."""
    q, scale = fp8_rows_reference(x)
    m = x.shape[0]
    n, _ = mma.shape
    tiles, blocks = mma.view.shape[:2]
    image = image_of(q, blocks * 32)  # [J, P, 32, 16]
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    y = torch.zeros(tiles * 16, image.shape[0] * 8)
    for blk in range(blocks):
        v = words(mma.view[:, blk])  # [T, 32, 4]
        xb = words(image[:, blk // 2, :, 8 * (blk % 2) : 8 * (blk % 2) + 8])  # [J, 32, 2]
        for mq in range(2):
            A = torch.zeros(tiles, 16, 16)
            for r in range(4):
                word = v[..., 2 * mq + r // 2] >> (16 * (r % 2))  # a0: word lo, a1: word hi, a2/a3: the next word
                bits = f16_pairs(word)  # [T, 32, 2]
                if low_bits == "midpoint":
                    bits = f16_midpoint(bits)
                for e in range(2):
                    A[:, g + 8 * (r % 2), 2 * t + 8 * (r // 2) + e] = f16_values(bits[..., e])
            B = torch.zeros(image.shape[0], 16, 8)
            for r in range(2):
                bits = f16_pairs(xb[..., mq] >> (16 * r))  # [J, 32, 2]
                for e in range(2):
                    B[:, 2 * t + 8 * r + e, g] = f16_values(bits[..., e])
            y += torch.einsum("trk,jkc->trjc", A, B).reshape(tiles * 16, -1)
    window = torch.exp2(mma.base.float() - 120.0)
    return (y[:n, :m] * window[:n, None]).t() * scale[:, None]


def wgmma_f16_image_of(q: torch.Tensor, kp: int, token_tiles: int) -> torch.Tensor:
    """The quantizer's f16 warpgroup image: column c = 32b + 8t + 4s + 2h + e of token 8j + g as f16 at
    [b][s][h][j][g][2t + e] (k16 step s, k half h; rows past M zero). Flat uint8, two bytes a number."""
    m, k = q.shape
    rows = torch.zeros(token_tiles * 8, kp, dtype=torch.float16)
    rows[:m, :k] = q.to(torch.float16)  # every E4M3 number is an f16
    # [j, g, b, t, s, h, e] -> [b, s, h, j, g, t, e]
    image = rows.view(token_tiles, 8, kp // 32, 4, 2, 2, 2).permute(2, 4, 5, 0, 1, 3, 6).reshape(-1)
    return image.view(torch.uint8)


def lane_level_wgmma_f16_qpass(x: torch.Tensor, mma, low_bits: str) -> torch.Tensor:
    """The f16 warpgroup kernel's data flow: warp w holds tile 4G + w's m16n8k16 A fragments (the per-warp f16 kind's
    conversion, the midpoint bit); wgmma k16 step u = 2b + s reads B (16 x N f16, K-major, no swizzle) through its
    descriptor at offset u x T x 256: element (k-slot s', column n) at (s' // 8) x LBO + (n // 8) x SBO + (n % 8) x 16
    + 2 (s' % 8), LBO = T x 128, SBO = 128. Returns fp32 [M, N] before the bf16 rounding."""
    from specpilot_kernels.w12.qpass_fp8 import built_token_tiles

    q, scale = fp8_rows_reference(x)
    m = x.shape[0]
    n, _ = mma.shape
    tiles, blocks = mma.view.shape[:2]
    tt = built_token_tiles(m)
    image = wgmma_f16_image_of(q, blocks * 32, tt)
    lane = torch.arange(32)
    g, t = lane // 4, lane % 4
    k_idx, n_idx = torch.arange(16)[:, None], torch.arange(8 * tt)[None, :]
    offsets = (k_idx // 8) * (tt * 128) + (n_idx // 8) * 128 + (n_idx % 8) * 16 + 2 * (k_idx % 8)  # [16, N]
    y = torch.zeros(tiles * 16, 8 * tt)
    for blk in range(blocks):
        v = words(mma.view[:, blk])  # [T, 32, 4]
        for step in range(2):
            at = (2 * blk + step) * tt * 256 + offsets
            B = (image[at].to(torch.int32) | (image[at + 1].to(torch.int32) << 8)).to(torch.int16)
            B = B.view(torch.float16).float()  # [k-slot, column]
            A = torch.zeros(tiles, 16, 16)
            for r in range(4):
                bits = f16_pairs(v[..., 2 * step + r // 2] >> (16 * (r % 2)))
                if low_bits == "midpoint":
                    bits = f16_midpoint(bits)
                for e in range(2):
                    A[:, g + 8 * (r % 2), 2 * t + 8 * (r // 2) + e] = f16_values(bits[..., e])
            y += (A @ B).reshape(tiles * 16, -1)
    window = torch.exp2(mma.base.float() - 120.0)
    return (y[:n, :m] * window[:n, None]).t() * scale[:, None]


def test_the_f16_midpoint_bit_is_the_view_plus_its_sign_and_exponent_over_16():
    codes = torch.tensor([c for c in range(256) if (c & 0x7F) >> 3 and (c & 0x7F) != 0x7F] + [0x00, 0x80])
    v = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
    se = (codes & 0xF8).to(torch.uint8).view(torch.float8_e4m3fn).float()
    got = f16_values(f16_midpoint(f16_pairs(codes)[..., 0]))
    assert torch.equal(got, v + se / 16)  # normal codes gain half a step of the view; the zero code stays zero


@pytest.mark.parametrize("low_bits", ["midpoint", "truncated"])
@pytest.mark.parametrize(
    "lane_level",
    [
        pytest.param(lane_level_qpass, id="e4m3: the view is the A fragment after one permute a register"),
        pytest.param(lane_level_f16_qpass, id="f16: the view and the image converted in registers"),
        pytest.param(lane_level_wgmma_f16_qpass, id="wgmma_f16: the view converted, the f16 image by descriptor"),
    ],
)
@pytest.mark.parametrize("rows", [1, 11, 33])
def test_the_lane_level_operands_give_the_reference(lane_level, low_bits, rows):
    w12 = encode(weight_with_escapes())
    x = torch.randn(rows, 256).bfloat16()
    got = lane_level(x, to_mma_layout(w12), low_bits)
    ref = fp8_qpass_reference(x, w12, low_bits)
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()))


def test_the_midpoint_is_the_view_plus_its_sign_and_exponent_over_16():
    codes = torch.tensor([c for c in range(256) if c & 0x7F and (c & 0x7F) >> 3 and (c & 0x7F) != 0x7F])
    v = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
    se = (codes & 0xF8).to(torch.uint8).view(torch.float8_e4m3fn).float()
    mid = v + se / 16
    # BF16 bits of the midpoint weight at window base 120 (2**0): sign | (offset + 120) << 7 | mmm << 4 | 1000
    bits = ((codes & 0x80) << 8) | (((codes & 0x7F) << 4) + (120 << 7)) | 0x8
    assert torch.equal(mid, bits.to(torch.int16).view(torch.bfloat16).float())


def test_rows_are_quantized_onto_e4m3_with_their_own_scale():
    x = torch.tensor([[1.0, -2.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [1e-3, 3e4, -7.0, 2.0]]).bfloat16()
    q, scale = fp8_rows_reference(x)
    assert q.dtype == torch.float8_e4m3fn
    assert torch.equal(scale, torch.tensor([2.0 / 448, 1.0, float(x[2].float().abs().max()) / 448]))
    assert float(q[0, 1].float()) == -448.0 and float(q[2, 1].float()) == 448.0
    assert torch.equal(q[1].float(), torch.zeros(4))
    assert torch.allclose(q.float() * scale[:, None], x.float(), rtol=2**-4, atol=float(x[2].abs().max()) * 2**-9)


def test_the_linear_reference_is_the_gemm_reference_in_the_weights_values():
    w12 = encode(weight_with_escapes())
    x = torch.randn(5, 256).bfloat16()
    got = fp8_qpass_linear_reference(x.float(), qpass_weight_reference(w12, "midpoint").float())
    assert torch.allclose(got, fp8_qpass_reference(x, w12, "midpoint"), rtol=1e-5, atol=1e-6)


def test_the_partition_fills_the_gpu_and_keeps_blocks_small():
    qkv, down, head = (default_fp8_qpass_config(n, k, 132) for n, k in ((10240, 5120), (5120, 17408), (248320, 5120)))
    # two tiles a warp; K shared by enough warps (and, for down's 160 groups, two blocks) for ~16 warps an SM
    assert [(c.tiles_per_warp, c.warps_k, c.splits) for c in (qkv, down, head)] == [(2, 7, 1), (2, 7, 2), (2, 1, 1)]
    assert all(c.warps_k * c.groups_per_block <= 8 for c in (qkv, down, head))
    with pytest.raises(W12Error, match="1-8 warps"):
        Fp8QpassConfig(warps_k=4, groups_per_block=4)
    with pytest.raises(W12Error, match="built for"):
        Fp8QpassConfig(tiles_per_warp=3)
    with pytest.raises(W12Error, match="built for"):
        Fp8QpassConfig(operands="bf16")


def test_a_tree_shares_each_activation_fragment_over_several_weight_tiles():
    # 33 rows (a 32-node tree and its root): 5 token tiles, two weight tiles a warp in either mode
    trunc, mid = (default_fp8_qpass_config(34816, 5120, 132, 33, midpoint) for midpoint in (False, True))
    assert (trunc.tiles_per_warp, mid.tiles_per_warp) == (2, 2)
    assert all(tiles_per_warp_fits(m, default_fp8_qpass_config(10240, 5120, 132, m).tiles_per_warp, True)
               for m in range(1, 65))  # fmt: skip
    # the E4M3 midpoint's second accumulators halve the budget; the f16 midpoint (an operand bit) does not
    assert not tiles_per_warp_fits(33, 4, midpoint=True) and tiles_per_warp_fits(33, 4, midpoint=False)
    assert tiles_per_warp_fits(64, 2, midpoint=True, operands="f16") and not tiles_per_warp_fits(64, 2, True)
    assert not tiles_per_warp_fits(1, 4, midpoint=False, operands="f16")


def test_few_tile_groups_split_their_k_over_blocks():
    # down at 33 rows with 4 tiles a warp: 80 groups; 8 warps a block cannot fill 132 SMs, so blocks share K too
    down = fp8_qpass_partition(5120, 17408, 132, 4)
    assert down.tiles_per_warp == 4 and down.splits > 1 and down.warps_k <= 8
    assert 80 * down.warps_k * down.splits >= 16 * 132
    assert 272 // (down.warps_k * down.splits) >= 4  # each K class keeps at least 4 pairs of 64 columns
    with pytest.raises(W12Error, match="splits"):
        Fp8QpassConfig(splits=0)


def test_bad_inputs_are_refused_with_the_fix():
    mma = to_mma_layout(encode(weight_with_escapes()))
    with pytest.raises(W12Error, match="low_bits"):
        w12_fp8_qpass_gemm(torch.randn(1, 256).bfloat16(), mma, "exact")
    with pytest.raises(W12Error, match="CUDA bf16"):
        w12_fp8_qpass_gemm(torch.randn(1, 256).bfloat16(), mma)
    with pytest.raises(W12Error, match="W12MmaTensor"):
        w12_fp8_qpass_gemm(torch.randn(1, 256).bfloat16(), encode(weight_with_escapes()))


def ptxas_spills(source: str, tmp_path) -> tuple[str, dict[str, str]]:
    """Build one Q-pass source for sm_90a with ptxas's report: its stderr and each entry function's spill-store bytes."""
    result = subprocess.run(
        ["nvcc", "-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v"]
        + [f"-I{SHARED_HEADERS}", f"-I{CSRC}", "-c", str(CSRC / source), "-o", str(tmp_path / "kernel.o")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    stores = dict(re.findall(r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores", result.stderr, re.S))
    return result.stderr, stores


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_kernel_builds_for_sm_90a_without_spills_up_to_40_rows(tmp_path):
    _, stores = ptxas_spills("w12_qpass_fp8.cu", tmp_path)
    assert len(stores) == 26, stores  # 14 truncated + 11 midpoint (token tiles x weight tiles) + the quantizer
    plans = {tuple(map(int, m.groups()[:2])) + (m.group(3) == "1",): int(stores[name])
             for name in stores if (m := re.search(r"kernelILi(\d+)ELi(\d+)ELb(\d)ELb0", name))}  # fmt: skip
    # at most a few words spilled, and only at the register budget's edge (4 tiles a warp, or 20 accumulators)
    edge = {plan for plan in plans if plan[1] == 4 or plan[0] * plan[1] * (2 if plan[2] else 1) == 20 or plan[0] == 8}
    assert all(count == 0 for plan, count in plans.items() if plan not in edge), plans
    assert all(count <= 64 for plan, count in plans.items() if plan[0] <= 5), plans


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_f16_operand_kernels_build_for_sm_90a_within_a_word_of_spill(tmp_path):
    _, stores = ptxas_spills("w12_qpass_fp8_f16.cu", tmp_path)
    assert len(stores) == 20, stores  # 5 token tiles x 1-2 weight tiles x 2 modes (the midpoint adds no sums)
    assert all("ELb1EEEv" in name for name in stores)  # every one the f16 kind
    assert all(int(count) <= 4 for count in stores.values()), stores


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_warpgroup_kernels_build_for_sm_90a_without_spills(tmp_path):
    report, stores = ptxas_spills("w12_qpass_fp8_wgmma.cu", tmp_path)
    assert "serialized" not in report  # ptxas's warning where it cannot keep the wgmmas asynchronous
    assert len(stores) == 10, stores  # 5 token tiles x 2 modes
    assert all(int(count) == 0 for count in stores.values()), stores


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA_FP8, reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)")
@pytest.mark.parametrize("low_bits", ["midpoint", "truncated"])
@pytest.mark.parametrize("rows", [1, 8, 16, 33, 64, 70])
def test_the_kernel_matches_its_emulation(low_bits, rows):
    w12 = encode(weight_with_escapes(n=1000, k=1536, device="cuda"))
    x = torch.randn(rows, 1536, device="cuda").bfloat16()
    y = w12_fp8_qpass_gemm(x, to_mma_layout(w12), low_bits)
    ref = fp8_qpass_reference(x, w12, low_bits)
    slack = 2.0**-8 * ref.abs() + 1e-5 * ref.abs().max()
    assert ((y.float() - ref).abs() <= slack).all()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA_FP8, reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)")
def test_a_rows_bits_do_not_depend_on_the_row_count():
    mma = to_mma_layout(encode(weight_with_escapes(n=1000, k=1536, device="cuda")))
    x = torch.randn(40, 1536, device="cuda").bfloat16()
    whole = w12_fp8_qpass_gemm(x, mma)
    for r in (0, 17, 39):
        assert torch.equal(w12_fp8_qpass_gemm(x[r : r + 1].contiguous(), mma), whole[r : r + 1])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA_FP8, reason="needs a CUDA GPU with FP8 tensor cores (sm_89+)")
@pytest.mark.parametrize("rows", [1, 16, 33])
@pytest.mark.parametrize("low_bits", ["midpoint", "truncated"])
@pytest.mark.parametrize(
    "config",
    [(1, 1, 1, 3, "e4m3"), (2, 2, 2, 2, "e4m3"), (4, 8, 1, 1, "e4m3"), (1, 2, 2, 1, "f16"), (2, 4, 1, 2, "f16")]
    + [(1, 1, 1, 1, "wgmma_f16"), (1, 1, 2, 3, "wgmma_f16")],
)
def test_every_partition_matches_the_emulation_and_splits_keep_a_rows_bits(rows, config, low_bits):
    tiles_per_warp, warps_k, groups_per_block, splits, operands = config
    if operands.startswith("wgmma") and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("warpgroup MMAs need sm_90")
    if not tiles_per_warp_fits(rows, tiles_per_warp, low_bits == "midpoint", operands):
        pytest.skip(
            f"{tiles_per_warp} tiles a warp at {rows} rows ({low_bits}, {operands}) is not an instantiated partition"
        )
    w12 = encode(weight_with_escapes(n=1000, k=1536, device="cuda"))  # 63 tiles: a short last group
    mma = to_mma_layout(w12)
    x = torch.randn(rows, 1536, device="cuda").bfloat16()
    ref = fp8_qpass_reference(x, w12, low_bits)
    chosen = Fp8QpassConfig(warps_k, groups_per_block, tiles_per_warp, splits, operands)
    for _ in range(2):  # the second launch finds the split counters reset
        y = w12_fp8_qpass_gemm(x, mma, low_bits, config=chosen)
        assert ((y.float() - ref).abs() <= 2.0**-8 * ref.abs() + 1e-5 * ref.abs().max()).all()
    one = Fp8QpassConfig(warps_k, groups_per_block, 1, splits, operands)
    assert torch.equal(w12_fp8_qpass_gemm(x[-1:].contiguous(), mma, low_bits, config=one), y[-1:])
