"""The TLV cycle on the system engine (SystemModel / SystemDecoder, CPU float32): the target's greedy tokens whatever
the Q pass says, a Q pass that writes nothing, τ counted per exact pass, the lossy variant detectably lossy, and the
option checks."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import tiny_pair
from specpilot_mem.engine.config import EngineOptions
from specpilot_mem.engine.decode import SystemDecoder
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.options import OptionsError, SystemOptions
from specpilot_mem.engine.tlv_system import SystemTwoLevel, qpass_view_weights, tokens_per_pass
from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR, has_trained_pair

TARGET, DRAFTER = tiny_pair(d_model=64)  # W12 takes hidden sizes in multiples of 64
PROMPTS = [[5, 17, 33, 2, 90, 41], [200, 3, 3, 7]]
EXACT = SystemOptions(linears="w12", lm_head="w12", gdn_verify="path", tree="best-first", nodes=8, positions=4)


@pytest.fixture(scope="module")
def decoder():
    engine = Engine.random(3, TARGET, DRAFTER, options=EngineOptions(positions=4), max_len=256)
    return SystemDecoder(engine, EXACT, batch=1, max_len=160)


@pytest.fixture(scope="module")
def greedy(decoder):
    return [g.output_ids for g in decoder.generate(PROMPTS, "ar", max_new_tokens=20)]


def noise_qpass(tlv: SystemTwoLevel, seed: int = 0):
    """Replace the Q pass by noise: random tokens as its argmax (its features kept, so the second draft still runs)."""
    real, rng = tlv.qpass, random.Random(seed)

    def qpass(tree, produced):
        _, feats = real(tree, produced)
        return [rng.randrange(TARGET.vocab_size) for _ in range(tlv.buf.shape[1])], feats

    tlv.qpass = qpass


def test_tlv_decodes_the_targets_greedy_tokens(decoder, greedy):
    runs = SystemTwoLevel(decoder).generate(PROMPTS, max_new_tokens=20)
    assert [r.output_ids for r in runs] == greedy
    for run in runs:
        # one exact pass a cycle; the first token comes from the prefill
        assert run.steps == len(run.accepted) == len(run.chain) == len(run.step_times)
        assert sum(run.accepted) >= 19 and all(1 <= a <= EXACT.nodes + 1 for a in run.accepted)
        assert all(1 <= c <= EXACT.nodes for c in run.chain)
        assert 0 < run.chain_compared and 0 <= run.chain_agree <= run.chain_compared
    assert tokens_per_pass(runs) == sum(sum(r.accepted) for r in runs) / sum(len(r.accepted) for r in runs)


def test_a_qpass_of_noise_still_gives_the_exact_tokens(decoder, greedy):
    tlv = SystemTwoLevel(decoder, "truncated")
    noise_qpass(tlv)
    assert [r.output_ids for r in tlv.generate(PROMPTS, max_new_tokens=20)] == greedy


def test_accept_from_qpass_is_lossy_with_a_wrong_qpass(decoder, greedy):
    tlv = SystemTwoLevel(decoder, accept_from_qpass=True)
    noise_qpass(tlv, seed=1)
    runs = tlv.generate(PROMPTS, max_new_tokens=20)
    assert [r.output_ids for r in runs] != greedy
    # it committed C whole every cycle: |C| drafted tokens and the exact bonus
    assert all(a == c + 1 for r in runs for a, c in zip(r.accepted, r.chain))


def test_the_qpass_writes_nothing(decoder):
    tlv = SystemTwoLevel(decoder)
    decoder.prefill(0, PROMPTS[0])
    caches = decoder.caches
    before = {
        "lengths": caches.lengths.clone(),
        "features": caches.features.clone(),
        **{f"k{i}": t.clone() for i, t in caches.k.items()},
        **{f"v{i}": t.clone() for i, t in caches.v.items()},
        **{f"state{i}": t.clone() for i, t in caches.state.items()},
        **{f"conv{i}": t.clone() for i, t in caches.conv.items()},
    }
    tree = decoder.draft_trees([7], [0])[0]
    best, feats = tlv.qpass(tree, 1)
    assert len(best) == tlv.buf.shape[1] and feats.shape[0] == tlv.buf.shape[1]
    length = int(before["lengths"][0])
    for name, value in before.items():
        now = {
            "lengths": caches.lengths,
            "features": caches.features,
            **{f"k{i}": t for i, t in caches.k.items()},
            **{f"v{i}": t for i, t in caches.v.items()},
            **{f"state{i}": t for i, t in caches.state.items()},
            **{f"conv{i}": t for i, t in caches.conv.items()},
        }[name]
        if name[0] in "kv" and name[1:].isdigit():  # the rows' keys sit in the cache's last slots, past every length
            now, value = now[:, :, :length], value[:, :, :length]
        assert torch.equal(now, value), name


def test_the_cpu_qpass_weights_are_the_views_values(decoder):
    from specpilot_kernels.w12 import encode
    from specpilot_kernels.w12.reference import qpass_weight_reference

    view = qpass_view_weights(decoder.weights, "truncated")
    name = next(n for n in decoder.weights.linears if n.endswith("gate_up.w"))
    want = qpass_weight_reference(encode(decoder.weights.linears[name].weight.to(torch.bfloat16)), "truncated")
    assert torch.equal(view.linears[name].weight, want.float())
    assert torch.equal(view.t["embed"], decoder.weights.t["embed"])  # the embedding is not a linear: exact
    assert not torch.equal(view.t["head"], decoder.weights.t["embed"])


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (dict(batch=2), "one request at a time"),
        (dict(options=EXACT.replace(tree="chain")), "needs a tree and W12"),
        (dict(options=EXACT.replace(linears="bf16")), "needs a tree and W12"),
        (dict(low_bits="nibble"), "unknown Q-pass low bits"),
    ],
)
def test_refused_setups_say_what_to_change(decoder, change, fragment):
    low_bits = change.pop("low_bits", "midpoint")
    target = decoder.with_options(change.get("options", EXACT), batch=change.get("batch", 1))
    with pytest.raises(OptionsError, match=fragment):
        SystemTwoLevel(target, low_bits)


def test_too_short_a_cache_is_refused_before_decoding(decoder):
    with pytest.raises(OptionsError, match="cache slots"):
        SystemTwoLevel(decoder).generate([list(range(100))], max_new_tokens=64)


@pytest.mark.skipif(not has_trained_pair(), reason="needs the trained pair under models/")
def test_trained_pair_tlv_is_token_identical_to_ar():
    import json

    engine = Engine.load_default()
    prompt = json.loads((DEFAULT_MODEL_DIR / "greedy-reference.json").read_text())["prompts"][0][:24]
    options = EXACT.replace(nodes=16, positions=8)
    dec = SystemDecoder(engine, options, batch=1, max_len=160)
    want = dec.generate([prompt], "ar", max_new_tokens=24)[0].output_ids
    run = SystemTwoLevel(dec).generate([prompt], max_new_tokens=24)[0]
    assert run.output_ids == want and sum(run.accepted) / len(run.accepted) > 1
