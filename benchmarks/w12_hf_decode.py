"""Greedy decoding in Hugging Face Transformers, BF16 vs W12 linear layers (issue 9).

Models: config-built Llama-3.1-8B and Qwen3-8B shapes with seeded random BF16 weights made on the GPU
(synthetic: weights from a hub cannot be downloaded on the GPU machine), or any local checkpoint
directory (``--model PATH``; its tokenizer, if it has one, turns a fixed English text into the prompts).

Decoding: one prefill, then one token per step with a ``StaticCache``; the step (forward, top-2 of the
last logits, writing the token into static buffers) is captured once in a ``torch.cuda.CUDAGraph`` and
replayed, so the timed loop is graph replays only. The same prompts run through the BF16 model, the
same model after ``convert_model`` (every decoder linear layer to W12, each checked bit for bit), and
after converting the LM head too; all of it in two layouts: the HF layers as loaded, and with q/k/v and
gate/up fused into one GEMM each (BF16 and W12 alike, as serving engines run them).

Reported per batch: ms per step (= ms per output token of each request), tokens/s, speedup over BF16;
the step's make-up (the same step with every linear layer a no-op gives the time outside the linears,
the rest is the linears, compared with their byte floor at the measured read bandwidth); agreement
with BF16, free-running (first divergence per request, the BF16 top-1/top-2 margin there) and on the
same prefixes (every generated position re-predicted from the BF16 text: differences are expected only
at near-ties, the kernels sum in another order than cuBLAS); weight memory and the bytes freed.

    PYTHONPATH=kernels:. python benchmarks/w12_hf_decode.py [--model llama-3.1-8b --model PATH ...]
        [--batches 1,32] [--prompt-len 32] [--new-tokens 64] [--layouts per_layer,fused] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from specpilot_kernels.w12.hf import W12Linear, convert_model, fuse_shared_input_projections
from specpilot_mem.provenance import print_result, result_header, write_result

LLAMA_31_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    rope_parameters=dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    ),
)
QWEN3_8B = dict(
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
)
SHAPES = {"llama-3.1-8b": ("LlamaConfig", LLAMA_31_8B), "qwen3-8b": ("Qwen3Config", QWEN3_8B)}

# prompt i of a checkpoint with a tokenizer starts at word 3*i of this text (distinct natural prompts)
PROMPT_TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
    "movable metal type, oil-based ink and a wooden screw press into a system that could produce books far "
    "faster than any scribe. Within fifty years presses were running in more than two hundred cities across "
    "Europe, and the price of a book fell so far that merchants, students and craftsmen could own them. "
    "Scholars began to compare editions, correct errors and publish tables of data, which changed how "
    "knowledge accumulated. Pamphlets spread political and religious arguments within weeks, newspapers "
    "appeared in the seventeenth century, and by the industrial age steam-driven rotary presses printed "
    "thousands of sheets an hour for a growing reading public that expected news every single morning."
)


STARTED = time.perf_counter()


def log(*args) -> None:
    print(f"[{time.perf_counter() - STARTED:6.1f} s]", *args, file=sys.stderr, flush=True)


def kernel_sources() -> dict[str, str]:
    """sha256 (first 16 hex digits) of each W12 library source: which kernel version was measured."""
    import specpilot_kernels.w12 as w12

    root = Path(w12.__file__).parent
    files = sorted([*root.glob("*.py"), *root.glob("csrc/*")])
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in files}


def synthetic_model(name: str, device: str, layers: int | None) -> nn.Module:
    """A config-built model of a named shape, all weights seeded N(0, 0.02) BF16 made on ``device``."""
    import transformers

    config_name, kwargs = SHAPES[name]
    if layers:
        kwargs = dict(kwargs, num_hidden_layers=layers)
    config = getattr(transformers, config_name)(**kwargs)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    torch.manual_seed(0)
    with torch.no_grad():  # our own init, so the weights do not depend on the transformers version
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.02)
    return model.eval()


def checkpoint_model(path: Path, device: str) -> nn.Module:
    """A local checkpoint directory's causal LM, loaded in BF16 onto ``device``."""
    import importlib.util

    import transformers

    if importlib.util.find_spec("accelerate"):  # transformers places weights on the device only through it
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map=device)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device)
    return model.eval()


