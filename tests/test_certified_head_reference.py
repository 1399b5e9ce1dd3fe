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


def test_ten_million_rows_never_change_the_argmax():
    """>= 10 million synthetic adversarial rows over a small vocabulary: no disagreement, no bound violation."""
    gen = torch.Generator().manual_seed(1234)
    w, pairs = adversarial_head(32, 32, gen)
    head = R.quantize_head(w)
    pool = adversarial_inputs(w, pairs, 1 << 18, gen).float()  # bf16 values; re-signed and drawn per chunk below
    chunk = 1 << 15

    def chunks():
        for start in range(0, 10_027_008, chunk):
            rows = torch.randint(0, pool.shape[0], (chunk,), generator=gen)
            sign = torch.randint(0, 2, (chunk, 1), generator=gen).float() * 2 - 1
            yield pool[rows] * sign

    stats = R.certified_argmax_chunked(chunks(), head, max_survivors=48)
    assert stats["rows"] >= 10_000_000
    assert stats["bound_violations"] == 0
    assert stats["disagreements"] == 0
    assert stats["survivors_max"] >= 2  # ties and near-ties were exercised
