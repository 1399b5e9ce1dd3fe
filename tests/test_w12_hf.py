"""W12 in Hugging Face Transformers: a config-built Llama converts and gives the same logits."""

import pytest
import torch

import transformers  # installed by scripts/install.sh with SGLang's import dependencies

from specpilot_kernels.w12 import W12Error
from specpilot_kernels.w12.hf import ProjectionSlice, W12Linear, convert_model, fuse_shared_input_projections


def tiny_llama(tie: bool, kv_heads: int = 4):
    # every projection a whole number of 128-row tiles, so W12 pays for each (kv_heads=2: k/v have 64 rows)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()


@pytest.mark.parametrize("lm_head", [False, True])
def test_converted_llama_gives_identical_logits(lm_head):
    model = tiny_llama(tie=False)
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        before = model(ids).logits
        stats = convert_model(model, lm_head=lm_head)
        after = model(ids).logits
    assert torch.equal(before, after)
    assert len(stats) == 2 * 7 + int(lm_head)  # q, k, v, o, gate, up, down per layer (+ head)
    assert isinstance(model.model.layers[0].mlp.down_proj, W12Linear)
    assert isinstance(model.lm_head, W12Linear) == lm_head
    assert all(s["bits_per_weight"] > 12.0 and s["escape_fraction"] < 1e-2 for s in stats.values())


def test_layers_where_w12_does_not_pay_stay_bf16():
    model = tiny_llama(tie=False, kv_heads=2)  # k_proj, v_proj: 64 x 128, padded to a 128-row tile: 24 bits a weight
    ids = torch.randint(0, 128, (1, 5))
    with torch.no_grad():
        before = model(ids).logits
        stats = convert_model(model)
        after = model(ids).logits
    assert torch.equal(before, after)
    kept = sorted(name for name, s in stats.items() if s["kept_bf16"])
    assert kept == [f"model.layers.{i}.self_attn.{p}" for i in range(2) for p in ("k_proj", "v_proj")]
    assert type(model.model.layers[0].self_attn.k_proj) is torch.nn.Linear
    assert isinstance(model.model.layers[0].self_attn.q_proj, W12Linear)
    head_stats = convert_model(model, lm_head=True, decoder=False)  # the kept layers are not encoded again
    assert list(head_stats) == ["lm_head"] and isinstance(model.lm_head, W12Linear)
    assert type(model.model.layers[0].self_attn.k_proj) is torch.nn.Linear


def test_tied_head_stays_bf16():
    model = tiny_llama(tie=True)
    convert_model(model, lm_head=True)
    assert isinstance(model.lm_head, torch.nn.Linear)


def test_conversion_stops_at_a_bad_tensor_before_replacing_it(monkeypatch):
    model = tiny_llama(tie=False)
    import specpilot_kernels.w12.hf as hf

    def broken_encode(weight, name="weight"):
        raise W12Error("differs", where=name)

    monkeypatch.setattr(hf, "encode_or_keep", broken_encode)
    with pytest.raises(W12Error):
        convert_model(model)
    assert isinstance(model.model.layers[0].self_attn.q_proj, torch.nn.Linear)


@pytest.mark.gpu
def test_converted_llama_on_gpu_uses_the_mma_layout_and_matches_bf16():
    from specpilot_kernels.w12 import W12MmaTensor

    model = tiny_llama(tie=False).cuda()
    ids = torch.randint(0, 128, (2, 7), device="cuda")
    with torch.no_grad():
        before = model(ids).logits.float()
        convert_model(model, lm_head=True)
        after = model(ids).logits.float()
    assert isinstance(model.model.layers[1].self_attn.o_proj.w12, W12MmaTensor)
    assert ((after - before).norm() / before.norm()).item() < 1e-2  # same weights, other reduction order


def test_fused_projections_match_and_convert_exactly():
    model = tiny_llama(tie=False, kv_heads=2)  # k, v alone would stay BF16; fused with q they fill two tiles
    ids = torch.randint(0, 128, (2, 7))
    with torch.no_grad():
        before = model(ids).logits
        assert fuse_shared_input_projections(model) == 2 * 2
        fused = model(ids).logits
        stats = convert_model(model)
        after = model(ids).logits
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.k_proj, ProjectionSlice) and attention.k_proj.out_features == 64
    assert isinstance(attention.fused_q_k_v.fused, W12Linear) and attention.fused_q_k_v.sizes == [128, 64, 64]
    assert len(stats) == 2 * 4  # the q/k/v group, o, the gate/up group, down per layer
    assert not any(s["kept_bf16"] for s in stats.values())
    torch.testing.assert_close(fused, before, rtol=0, atol=1e-2)  # the same sums, maybe in another order
    assert torch.equal(after, fused)


def test_a_group_member_recomputes_for_another_or_modified_input():
    model = tiny_llama(tie=False)
    fuse_shared_input_projections(model)
    mlp = model.model.layers[0].mlp
    x, other = torch.randn(3, 128, dtype=torch.bfloat16), torch.randn(3, 128, dtype=torch.bfloat16)
    weight = mlp.fused_gate_up.fused.weight
    with torch.no_grad():
        gate = mlp.gate_proj(x)
        up_other = mlp.up_proj(other)  # not the gate's input: its own product, not the cached slice
        assert torch.equal(up_other, torch.nn.functional.linear(other, weight[256:]))
        x.mul_(2)  # modified in place since the gate read it
        assert torch.equal(mlp.up_proj(x), torch.nn.functional.linear(x, weight[256:]))
    assert torch.equal(gate, torch.nn.functional.linear(x / 2, weight[:256]))
