"""Engine step times and decoding rates: the verify pass at 1..64 rows (AR is 1 row), the draft pass,
and end-to-end AR / speculative generation (tokens/s, tau, AR-vs-speculative agreement). Prints JSON.

    PYTHONPATH=kernels:. python3 benchmarks/engine_step_bench.py --device cuda            # H200
    PYTHONPATH=. python3 benchmarks/engine_step_bench.py --device cpu --rows 1            # CPU AR speed

On CUDA the passes run as CUDA graphs (static shapes) and are timed with CUDA events; on the CPU with
perf_counter. Without the trained pair in --model-dir the weights are seeded random (labelled synthetic).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.engine import weights  # noqa: E402
from specpilot_mem.engine.engine import Engine  # noqa: E402
from specpilot_mem.engine.model import chain_rows  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

LABEL = "small models trained here — not comparable in absolute terms to the paper's"


def timed(fn, device, iters: int, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean milliseconds per call over ``iters`` calls (after warm-up)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / iters)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            samples.append((time.perf_counter() - t0) * 1000 / iters)
    return statistics.median(samples)


def agreement(a: list[int], b: list[int]) -> dict:
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"equal": a == b, "first_divergence": first if a != b else None}


@torch.no_grad()
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], help="default: bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--model-dir", type=Path, default=weights.DEFAULT_MODEL_DIR)
    ap.add_argument("--tokens", type=Path, help="corpus.npz: prompts from its unseen split (else random ids)")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, help="torch CPU threads")
    ap.add_argument("--out", type=Path, help="also write the JSON here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    trained = weights.has_trained_pair(args.model_dir)
    engine = Engine.load(args.model_dir, device, dtype) if trained else Engine.random(0, device=device, dtype=dtype)
    vocab = engine.target.cfg.vocab_size
    if args.tokens:
        unseen = np.load(args.tokens)["unseen"].astype(np.int64)
        stride = max(1, (unseen.size - args.prompt_len) // args.requests)
        prompts = [unseen[i * stride : i * stride + args.prompt_len].tolist() for i in range(args.requests)]
    else:
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist() for _ in range(args.requests)]

    result = {
        **result_header("engine_step_bench"),
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "synthetic": not trained,
        "label": LABEL if trained else "synthetic: seeded random weights",
        "target_params": sum(p.numel() for p in engine.target.parameters()),
        "drafter_params": sum(p.numel() for p in engine.drafter.parameters()),
        "prompt_tokens": args.prompt_len,
    }

    def step_times(eng: Engine) -> dict:
        eng.cache.reset()
        eng.prefill(prompts[0])
        out = {"verify_ms": {}}
        for r in [int(x) for x in args.rows.split(",")]:
            rows = chain_rows(prompts[0][:r] if r <= len(prompts[0]) else [1] * r, eng.target.cfg.conv_size, device)
            out["verify_ms"][r] = round(timed(lambda rows=rows: eng.verify(rows), device, args.iters), 4)
        out["ar_step_ms"] = out["verify_ms"].get(1)
        if eng.drafter is not None:
            out["draft_ms"] = round(timed(lambda: eng.draft(prompts[0][-1], 16), device, args.iters), 4)
        return out

    result["steps"] = step_times(engine)
    result["cuda_graphs"] = device.type == "cuda" and engine.graph_error is None
    if engine.graph_error:
        result["cuda_graph_error"] = engine.graph_error
    print(json.dumps({"steps": result["steps"]}), file=sys.stderr, flush=True)

    runs = {}
    ar = engine.generate(prompts, "ar", max_new_tokens=args.new_tokens)
    runs["ar"] = {"mode": "ar"}
    systems = {
        "spec_chain8": dict(tree="chain", positions=8),
        "spec_chain16": dict(tree="chain", positions=16),
        "spec_best_first32": dict(tree="best-first", positions=16, nodes=32),
    }
    outputs = {"ar": ar}
    for name, opts in systems.items():
        variant = engine.with_options(**opts)
        outputs[name] = variant.generate(prompts, "spec", max_new_tokens=args.new_tokens)
        runs[name] = {"mode": "spec", **opts}
    for name, gens in outputs.items():
        tokens = sum(len(g.output_ids) for g in gens)
        runs[name].update(
            tokens_per_s_per_request=round(statistics.mean(g.output_rate for g in gens), 2),
            tau=round(sum(sum(g.accepted) for g in gens) / max(1, sum(len(g.accepted) for g in gens)), 4)
            if name != "ar"
            else 1.0,
            tokens=tokens,
        )
        if name != "ar":
            agree = [agreement(a.output_ids, s.output_ids) for a, s in zip(ar, gens)]
            same = sum(x == y for a, s in zip(ar, gens) for x, y in zip(a.output_ids, s.output_ids))
            runs[name]["identical_outputs"] = sum(a["equal"] for a in agree)
            runs[name]["token_agreement"] = round(same / tokens, 4)
            runs[name]["first_divergences"] = [a["first_divergence"] for a in agree]
            runs[name]["speedup_over_ar"] = round(
                runs[name]["tokens_per_s_per_request"] / runs["ar"]["tokens_per_s_per_request"], 3
            )
    result["generate"] = {
        "requests": len(prompts),
        "new_tokens": args.new_tokens,
        "prompts": "unseen split" if args.tokens else "random ids",
        "runs": runs,
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