def checkpoint_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when it has no tokenizer files (then: random-token prompts)."""
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        return None


def make_prompts(vocab: int, tokenizer, batch: int, prompt_len: int, device: str) -> torch.Tensor:
    """int64 [batch, L]: seeded random tokens, or slices of PROMPT_TEXT through ``tokenizer``, all cut to the
    shortest (L <= prompt_len) so no request needs padding."""
    if tokenizer is None:
        generator = torch.Generator().manual_seed(1)
        return torch.randint(0, vocab, (batch, prompt_len), generator=generator).to(device)
    words = PROMPT_TEXT.split()
    rows = [
        tokenizer(" ".join(words[(3 * i) % len(words) :]), add_special_tokens=True)["input_ids"] for i in range(batch)
    ]
    length = min(prompt_len, *(len(r) for r in rows))
    return torch.tensor([r[:length] for r in rows], device=device)


@dataclass
class Decode:
    tokens: torch.Tensor  # int64 [B, T] greedy tokens (the first from the prefill)
    margins: torch.Tensor  # float32 [B, T] top-1 minus top-2 logit at each token
    step_s: list[float]  # seconds of each timed decode step
    cuda_graph: bool
    graph_error: str | None = None


@torch.no_grad()
def greedy(model: nn.Module, prompts: torch.Tensor, new_tokens: int, graphs: bool) -> Decode:
    """Prefill, one eager decode step (warm-up: kernels load and compile), then new_tokens - 2 timed steps,
    replayed from one captured CUDA graph when ``graphs``.

    The StaticCache keeps its write position on the device and advances it inside each step, so the
    captured step needs no host-side inputs: the token it reads is the one the previous replay wrote.
    """
    from transformers import StaticCache

    batch, prompt_len = prompts.shape
    device = prompts.device
    cache = StaticCache(config=model.config, max_cache_len=prompt_len + new_tokens)
    tokens = torch.zeros(batch, new_tokens, dtype=torch.long, device=device)
    margins = torch.zeros(batch, new_tokens, dtype=torch.float32, device=device)
    slot = torch.zeros(1, dtype=torch.long, device=device)
    token = torch.zeros(batch, 1, dtype=torch.long, device=device)

    def emit(last_logits: torch.Tensor) -> None:
        top = last_logits.float().topk(2, dim=-1)
        token.copy_(top.indices[:, :1])
        tokens.index_copy_(1, slot, token)
        margins.index_copy_(1, slot, top.values[:, :1] - top.values[:, 1:])
        slot.add_(1)

    def step() -> None:
        emit(model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1])

    emit(model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1])
    graph, graph_error = None, None
    if graphs:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
        except RuntimeError as exc:  # a forward that syncs with the host cannot be captured: time eager steps
            log(f"CUDA graph capture failed ({exc}); timing eager steps")
            graph, graph_error = None, str(exc)
    else:
        step()
    run = graph.replay if graph is not None else step
    step_s = []
    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(new_tokens - 1)]
        events[0].record()
        for event in events[1:]:
            run()
            event.record()
        torch.cuda.synchronize()
        step_s = [a.elapsed_time(b) / 1e3 for a, b in zip(events, events[1:])]
    else:
        for _ in range(new_tokens - 2):
            start = time.perf_counter()
            run()
            step_s.append(time.perf_counter() - start)
    del graph
    return Decode(tokens.cpu(), margins.cpu(), step_s, graphs and graph_error is None, graph_error)


@torch.no_grad()
def step_profile(model: nn.Module, prompts: torch.Tensor, top: int = 12) -> dict:
    """Device time of one eager decode step by kernel (torch profiler; on the CPU, by operator): the
    kernels of the step, the largest first, beside the graph-timed split into linears and the rest."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import StaticCache

    cuda = prompts.is_cuda
    cache = StaticCache(config=model.config, max_cache_len=prompts.shape[1] + 1)
    logits = model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    token = logits[:, -1].argmax(-1, keepdim=True)
    if cuda:
        torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        model(input_ids=token, past_key_values=cache, use_cache=True)
        if cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    kernels = sorted((e for e in prof.key_averages() if getattr(e, key) > 0), key=lambda e: -getattr(e, key))
    return {
        "kernel_us_total": sum(getattr(e, key) for e in kernels),
        "launches": sum(e.count for e in kernels),
        "top": [{"name": e.key[:120], "us": getattr(e, key), "count": e.count} for e in kernels[:top]],
    }


