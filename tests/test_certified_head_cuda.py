"""The certified head's CUDA INT8 pass: its layout and prologue rule on the CPU (pure torch), the pass
itself against the reference and the exact argmax on the GPU (``gpu`` tests)."""

import pytest
import torch

from specpilot_kernels.certified_head import (
    certified_argmax,
    certified_argmax_graphable,
    exact_head_logits,
    int8_pass,
    quantize_head,
)
from specpilot_kernels.certified_head import reference as R
from specpilot_kernels.certified_head.adversarial import adversarial_head, adversarial_inputs
from specpilot_kernels.certified_head.cuda_pass import CudaPassConfig
from specpilot_kernels.certified_head.fragments import (
    activation_fragments,
    fragment_index,
    from_fragments,
    to_fragments,
    token_tiles,
)
from specpilot_kernels.certified_head.head import uses_cuda_pass


def test_fragments_round_trip_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (200, 96), generator=gen, dtype=torch.int8)  # 200 rows: padded to 256
    frags = to_fragments(q, chunk_rows=128)
    assert frags.shape == (16, 3, 32, 16) and frags.dtype == torch.uint8
    assert torch.equal(from_fragments(frags, 200), q)
    padding = from_fragments(frags, 256)[200:]
    assert torch.equal(padding, torch.zeros_like(padding))  # offset-binary 128: q = 0
    rows, cols = fragment_index()
    assert sorted((rows * 32 + cols).flatten().tolist()) == list(range(512))  # a permutation of the block


def _warp_mma(frag_block: torch.Tensor, x_block: torch.Tensor) -> torch.Tensor:
    """What the kernel's warp computes from one (16-row tile, 32-column block) and one token tile: the PTX
    m16n8k16 fragment rules applied to the registers each lane builds. frag_block uint8 [32, 16]; x_block
    [32, 8] (the activation fragments of the block and token tile) -> [16 rows, 8 tokens]."""
    a = torch.zeros(2, 16, 16, dtype=torch.float64)  # per k16 step: [row, k-slot]
    b = torch.zeros(2, 16, 8, dtype=torch.float64)  # per k16 step: [k-slot, token]
    for lane in range(32):
        g, t = divmod(lane, 4)
        values = frag_block[lane].double() - 128  # prmt under 0x64, minus 1152
        halves = x_block[lane].double()  # one 16-byte load
        for step in range(2):
            regs = values[8 * step : 8 * step + 8].view(4, 2)  # a0..a3, low half first
            for a_reg, (row, slot) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                a[step, row, slot : slot + 2] = regs[a_reg]
            b[step, 2 * t : 2 * t + 2, g] = halves[4 * step : 4 * step + 2]  # b0
            b[step, 2 * t + 8 : 2 * t + 10, g] = halves[4 * step + 2 : 4 * step + 4]  # b1
    return a[0] @ b[0] + a[1] @ b[1]


