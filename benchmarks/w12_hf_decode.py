"""Greedy decoding in Hugging Face Transformers, BF16 vs W12 linear layers (issue 9).

Config-built models with seeded random weights (synthetic: weights from a hub cannot be downloaded on the
GPU machine) of the Llama-3.1-8B and Qwen3-8B shapes, or a local checkpoint (``--checkpoint DIR``).
Decoding: prefill, then one token per step with a static KV cache, each step replayed from a CUDA graph
(argmax inside the graph). The same prompts run through the BF16 model, then through the same model
after ``convert_model`` (every decoder linear layer to W12, checked bit for bit). Reports tokens/s,
ms per output token, the weight memory of the linear layers, and token agreement with the first
divergence per request (expected only at near-ties: the products differ by reduction order).

    PYTHONPATH=kernels:. python benchmarks/w12_hf_decode.py [--models llama-3.1-8b,qwen3-8b] [--batches 1,32]
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch

from specpilot_kernels.w12.hf import W12Linear, convert_model

SHAPES = {
    "llama-3.1-8b": ("LlamaConfig", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                                        max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)),
    "qwen3-8b": ("Qwen3Config", dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                     max_position_embeddings=8192, tie_word_embeddings=False)),
}


def build(name: str, device: str, layers: int | None):
    import transformers

    config_cls, kwargs = SHAPES[name]
    if layers:
        kwargs = dict(kwargs, num_hidden_layers=layers)
    config = getattr(transformers, config_cls)(**kwargs)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    with torch.no_grad():  # seeded N(0, 0.02) weights, unit norms: synthetic
        for param_name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return model.eval()


def linear_weight_bytes(model) -> int:
    total = 0
    for module in model.modules():
        if isinstance(module, W12Linear):
            total += sum(b.numel() * b.element_size() for b in module.buffers(recurse=False))
        elif isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


@torch.no_grad()
def greedy(model, prompts: torch.Tensor, new_tokens: int, graphs: bool) -> tuple[torch.Tensor, float, bool]:
    """(generated ids [B, new_tokens], seconds per decode step, whether CUDA graphs were used)."""
    from transformers import StaticCache

    batch, prompt_len = prompts.shape
    cache = StaticCache(config=model.config, max_cache_len=prompt_len + new_tokens + 1)
    positions = torch.arange(prompt_len, device=prompts.device)
    logits = model(input_ids=prompts, cache_position=positions, past_key_values=cache, use_cache=True).logits
    token = logits[:, -1].argmax(-1, keepdim=True)
    step_pos = torch.tensor([prompt_len], device=prompts.device)

    def step():
        out = model(input_ids=token, cache_position=step_pos, past_key_values=cache, use_cache=True).logits
        return out[:, -1].argmax(-1, keepdim=True)

    out = [token.clone()]
    graph = None
    if graphs:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # warm-up (writes position prompt_len, rewritten by the first replay)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                next_token = step()
        except RuntimeError as exc:  # a forward that syncs with the host cannot be captured: time eagerly
            print(f"CUDA graph capture failed ({exc}); timing eager steps", file=sys.stderr)
            graph = None
    if prompts.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        if graph is not None:
            graph.replay()
            token.copy_(next_token)
        else:
            token = step()
        out.append(token.clone())
        step_pos += 1
    if prompts.is_cuda:
        torch.cuda.synchronize()
    per_step = (time.perf_counter() - start) / max(new_tokens - 1, 1)
    return torch.cat(out, dim=1), per_step, graph is not None


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    same = a == b
    first = [int(row.logical_not().nonzero()[0]) if not row.all() else None for row in same]
    return {"tokens_agree": int(same.sum()), "tokens": int(same.numel()),
            "requests_identical": sum(f is None for f in first), "first_divergence": first}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama-3.1-8b,qwen3-8b")
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers (smoke tests)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    graphs = args.device == "cuda"
    doc = {"benchmark": "w12_hf_decode", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "PYTHONPATH=kernels:. python benchmarks/w12_hf_decode.py " + " ".join(sys.argv[1:]),
           "device": torch.cuda.get_device_name() if graphs else "cpu",
           "weights": "synthetic: config-built models with seeded N(0, 0.02) weights", "models": {}}
    for name in args.models.split(","):
        model = build(name, args.device, args.layers)
        vocab = model.config.vocab_size
        torch.manual_seed(1)
        prompts = {b: torch.randint(0, vocab, (b, args.prompt_len), device=args.device)
                   for b in map(int, args.batches.split(","))}
        entry = {"bf16_linear_bytes": linear_weight_bytes(model)}
        bf16 = {b: greedy(model, p, args.new_tokens, graphs) for b, p in prompts.items()}
        t0 = time.perf_counter()
        stats = convert_model(model)
        entry["convert_s"] = time.perf_counter() - t0
        entry["w12_linear_bytes"] = linear_weight_bytes(model)
        entry["freed_bytes"] = entry["bf16_linear_bytes"] - entry["w12_linear_bytes"]
        entry["converted_layers"] = len(stats)
        w12 = {b: greedy(model, p, args.new_tokens, graphs) for b, p in prompts.items()}
        entry["batches"] = {}
        for b in prompts:
            (ids_b, step_b, graph_b), (ids_w, step_w, graph_w) = bf16[b], w12[b]
            entry["batches"][b] = {
                "bf16_ms_per_token": step_b * 1e3, "w12_ms_per_token": step_w * 1e3,
                "bf16_tokens_per_s": b / step_b, "w12_tokens_per_s": b / step_w,
                "speedup": step_b / step_w, "cuda_graphs": graph_b and graph_w, **compare(ids_b, ids_w)}
        doc["models"][name] = entry
        print(json.dumps({name: entry["batches"]}, default=str), file=sys.stderr)
        del model
        if graphs:
            torch.cuda.empty_cache()
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
