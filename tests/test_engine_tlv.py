"""The TLV cycle on the real pure-torch engine (a tiny random model, synthetic): lossless whatever the Q pass says,
the Q pass writes nothing, τ counted per exact pass, the lossy variant detectably lossy."""

from __future__ import annotations

import pytest
import torch

from specpilot_mem.controller.engine_system import EngineSystem
from specpilot_mem.controller.requests import Request
from conftest import tiny_pair
from specpilot_mem.engine.config import EngineOptions
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.model import make_rows
from specpilot_mem.engine.tlv import TlvOptions, TwoLevelEngine, matching_path, qpass_weights
from specpilot_mem.errors import SpecPilotError

TARGET, DRAFTER = tiny_pair()
PROMPTS = [[5, 17, 33, 2, 90, 41], [200, 3, 3, 7]]


@pytest.fixture(scope="module")
def engine():
    return Engine.random(3, TARGET, DRAFTER, options=EngineOptions(positions=4), max_len=256)


@pytest.fixture(scope="module")
def greedy(engine):
    return [g.output_ids for g in engine.generate(PROMPTS, "ar", max_new_tokens=20)]


def test_tlv_decodes_the_targets_greedy_tokens(engine, greedy):
    tlv = TwoLevelEngine(engine, TlvOptions(nodes=8, positions=4, measure_agreement=True))
    runs = tlv.generate(PROMPTS, max_new_tokens=20)
    assert [r.output_ids for r in runs] == greedy
    for run in runs:
        # tau per exact pass: every cycle is one exact pass; the first token comes from the prefill
        assert run.steps == len(run.accepted) == len(run.chain) == len(run.step_times)
        assert sum(run.accepted) >= 19 and all(1 <= a <= 8 + 1 for a in run.accepted)
        assert all(1 <= c <= 8 for c in run.chain)
        assert 0 < run.compared and 0 <= run.agree <= run.compared and run.chain_agree <= run.chain_compared


def test_the_qpass_writes_nothing(engine):
    tlv = TwoLevelEngine(engine, TlvOptions(nodes=6, positions=4))
    engine.cache.reset()
    engine.prefill([5, 17, 33, 2])
    cache = engine.cache
    before = {
        name: [t.clone() for t in group.values()]
        for name, group in (
            ("keys", cache.keys),
            ("values", cache.values),
            ("state", cache.state),
            ("conv", cache.conv),
        )
    }
    features, length = cache.features.clone(), cache.length
    rows = make_rows([90, 4, 8, 9], [-1, 0, 0, 1], TARGET.conv_size, engine.device)
    logits, feats = tlv.qpass(rows)
    assert logits.shape == (4, TARGET.vocab_size) and feats.shape == (4, TARGET.feature_dim)
    for name, group in (("keys", cache.keys), ("values", cache.values), ("state", cache.state), ("conv", cache.conv)):
        assert all(torch.equal(a, b) for a, b in zip(before[name], group.values())), name
    assert torch.equal(features, cache.features) and cache.length == length
    # the exact verify of the same rows does write its scratch slots (what the Q pass avoids)
    engine.verify(rows)
    assert not all(torch.equal(a, b) for a, b in zip(before["keys"], cache.keys.values()))


def test_qpass_weights_are_the_8_bit_view(engine):
    from specpilot_kernels.w12 import encode
    from specpilot_kernels.w12.reference import qpass_weight_reference

    blocks, head = qpass_weights(engine.target)
    linear = engine.target.blocks[0].mixer.qkv.weight
    expected = qpass_weight_reference(encode(linear.detach().bfloat16())).float()
    assert torch.equal(blocks["blocks.0.mixer.qkv.weight"], expected)
    assert not torch.equal(expected, linear)  # the view drops low mantissa bits
    assert set(blocks) == {
        f"blocks.{n}" for n, p in engine.target.blocks.named_parameters() if p.dim() == 2 and n.endswith(".weight")
    }
    assert head.shape == engine.target.lm_head_weight.shape


def test_a_qpass_wrong_everywhere_still_gives_the_exact_outputs(engine, greedy):
    # the Q pass's weights replaced by noise: C is mostly the root's bonus alone, the exact pass still decides
    tlv = TwoLevelEngine(engine, TlvOptions(nodes=8, positions=4))
    torch.manual_seed(0)
    tlv._q_params = {name: torch.randn_like(w) for name, w in tlv._q_params.items()}
    tlv._q_head = torch.randn_like(tlv._q_head)
    runs = tlv.generate(PROMPTS, max_new_tokens=20)
    assert [r.output_ids for r in runs] == greedy
    lossy = TwoLevelEngine(engine, TlvOptions(nodes=8, positions=4, accept_from_qpass=True))
    lossy._q_params, lossy._q_head = tlv._q_params, tlv._q_head
    assert [r.output_ids for r in lossy.generate(PROMPTS, max_new_tokens=20)] != greedy


def test_the_tlv_engine_serves_as_a_controller_system(engine, greedy):
    tlv = TwoLevelEngine(engine, TlvOptions(nodes=8, positions=4))
    system = EngineSystem("tlv", tlv, mode="tlv")
    outputs = system.run([Request("a", "code", "dev", 20, prompt_ids=tuple(PROMPTS[0]))], batch_size=1, device="cpu")
    assert list(outputs[0].output_ids) == greedy[0] and len(outputs[0].token_times) == 20


def test_matching_path_follows_the_argmax():
    tokens, parents = [0, 5, 6, 7, 8], [-1, 0, 0, 1, 2]
    assert matching_path(tokens, parents, [6, 0, 8, 0, 0]) == [0, 2, 4]
    assert matching_path(tokens, parents, [9, 0, 0, 0, 0]) == [0]


def test_bad_options_are_refused(engine):
    with pytest.raises(SpecPilotError, match="positions"):
        TwoLevelEngine(engine, TlvOptions(positions=5))
    with pytest.raises(SpecPilotError, match="low_bits"):
        TwoLevelEngine(engine, TlvOptions(positions=4, low_bits="exact"))
    with pytest.raises(SpecPilotError, match="mode"):
        TwoLevelEngine(engine, TlvOptions(positions=4)).generate(PROMPTS, mode="spec")
