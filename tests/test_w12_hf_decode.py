"""The HF decode benchmark (benchmarks/w12_hf_decode.py) end to end on the CPU, with tiny models.

On the CPU a W12 layer computes with its exact decoded weight, so BF16 and W12 greedy tokens must agree
everywhere; the GPU run (CUDA graphs, the mma.sync kernel) is the benchmark itself on the H200.
"""

import json
import sys

import pytest
import torch
import transformers

from benchmarks import w12_hf_decode as bench


SMALL = dict(
    vocab_size=200,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)


def run_main(monkeypatch, capsys, *argv) -> dict:
    monkeypatch.setattr(sys, "argv", ["w12_hf_decode.py", "--device", "cpu", *argv])
    bench.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def checkpoint(tmp_path):
    config = transformers.LlamaConfig(tie_word_embeddings=False, **SMALL)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_checkpoint_decodes_the_same_tokens_in_bf16_and_w12(monkeypatch, capsys, checkpoint, tmp_path):
    doc = run_main(
        monkeypatch,
        capsys,
        "--model",
        str(checkpoint),
        "--batches",
        "1,2",
        "--new-tokens",
        "4",
        "--prompt-len",
        "5",
        "--profile",
    )
    (tmp_path / "result.json").write_text(json.dumps(doc))
    monkeypatch.setattr(sys, "argv", ["w12_hf_decode.py", "--table", str(tmp_path / "result.json")])
    bench.main()
    table = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("| ckpt | ") for line in table) == 2 * 2 + 1  # 2 batches x 2 layouts, memory
    entry = doc["models"]["ckpt"]
    assert doc["device"]["kind"] == "cpu" and entry["weights"] == f"checkpoint {checkpoint}"
    assert entry["fused_groups"] == 2 * 2  # q/k/v and gate/up in each of the two layers
    per_layer, fused = entry["layouts"]["per_layer"], entry["layouts"]["fused"]
    assert per_layer["conversion"]["layers"] == 2 * 7 and fused["conversion"]["layers"] == 2 * 4
    assert per_layer["conversion"]["lm_head_layers"] == fused["conversion"]["lm_head_layers"] == 1
    memory = per_layer["weight_memory"]
    # q, o: 128x128; k, v: 64x128; gate, up, down: 256x128 per layer, the head 200x128, two bytes a weight
    assert (
        memory["bf16_linear_bytes"]
        == fused["weight_memory"]["bf16_linear_bytes"]
        == 2 * (2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 256 * 128) + 200 * 128)
    )
    # per layer, k and v (64 rows, half a 128-row tile) do not pay as W12 and stay BF16; fused with q they do
    kept_kv_bytes = 2 * (2 * 2 * 64 * 128)
    assert memory["linear_bytes_read_per_step"]["w12"] == (
        memory["w12_decoder_linear_bytes"] + 2 * 200 * 128 + kept_kv_bytes
    )
    fused_memory = fused["weight_memory"]
    assert fused_memory["linear_bytes_read_per_step"]["w12"] == fused_memory["w12_decoder_linear_bytes"] + 2 * 200 * 128
    profiles = entry["eager_step_profiles"]
    assert set(profiles) == {"per_layer"} and set(profiles["per_layer"]) == {"bf16", "w12"}
    assert all(p["launches"] > 0 and p["top"] for p in profiles["per_layer"]["w12"].values())
    for batch in ("1", "2"):
        for layout in ("per_layer", "fused"):
            result = entry["batches"][batch][layout]
            assert result["bf16"]["steps_timed"] == 2 and not result["bf16"]["cuda_graph"]
            for variant in ("w12", "w12_lm_head"):
                agree, forced = result[variant]["agreement"], result[variant]["forced_agreement"]
                assert agree["tokens_agree"] == agree["tokens"] == int(batch) * 4
                assert agree["first_divergence"] == [None] * int(batch)
                assert forced["agree"] == forced["positions"] == int(batch) * 4


def test_config_built_shapes_are_synthetic_and_agree(monkeypatch, capsys):
    shrunk = {name: (cls, dict(kwargs, **SMALL)) for name, (cls, kwargs) in bench.SHAPES.items()}
    monkeypatch.setattr(bench, "SHAPES", shrunk)
    doc = run_main(
        monkeypatch, capsys, "--batches", "2", "--new-tokens", "3", "--prompt-len", "4", "--layouts", "per_layer"
    )
    assert set(doc["models"]) == {"llama-3.1-8b", "qwen3-8b"}
    assert doc["models"]["qwen3-8b"]["config"]["model_type"] == "qwen3"
    for entry in doc["models"].values():
        assert entry["weights"].startswith("synthetic") and entry["prompts"].startswith("random")
        assert set(entry["batches"]["2"]) == {"prompt_len", "outside_linears_ms", "per_layer"}
        agree = entry["batches"]["2"]["per_layer"]["w12"]["agreement"]
        assert agree["tokens_agree"] == agree["tokens"] == 6


def test_greedy_continues_the_static_cache_like_a_full_forward():
    config = transformers.LlamaConfig(tie_word_embeddings=False, **SMALL)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    prompts = torch.randint(0, 200, (2, 5))
    decode = bench.greedy(model, prompts, new_tokens=4, graphs=False)
    ids = prompts
    with torch.no_grad():  # the same tokens without a cache: the whole sequence again at every step
        for _ in range(4):
            ids = torch.cat([ids, model(ids).logits[:, -1].float().argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(decode.tokens, ids[:, 5:])
    assert (decode.margins >= 0).all() and len(decode.step_s) == 2
    forced_ids, forced_margins = bench.forced_top2(model, prompts, decode.tokens)
    assert torch.equal(forced_ids, ids[:, 5:]) and forced_margins.shape == (2, 4)


def test_linears_skipped_returns_zeros_and_restores_the_layers():
    config = transformers.LlamaConfig(tie_word_embeddings=False, **SMALL)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 200, (1, 3))
    with torch.no_grad():
        before = model(ids).logits
        with bench.linears_skipped(model):
            assert not model.model.layers[0].mlp.down_proj(torch.ones(1, 256, dtype=torch.bfloat16)).any()
            assert not model(ids).logits.any()
        assert torch.equal(model(ids).logits, before)


@pytest.mark.parametrize(
    "argv, message",
    [(["--model", "missing-dir"], "neither a shape"), (["--layouts", "per_layer,packed"], "choose from")],
)
def test_bad_arguments_are_usage_errors(monkeypatch, capsys, argv, message):
    with pytest.raises(SystemExit):
        run_main(monkeypatch, capsys, *argv)
    assert message in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.parametrize("fused", [False, True])
def test_graph_replayed_w12_decode_equals_eager_decode_on_gpu(fused):
    from specpilot_kernels.w12.hf import convert_model, fuse_shared_input_projections

    config = transformers.LlamaConfig(tie_word_embeddings=False, **SMALL)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device="cuda", dtype=torch.bfloat16).eval()
    if fused:
        fuse_shared_input_projections(model)
    convert_model(model, lm_head=True)
    prompts = torch.randint(0, 200, (3, 5), device="cuda")
    replayed = bench.greedy(model, prompts, new_tokens=6, graphs=True)
    eager = bench.greedy(model, prompts, new_tokens=6, graphs=False)
    assert replayed.cuda_graph and torch.equal(replayed.tokens, eager.tokens)
    assert torch.equal(replayed.margins, eager.margins)
