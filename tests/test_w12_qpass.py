"""Q-pass agreement measurement (benchmarks/w12_qpass_agreement.py) on a tiny seeded engine model."""

import torch

from benchmarks import w12_qpass_agreement as qpass

from specpilot_mem.engine import TargetConfig
from specpilot_mem.engine.model import HybridTarget


def tiny_target():
    torch.manual_seed(0)
    cfg = TargetConfig(
        vocab_size=256,
        d_model=64,
        layer_types=("gdn", "attn"),
        ffn_dim=128,
        gdn_heads=2,
        gdn_head_dim=32,
        attn_heads=2,
        attn_kv_heads=1,
        attn_head_dim=32,
        feature_layers=(0, 1),
    )
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