def test_fragment_layout_feeds_the_mma_the_right_products():
    """Every (tile, block) of the layout, multiplied the way the kernel's lanes feed mma.sync, is q @ x^T."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randint(-127, 128, (64, 64), generator=gen, dtype=torch.int8)
    x = torch.randint(-1000, 1000, (13, 64), generator=gen).half()  # two token tiles, the second padded
    frags, x_frags = to_fragments(q), activation_fragments(x)
    assert x_frags.shape == (2, token_tiles(13), 32, 8)
    for tile in range(4):
        for j in range(2):
            got = sum(_warp_mma(frags[tile, blk], x_frags[blk, j]) for blk in range(2))
            tokens = x[8 * j : 8 * j + 8].double()
            want = q[16 * tile : 16 * tile + 16].double() @ tokens.T
            assert torch.equal(got[:, : tokens.shape[0]], want)
            assert not got[:, tokens.shape[0] :].any()  # padding rows are zero


def test_scaled_rows_are_exact_and_unrepresentable_rows_are_flagged():
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(8, 256, generator=gen) * torch.logspace(-12, 12, 8, base=2)[:, None]).to(torch.bfloat16)
    x[4, 7] = 2.0**-40 * float(x[4].float().abs().max())  # 2^-40 below the max: under fp16's range
    x[5] = 0  # nothing to scale
    x[6, 3] = float("inf")
    x[7] *= 2.0**60  # max above 2^50
    x16, inv_scale, ok = R.scaled_fp16_rows(x)
    assert ok.tolist() == [True, True, True, True, False, False, False, False]
    assert torch.equal((x16[ok].float() * inv_scale[ok, None]), x[ok].float())
    amax = x16[ok].float().abs().amax(1)
    assert ((amax >= 2**14) & (amax < 2**15)).all()
    assert torch.equal(inv_scale, torch.pow(2.0, torch.log2(inv_scale).round()))  # powers of two


def test_quantize_head_outputs_do_not_depend_on_fragments():
    gen = torch.Generator().manual_seed(1)
    w, _ = adversarial_head(200, 128, gen)
    plain, with_frags = quantize_head(w, fragments=False), quantize_head(w, fragments=True)
    assert plain.fragments is None
    for name in ("qweight", "scale", "radius_coef"):
        assert torch.equal(getattr(plain, name), getattr(with_frags, name))
    assert torch.equal(from_fragments(with_frags.fragments, 200), plain.qweight)


def test_backend_choice():
    gen = torch.Generator().manual_seed(1)
    w, _ = adversarial_head(64, 128, gen)
    x = torch.zeros(1, 128, dtype=torch.bfloat16)
    assert not uses_cuda_pass(x, quantize_head(w, fragments=True), "auto")  # a CPU input: the Triton pass
    with pytest.raises(ValueError, match="fragments"):
        int8_pass(x, quantize_head(w, fragments=False), backend="cuda")
    with pytest.raises(ValueError, match="backend"):
        int8_pass(x, quantize_head(w, fragments=False), backend="cutlass")


CONFIGS = [
    CudaPassConfig(1, 4, 4, 16, False),
    CudaPassConfig(2, 2, 3, 8, False),
    CudaPassConfig(4, 8, 6, 8, False),
    CudaPassConfig(2, 8, 3, 16, True, 1),
    CudaPassConfig(4, 4, 3, 8, True, 1),
    CudaPassConfig(1, 8, 2, 24, True),
    # activation batches of 4 and 8 chunks a barrier; 16 lowered to 8 (a unit has 8 chunks at K=1024, T=1)
    CudaPassConfig(2, 8, 3, 16, True, 4),
    CudaPassConfig(4, 4, 5, 8, True, 8),
    CudaPassConfig(1, 8, 2, 24, True, 16),
    # the batched kernel (3 stages, batches of 8, 1-2 tiles): the default, one tile in 4-warp blocks
    CudaPassConfig(),
    CudaPassConfig(1, 4, 3, 16, True, 8),
]


@pytest.fixture(scope="module")
def gpu_head():
    gen = torch.Generator().manual_seed(11)
    w, pairs = adversarial_head(4100, 1024, gen)  # 4100 rows: the last tiles are padding
    return quantize_head(w.cuda()), pairs.cuda(), gen


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    CONFIGS,
    ids=lambda c: (
        f"t{c.tiles_per_warp}w{c.warps_per_block}s{c.stages}"
        f"{'x' if c.shared_activations else ''}b{c.chunks_per_barrier}"
    ),
)
@pytest.mark.parametrize("rows", [1, 6, 13, 32])
def test_cuda_pass_bounds_and_candidates_agree_with_the_reference(gpu_head, config, rows):
    head, pairs, gen = gpu_head
    x = adversarial_inputs(head.weight, pairs, rows, gen)
    best_lower, count, cand_idx, _ = int8_pass(x, head, max_survivors=4100, backend="cuda", cuda_config=config)
    cpu_head = R.CertifiedHead(head.weight.cpu(), head.qweight.cpu(), head.scale.cpu(), head.radius_coef.cpu())
    approx, radius = R.int8_logits_and_radius(x.cpu(), cpu_head)
    want_best = (approx - radius).amax(1)
    torch.testing.assert_close(best_lower.cpu(), want_best, rtol=1e-5, atol=1e-5 * float(want_best.abs().max()))
    for m in range(rows):
        listed = cand_idx[m, : int(count[m])].tolist()
        assert len(set(listed)) == len(listed) == int(count[m])
        margin = 1e-5 * (float(want_best[m].abs()) + 1)
        kept = ((approx[m] + radius[m]) >= want_best[m] + margin).nonzero().squeeze(1).tolist()
        assert set(kept) <= set(listed)


@pytest.mark.gpu
def test_cuda_prologue_matches_its_reference(gpu_head):
    from specpilot_kernels.certified_head.cuda_pass import _extension

    head, pairs, gen = gpu_head
    x = adversarial_inputs(head.weight, pairs, 8, gen)
    x[2, 5] = 2.0**-40 * float(x[2].float().abs().max())
    x[3] = 0
    m, k = x.shape
    x16 = torch.empty((k // 32, token_tiles(m), 32, 8), dtype=torch.float16, device="cuda")
    inv_scale, norm, best = (torch.empty(m, device="cuda") for _ in range(3))
    cap, stage_cap = 64, 4100  # the stage list holds every row: only the prologue's flag overflows it
    stage_count, count = (torch.empty(m, dtype=torch.int32, device="cuda") for _ in range(2))
    stage_idx = torch.empty((m, stage_cap), dtype=torch.int32, device="cuda")
    stage_upper = torch.empty((m, stage_cap), device="cuda")
    cand_idx = torch.empty((m, cap), dtype=torch.int32, device="cuda")
    cand_upper = torch.empty((m, cap), device="cuda")
    _extension().int8_pass(
        x,
        x16,
        inv_scale,
        norm,
        head.fragments,
        head.scale,
        head.radius_coef,
        best,
        stage_count,
        stage_idx,
        stage_upper,
        count,
        cand_idx,
        cand_upper,
        R.BOUND_SLACK,
        R.NORM_INFLATION,
        1,
        4,
        4,
        16,
        False,
        1,
        True,
    )
    want_x16, want_inv, ok = R.scaled_fp16_rows(x)
    assert torch.equal((stage_count > stage_cap).cpu(), ~ok.cpu()) and not ok[2] and not ok[3]
    assert (count[~ok] == cap + 1).all()
    want_x16[~ok] = 0  # the fallback rows' activations are not compared
    got_x16 = x16.clone()
    got_x16.view(k // 32, 8, 4, 8)[:, ~ok] = 0  # [block, row g, lane t, 8]: one token tile
    assert torch.equal(inv_scale[ok], want_inv[ok]) and torch.equal(got_x16, activation_fragments(want_x16))
    torch.testing.assert_close(norm, R.input_norm(x), rtol=1e-5, atol=0)  # another order of sums


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config",
    [None, CudaPassConfig(1, 4, 3, 16, False), CudaPassConfig(2, 8, 3, 16, True, 4)],
    ids=["default", "l1", "general"],
)
def test_cuda_pass_keeps_the_exact_argmax_on_adversarial_rows(gpu_head, config):
    """4096 adversarial rows in calls of 32 through the CUDA pass: the token is the exact head's argmax
    (the exact head kernel computes the same bits as the rescoring); flagged rows take the full head."""
    head, pairs, gen = gpu_head
    mismatches, fallbacks = 0, 0
    for call in range(128):
        x = adversarial_inputs(head.weight, pairs, 32, gen)
        if call % 16 == 0:
            x[0, 1] = 2.0**-40 * float(x[0].float().abs().max())  # not exact in fp16: the full head
        graph_tokens, count = certified_argmax_graphable(x, head, max_survivors=512, backend="cuda", cuda_config=config)
        tokens, _ = certified_argmax(x, head, max_survivors=512, backend="cuda", cuda_config=config)
        fallbacks += int((graph_tokens < 0).sum())
        mismatches += int((tokens != exact_head_logits(x, head.weight).argmax(1)).sum())
    assert mismatches == 0
    assert fallbacks >= 8
