"""Q-pass agreement measurement (benchmarks/w12_qpass_agreement.py) on a tiny seeded engine model."""

import torch

from benchmarks import w12_qpass_agreement as qpass
from conftest import tiny_pair

from specpilot_mem.engine.model import HybridTarget


def tiny_target():
    torch.manual_seed(0)
    cfg, _ = tiny_pair(d_model=64, head_dim=32)
    return HybridTarget(cfg).to(torch.bfloat16).eval()


def test_qpass_copy_changes_only_the_dropped_low_bits():
    target = tiny_target()
    quantized = qpass.qpass_copy(target, "midpoint")
    exact = target.blocks[0].mlp.down.weight.float()
    view = quantized.blocks[0].mlp.down.weight.float()
    assert not torch.equal(exact, view)
    beyond = (view - exact).abs() > exact.abs() / 16
    assert (view[beyond] == 0).all()  # only escapes below the window, which the view reads as zero
    assert torch.equal(quantized.embed.weight, target.embed.weight)  # only linear weights move


def test_agreement_is_a_fraction_and_exact_for_the_exact_model():
    target = tiny_target()
    tokens = torch.randint(0, 256, (2, 24))
    result = qpass.agreement(target, tokens, "midpoint", head=True)
    assert result["positions"] == 48 and 0.0 <= result["top1_agreement"] <= 1.0
    hidden, _ = target.forward_train(tokens)
    assert torch.equal(hidden, target.forward_train(tokens)[0])  # deterministic reference