@contextlib.contextmanager
def linears_skipped(model: nn.Module):
    """Every linear layer (BF16 or W12) returns a fixed zero tensor of its output shape: what remains of a
    step is the time outside the linear layers (attention, norms, rotary, the cache, top-2)."""
    zeros: dict[tuple, torch.Tensor] = {}

    def no_op(module, x):
        key = (id(module), tuple(x.shape))
        if key not in zeros:  # allocated in the eager warm-up step, reused by the captured one
            zeros[key] = x.new_zeros(*x.shape[:-1], module.out_features)
        return zeros[key]

    patched = [m for m in model.modules() if isinstance(m, (nn.Linear, W12Linear))]
    for module in patched:
        module.forward = lambda x, module=module: no_op(module, x)
    try:
        yield
    finally:
        for module in patched:
            del module.forward


def linear_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes of the linear layers' weights, BF16 and W12 (buffers of W12Linear), and of the LM head."""
    head = model.get_output_embeddings()
    counts = {"bf16": 0, "w12": 0, "lm_head": 0}
    for module in model.modules():
        if isinstance(module, W12Linear):
            size = sum(b.numel() * b.element_size() for b in module.buffers(recurse=False))
            counts["w12"] += size
        elif isinstance(module, nn.Linear):
            size = module.weight.numel() * module.weight.element_size()
            counts["bf16"] += size
        else:
            continue
        if module is head:
            counts["lm_head"] = size
    return counts


def allocated_bytes(device: str) -> int | None:
    if device != "cuda":
        return None
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


def agreement(reference: Decode, other: Decode) -> dict:
    """Free-running greedy tokens equal position by position; per request the first divergence and the
    reference's top-1/top-2 margin there (both runs saw the same prefix up to that token)."""
    same = reference.tokens == other.tokens
    first, margin_there = [], []
    for row, equal in enumerate(same):
        diverged = (~equal).nonzero()
        first.append(int(diverged[0]) if len(diverged) else None)
        margin_there.append(None if first[-1] is None else float(reference.margins[row, first[-1]]))
    return {
        "tokens_agree": int(same.sum()),
        "tokens": same.numel(),
        "requests_identical": sum(f is None for f in first),
        "first_divergence": first,
        "bf16_margin_at_divergence": margin_there,
    }


