"""The certified head's definition: the bound holds and the certified argmax is the exact one."""

import pytest
import torch

from specpilot_kernels.certified_head import reference as R
from specpilot_kernels.certified_head.adversarial import adversarial_head, adversarial_inputs


def test_radius_coefficient_bounds_the_quantization_error():
    gen = torch.Generator().manual_seed(0)
    w, _ = adversarial_head(512, 256, gen)
    head = R.quantize_head(w, chunk_rows=100)
    deq = head.qweight.double() * head.scale.double()[:, None]
    err = (w.double() - deq).norm(dim=1)
    assert (head.radius_coef.double() >= err).all()
    assert head.qweight.abs().max() <= 127
    # the float-error share is a small part of the radius, else the certificate prunes little
    assert (head.radius_coef.double() <= err * 1.5 + 3 * R.accumulation_gamma(256) * w.double().norm(dim=1)).all()


def test_quantize_rejects_non_bf16():
    with pytest.raises(ValueError, match="bf16"):
        R.quantize_head(torch.randn(4, 8))


def test_ties_break_to_the_lowest_index():
    w = torch.zeros(6, 16, dtype=torch.bfloat16)
    w[1] = w[4] = torch.linspace(-1, 1, 16).to(torch.bfloat16)  # rows 1 and 4 tie for any x
    w[2] = (torch.linspace(-1, 1, 16) * 0.5).to(torch.bfloat16)
    head = R.quantize_head(w)
    x = torch.linspace(-1, 1, 16).to(torch.bfloat16)[None]
    tokens, counts = R.certified_argmax_reference(x, head)
    assert tokens.tolist() == [1] and int(counts[0]) >= 2


def test_overflow_falls_back_to_the_full_head():
    gen = torch.Generator().manual_seed(2)
    w, pairs = adversarial_head(64, 32, gen)
    head = R.quantize_head(w)
    x = adversarial_inputs(w, pairs, 512, gen)
    tokens, counts = R.certified_argmax_reference(x, head, max_survivors=1)
    assert (counts > 1).any()
    assert torch.equal(tokens, R.exact_head_reference(x, head).argmax(1))


def test_a_shallower_exact_sum_gets_a_smaller_radius_that_still_covers_the_quantization_error():
    gen = torch.Generator().manual_seed(0)
    w, _ = adversarial_head(512, 2048, gen)
    loose, tight = R.quantize_head(w), R.quantize_head(w, exact_depth=R.warp_order_depth(2048))
    assert loose.exact_depth is None and tight.exact_depth == 69 and tight.max_exact_depth == 69
    assert torch.equal(loose.qweight, tight.qweight) and torch.equal(loose.radius_coef, R.radius_coefficients(w))
    deq = tight.qweight.double() * tight.scale.double()[:, None]
    err, qnorm = (w.double() - deq).norm(dim=1), deq.norm(dim=1)
    assert (tight.radius_coef.double() >= err + R.accumulation_gamma(2048) * qnorm).all()
    assert (tight.radius_coef < loose.radius_coef).all()


def test_warp_order_sum_is_within_its_depths_bound():
    """The CUDA exact head's order (emulated) against FP64: within gamma_D of the absolute products, D its depth."""
    gen = torch.Generator().manual_seed(3)
    w, pairs = adversarial_head(64, 1280, gen)  # 160 pieces: lanes hold 5 or 4 after the zero padding
    x = adversarial_inputs(w, pairs, 64, gen)
    got = R.exact_head_warp_order(x, w).double()
    want = x.double() @ w.double().T
    abs_sum = x.double().abs() @ w.double().abs().T
    assert ((got - want).abs() <= R.accumulation_gamma(R.warp_order_depth(1280)) * abs_sum).all()
    assert not torch.equal(got, R.exact_head_reference(x, R.quantize_head(w)).double())  # another rounding


def test_tight_radius_keeps_the_warp_order_argmax_at_a_deep_hidden_size():
    """K = 2048 (the depth 69 against K): 16,384 adversarial rows, no bound violation, no disagreement."""
    gen = torch.Generator().manual_seed(77)
    w, pairs = adversarial_head(64, 2048, gen)
    head = R.quantize_head(w, exact_depth=R.warp_order_depth(2048))
    chunks = (adversarial_inputs(w, pairs, 4096, gen) for _ in range(4))
    stats = R.certified_argmax_chunked(
        chunks, head, max_survivors=48, exact=lambda xs, h: R.exact_head_warp_order(xs, h.weight)
    )
    assert stats["rows"] == 16384 and stats["bound_violations"] == 0 and stats["disagreements"] == 0
    assert stats["survivors_max"] >= 2


@pytest.mark.parametrize("exact", ["fp64", "warp_order"])
def test_ten_million_rows_never_change_the_argmax(exact):
    """>= 10 million synthetic adversarial rows over a small vocabulary: no disagreement, no bound violation,
    for the FP64 exact head (radius for any order) and the CUDA one's order (radius for its depth)."""
    gen = torch.Generator().manual_seed(1234)
    w, pairs = adversarial_head(32, 32, gen)
    head = R.quantize_head(w, exact_depth=R.warp_order_depth(32) if exact == "warp_order" else None)
    logits = R.exact_head_reference if exact == "fp64" else lambda xs, h: R.exact_head_warp_order(xs, h.weight)
    pool = adversarial_inputs(w, pairs, 1 << 18, gen).float()  # bf16 values; re-signed and drawn per chunk below
    chunk = 1 << 15

    def chunks():
        for _ in range(0, 10_027_008, chunk):
            rows = torch.randint(0, pool.shape[0], (chunk,), generator=gen)
            sign = torch.randint(0, 2, (chunk, 1), generator=gen).float() * 2 - 1
            yield pool[rows] * sign

    stats = R.certified_argmax_chunked(chunks(), head, max_survivors=48, exact=logits)
    assert stats["rows"] >= 10_000_000
    assert stats["bound_violations"] == 0
    assert stats["disagreements"] == 0
    assert stats["survivors_max"] >= 2  # ties and near-ties were exercised