@torch.no_grad()
def forced_top2(model: nn.Module, prompts: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's top-1 ids and top-1 minus top-2 margins, int64 and float32 [B, T], at every generated
    position of ``tokens`` [B, T] when it reads prompt + tokens in one causal forward (no cache): each
    position's prediction from the same prefix, whatever an earlier position predicted."""
    sequence = torch.cat([prompts, tokens[:, :-1].to(prompts.device)], dim=1)
    logits = model(input_ids=sequence, use_cache=False, logits_to_keep=tokens.shape[1]).logits
    top = logits.float().topk(2, dim=-1)
    return top.indices[..., 0].cpu(), (top.values[..., 0] - top.values[..., 1]).cpu()


def forced_agreement(reference: tuple[torch.Tensor, torch.Tensor], other: tuple[torch.Tensor, torch.Tensor]) -> dict:
    """Position-wise top-1 agreement on the same prefixes; where they differ, the BF16 margin (a near-tie
    is a margin of a few BF16 logit steps), and how many positions have a margin that small at all."""
    ids, margins = reference
    differ = ids != other[0]
    result = {"positions": ids.numel(), "agree": int((~differ).sum()), "bf16_median_margin": float(margins.median())}
    if differ.any():
        worst = float(margins[differ].max())
        result.update(
            max_bf16_margin_where_differ=worst, positions_with_bf16_margin_at_most_that=int((margins <= worst).sum())
        )
    return result


def timing(decode: Decode, batch: int) -> dict:
    mean = statistics.fmean(decode.step_s)
    return {
        "ms_per_step_mean": mean * 1e3,
        "ms_per_step_median": statistics.median(decode.step_s) * 1e3,
        "tokens_per_s": batch / mean,
        "steps_timed": len(decode.step_s),
        "cuda_graph": decode.cuda_graph,
        **({"graph_error": decode.graph_error} if decode.graph_error else {}),
    }


VARIANTS = ("bf16", "w12", "w12_lm_head")  # BF16; decoder linears in W12; the LM head too


def measure_layout(model: nn.Module, prompts: dict[int, torch.Tensor], args, outside: dict | None) -> dict:
    """Decode every batch with the BF16 model, then after converting its decoder linears, then its LM head
    (the model is converted in place). Times the outside-linears step too when ``outside`` is a dict."""
    graphs = args.device == "cuda"
    decode = lambda p: greedy(model, p, args.new_tokens, graphs)  # noqa: E731
    runs: dict[str, dict[int, Decode]] = {v: {} for v in VARIANTS}
    forced: dict[str, dict[int, tuple]] = {v: {} for v in VARIANTS}
    profiles: dict[str, dict[int, dict]] = {}

    def measure(variant: str) -> None:
        for b, p in prompts.items():
            log(f"  {variant}, {b} request(s)")
            runs[variant][b] = decode(p)
            forced[variant][b] = forced_top2(model, p, runs["bf16"][b].tokens)
            if outside is not None and variant == "bf16":
                with linears_skipped(model):
                    outside[b] = decode(p)
            if args.profile and outside is not None and variant != "w12_lm_head":
                profiles.setdefault(variant, {})[b] = step_profile(model, p)

    bytes_bf16 = linear_bytes(model)
    measure("bf16")
    memory_before = allocated_bytes(args.device)
    start = time.perf_counter()
    stats = convert_model(model)
    if graphs:
        torch.cuda.synchronize()
    convert_s = time.perf_counter() - start
    memory_after = allocated_bytes(args.device)
    bytes_w12 = linear_bytes(model)
    measure("w12")
    head_stats = convert_model(model, lm_head=True, decoder=False)  # empty when tied
    bytes_w12_head = linear_bytes(model)
    if head_stats:
        measure("w12_lm_head")
    memory_head = allocated_bytes(args.device)
    bits = [s["bits_per_weight"] for s in stats.values()]
    escapes = [s["escape_fraction"] for s in stats.values()]
    return {
        "runs": runs,
        "forced": forced,
        "profiles": profiles,
        "conversion": {
            "layers": len(stats),
            "seconds": convert_s,
            "lm_head_layers": len(head_stats),
            "bits_per_weight": [min(bits), max(bits)],
            "escape_fraction": [min(escapes), max(escapes)],
            "checked_bit_for_bit": True,
        },
        "weight_memory": {
            "bf16_linear_bytes": bytes_bf16["bf16"],
            "w12_decoder_linear_bytes": bytes_w12["w12"],
            "bf16_lm_head_bytes": bytes_bf16["lm_head"],
            "w12_lm_head_bytes": bytes_w12_head["lm_head"] if head_stats else None,
            "linear_bytes_read_per_step": {
                "bf16": bytes_bf16["bf16"],
                "w12": bytes_w12["w12"] + bytes_w12["bf16"],
                "w12_lm_head": bytes_w12_head["w12"] + bytes_w12_head["bf16"],
            },
            "freed_bytes_decoder_linears": None if memory_before is None else memory_before - memory_after,
            "freed_bytes_with_lm_head": None if memory_before is None else memory_before - memory_head,
        },
    }


def summarize(layout: dict, batch: int, rest_s: float, read_bw: float | None) -> dict:
    """Per variant: timing, the linear layers' share of the step and how close they run to their byte floor;
    for W12, speedup over BF16 (what it would be at the W12 byte floor, and the linear time 1.15x needs)
    and agreement, free-running and on the same prefixes."""
    result = {}
    bf16_step = statistics.fmean(layout["runs"]["bf16"][batch].step_s)
    for variant in VARIANTS:
        if batch not in layout["runs"][variant]:
            continue
        figures = timing(layout["runs"][variant][batch], batch)
        step = figures["ms_per_step_mean"] / 1e3
        read = layout["weight_memory"]["linear_bytes_read_per_step"][variant]
        figures["linear_ms"] = (step - rest_s) * 1e3
        figures["linear_share"] = (step - rest_s) / step
        if read_bw:
            figures["linear_floor_ms"] = read / read_bw * 1e3
            figures["linear_fraction_of_floor"] = read / read_bw / (step - rest_s)
        if variant != "bf16":
            figures["speedup"] = bf16_step / step
            if read_bw:
                figures["speedup_at_linear_floor"] = bf16_step / (rest_s + read / read_bw)
                figures["linear_ms_needed_for_1.15x"] = (bf16_step / 1.15 - rest_s) * 1e3
            figures["agreement"] = agreement(layout["runs"]["bf16"][batch], layout["runs"][variant][batch])
            figures["forced_agreement"] = forced_agreement(
                layout["forced"]["bf16"][batch], layout["forced"][variant][batch]
            )
        result[variant] = figures
    return result


LAYOUTS = {
    "per_layer": "one W12 layer per HF linear layer, as loaded",
    "fused": "q/k/v and gate/up fused into one GEMM each (fuse_shared_input_projections), in BF16 and W12 alike",
}


def bench_model(label: str, load, prompts: dict[int, torch.Tensor], args, read_bw: float | None) -> dict:
    """``load()`` builds the BF16 model afresh (the same weights every time): once per layout."""
    entry: dict = {"new_tokens": args.new_tokens}
    outside: dict[int, Decode] = {}
    layouts = {}
    for layout in args.layouts:
        model = load()
        if "config" not in entry:
            entry["config"] = {
                k: getattr(model.config, k, None)
                for k in (
                    "model_type",
                    "vocab_size",
                    "hidden_size",
                    "intermediate_size",
                    "num_hidden_layers",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "head_dim",
                    "tie_word_embeddings",
                )
            }
            entry["parameters"] = sum(p.numel() for p in model.parameters())
        if layout == "fused":
            entry["fused_groups"] = fuse_shared_input_projections(model)
        log(f"{label}, {layout}")
        layouts[layout] = measure_layout(model, prompts, args, outside if not outside else None)
        del model
        gc.collect()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    entry["layouts"] = {
        name: {"what": LAYOUTS[name], "conversion": data["conversion"], "weight_memory": data["weight_memory"]}
        for name, data in layouts.items()
    }
    entry["eager_step_profiles"] = {name: data["profiles"] for name, data in layouts.items() if data["profiles"]}
    entry["batches"] = {}
    for b in prompts:
        rest = statistics.fmean(outside[b].step_s)
        entry["batches"][b] = {
            "prompt_len": prompts[b].shape[1],
            "outside_linears_ms": rest * 1e3,
            **{name: summarize(data, b, rest, read_bw) for name, data in layouts.items()},
        }
        log(
            label,
            b,
            {
                name: {v: round(f["ms_per_step_mean"], 3) for v, f in entry["batches"][b][name].items()}
                for name in layouts
            },
        )
    return entry


def markdown_tables(doc: dict) -> str:
    """The README tables of a result file: decode speed per model, layout and batch; weight memory."""

    def gb(count: int) -> str:
        return f"{count / 1e9:.2f}"

    def floor(figures: dict) -> str:
        return f"{100 * figures['linear_fraction_of_floor']:.0f}" if "linear_fraction_of_floor" in figures else "-"

    lines = [
        "| model | layout | requests | BF16 ms/token | W12 ms/token (x BF16) | W12 + LM head (x BF16) | "
        "tokens/s BF16 -> W12 | outside linears ms | BF16 / W12 linears, % of byte floor | "
        "same-prefix top-1 agreement | free-running identical requests |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, entry in doc["models"].items():
        for batch, result in entry["batches"].items():
            for layout in entry["layouts"]:
                bf16, w12, head = (result[layout].get(v) for v in VARIANTS)
                forced = w12["forced_agreement"]
                lines.append(
                    f"| {model} | {layout} | {batch} | {bf16['ms_per_step_mean']:.2f} | "
                    f"{w12['ms_per_step_mean']:.2f} ({w12['speedup']:.2f}x) | "
                    + (f"{head['ms_per_step_mean']:.2f} ({head['speedup']:.2f}x) | " if head else "- | ")
                    + f"{bf16['tokens_per_s']:.0f} -> {w12['tokens_per_s']:.0f} | {result['outside_linears_ms']:.2f} | "
                    f"{floor(bf16)} / {floor(w12)} | {forced['agree']}/{forced['positions']} | "
                    f"{w12['agreement']['requests_identical']}/{batch} |"
                )
    lines += [
        "",
        "| model | BF16 linear weights GB | W12 decoder linears GB (+ LM head) | allocator bytes freed GB "
        "(+ LM head) | bits per weight |",
        "| --- | --- | --- | --- | --- |",
    ]
    for model, entry in doc["models"].items():
        first = entry["layouts"].get("per_layer") or next(iter(entry["layouts"].values()))
        memory, conversion = first["weight_memory"], first["conversion"]
        freed = memory["freed_bytes_decoder_linears"]
        lines.append(
            f"| {model} | {gb(memory['bf16_linear_bytes'])} | {gb(memory['w12_decoder_linear_bytes'])} "
            f"(+ {gb(memory['w12_lm_head_bytes'] or 0)}) | "
            + (f"{gb(freed)} (+ {gb(memory['freed_bytes_with_lm_head'] - freed)}) | " if freed is not None else "- | ")
            + f"{conversion['bits_per_weight'][0]:.3f}-{conversion['bits_per_weight'][1]:.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help=f"a shape ({', '.join(SHAPES)}) or a local checkpoint directory; repeatable (default: both shapes)",
    )
    parser.add_argument("--batches", default="1,32", help="requests decoded together, comma-separated")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per request (>= 3)")
    parser.add_argument("--layouts", default="per_layer,fused", help=f"comma-separated: {', '.join(LAYOUTS)}")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one eager decode step per batch (BF16 and W12, first layout)",
    )
    parser.add_argument(
        "--table", type=Path, default=None, help="print the markdown tables of a result file (no measuring) and exit"
    )
    parser.add_argument("--layers", type=int, default=None, help="fewer decoder layers of a shape (smoke tests)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here (after each model too)")
    args = parser.parse_args()
    if args.table:
        print(markdown_tables(json.loads(args.table.read_text())))
        return
    if args.new_tokens < 3:
        parser.error("--new-tokens must be at least 3 (prefill token, warm-up step, timed steps)")
    args.layouts = args.layouts.split(",")
    if not set(args.layouts) <= set(LAYOUTS):
        parser.error(f"--layouts {','.join(args.layouts)}: choose from {', '.join(LAYOUTS)}")
    specs = args.model or list(SHAPES)
    for spec in specs:
        if spec not in SHAPES and not Path(spec).is_dir():
            parser.error(f"--model {spec}: neither a shape ({', '.join(SHAPES)}) nor a checkpoint directory")
    batches = [int(b) for b in args.batches.split(",")]
    cuda = args.device == "cuda"
    read_bw = None
    if cuda:
        from specpilot_mem.bench.cuda_timing import read_bandwidth  # the byte floors' one denominator

        read_bw = read_bandwidth()
    import transformers

    doc = result_header("w12_hf_decode")
    doc["versions"]["transformers"] = transformers.__version__
    doc |= {
        "read_bandwidth_tb_s": None if read_bw is None else read_bw / 1e12,
        "kernel_sources": kernel_sources(),
        "decode": "greedy, StaticCache, " + ("each step replayed from a CUDA graph" if cuda else "eager steps"),
        "models": {},
    }
    for spec in specs:
        if spec in SHAPES:
            load = lambda spec=spec: synthetic_model(spec, args.device, args.layers)  # noqa: E731
            tokenizer, weights = None, "synthetic: config-built, seeded N(0, 0.02) BF16 weights"
            vocab = SHAPES[spec][1]["vocab_size"]
        else:
            load = lambda spec=spec: checkpoint_model(Path(spec), args.device)  # noqa: E731
            tokenizer, weights = checkpoint_tokenizer(Path(spec)), f"checkpoint {spec}"
            vocab = transformers.AutoConfig.from_pretrained(spec).get_text_config().vocab_size
        widest = make_prompts(vocab, tokenizer, max(batches), args.prompt_len, args.device)
        prompts = {b: widest[:b] for b in batches}  # request 0 is the same in every batch
        label = Path(spec).name if spec not in SHAPES else spec
        entry = bench_model(label, load, prompts, args, read_bw)
        entry["weights"] = weights
        entry["prompts"] = "random token ids (seed 1)" if tokenizer is None else "slices of a fixed English text"
        doc["models"][label] = entry
        log(json.dumps({label: entry}))  # each model's figures survive a later model's failure
        if args.out:
            write_result(doc, args.out)
    print_result(doc, args.out)


if __name__ == "__main__":
    main()
