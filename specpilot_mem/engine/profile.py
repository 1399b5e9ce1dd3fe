"""A profile of one engine step in the cost model's format (docs/profile-format.md), written on request.

    PYTHONPATH=kernels:. python3 -m specpilot_mem.engine.profile --out profile.json [--tree best-first --nodes 32]

Each kernel class is timed in isolation at the step's real shapes (target GEMMs, the GDN layers' WY
verify, attention over the cache, the LM head, the draft pass); ``rest`` is the captured verify pass
minus its timed classes (norms, rope, conv, gating). T_step is a whole live step (draft, verify,
acceptance, commit), so T_step / T_prof exposes host overhead. Bytes and FLOPs are counted from the
shapes. Imports only torch (runs on the bare H200); the cost model validates the file when it reads it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specpilot_mem.engine import gdn
from specpilot_mem.engine.engine import Engine
from specpilot_mem.engine.model import AttnLayer, GDNLayer, chain_rows


def time_ms(fn, device: torch.device, iters: int = 20) -> float:
    """Median milliseconds of ``fn`` over ``iters`` calls after warm-up (CUDA events on GPU)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


@torch.no_grad()
def profile_engine(engine: Engine, prompt: list[int], gpu: str, new_tokens: int = 64, iters: int = 20) -> dict:
    """Profile the engine's configured speculative step (its tree and node budget) after ``prompt``."""
    opts, cfg, dev = engine.options, engine.target.cfg, engine.device
    elt = torch.finfo(engine.dtype).bits // 8
    run = engine.generate([prompt], "spec", max_new_tokens=new_tokens)[0]
    ar = engine.generate([prompt], "ar", max_new_tokens=new_tokens)[0]
    # Steady-state step times from the live runs: the decode part, prefill excluded.
    t_step = (run.token_times[-1] - run.token_times[0]) / max(1, run.steps) * 1000
    t_ar = (ar.token_times[-1] - ar.token_times[0]) / max(1, ar.steps) * 1000
    rows_n = 1 + (opts.positions if opts.tree == "chain" else opts.nodes)
    engine.cache.reset()
    engine.prefill(prompt)
    L = engine.cache.length
    rows = chain_rows((prompt * rows_n)[:rows_n], cfg.conv_size, dev)
    widest = max(cfg.d_model, cfg.ffn_dim, 2 * cfg.attn_heads * cfg.attn_head_dim, cfg.gdn_heads * cfg.gdn_head_dim)
    x = torch.randn(1, rows_n, widest, device=dev, dtype=engine.dtype)
    linears = [m for b in engine.target.blocks for m in b.modules() if isinstance(m, torch.nn.Linear)]
    gemm_params = sum(m.weight.numel() for m in linears)
    head = engine.target.lm_head_weight
    gdn_layers = [(i, b.mixer) for i, b in enumerate(engine.target.blocks) if isinstance(b.mixer, GDNLayer)]
    attn_layers = [(i, b.mixer) for i, b in enumerate(engine.target.blocks) if isinstance(b.mixer, AttnLayer)]
    H, D = cfg.gdn_heads, cfg.gdn_head_dim
    qkv = [torch.randn(1, H, rows_n, D, device=dev) for _ in range(3)]
    decay, beta = -torch.rand(1, H, rows_n, device=dev), torch.rand(1, H, rows_n, device=dev)

    def gemms():
        for m in linears:
            F.linear(x[..., : m.in_features], m.weight)

    def gdn_verify():
        for i, _ in gdn_layers:
            gdn.masked_wy(*qkv, decay, beta, engine.cache.state[i], rows.anc)

    def attention():
        for i, layer in attn_layers:
            q = torch.randn(1, layer.hq, rows_n, layer.d, device=dev, dtype=engine.dtype)
            k = engine.cache.keys[i][:, : L + rows_n].repeat_interleave(layer.hq // layer.hkv, 2).transpose(1, 2)
            v = engine.cache.values[i][:, : L + rows_n].repeat_interleave(layer.hq // layer.hkv, 2).transpose(1, 2)
            F.scaled_dot_product_attention(q, k, v)

    kernels = {
        "target_gemm": {
            "time_ms": time_ms(gemms, dev, iters),
            "bytes": gemm_params * elt,
            "flops": 2 * rows_n * gemm_params,
        },
        "gdn_recurrent": {
            "time_ms": time_ms(gdn_verify, dev, iters),
            # committed state in, one end state per row out, float32
            "bytes": len(gdn_layers) * H * D * D * 4 * (1 + rows_n),
            "flops": len(gdn_layers) * H * (4 * rows_n * rows_n * D + 2 * rows_n * rows_n * D * D),
        },
        "attention": {
            "time_ms": time_ms(attention, dev, iters),
            "bytes": len(attn_layers) * 2 * (L + rows_n) * cfg.attn_kv_heads * cfg.attn_head_dim * elt,
            "flops": len(attn_layers) * 4 * rows_n * (L + rows_n) * cfg.attn_heads * cfg.attn_head_dim,
        },
        "lm_head": {
            "time_ms": time_ms(lambda: x[0, :, : cfg.d_model] @ head.t(), dev, iters),
            "bytes": head.numel() * elt,
            "flops": 2 * rows_n * head.numel(),
        },
        "drafter": {
            "time_ms": time_ms(lambda: engine.draft(prompt[-1], opts.positions), dev, iters),
            "bytes": sum(p.numel() for p in engine.drafter.parameters()) * elt + head.numel() * elt,
            "flops": 2
            * (engine.drafter.cfg.block_size + 1)
            * (sum(p.numel() for p in engine.drafter.parameters()) + head.numel()),
        },
    }
    verify_ms = time_ms(lambda: engine.verify(rows), dev, iters)
    timed = sum(kernels[k]["time_ms"] for k in ("target_gemm", "gdn_recurrent", "attention", "lm_head"))
    kernels["rest"] = {
        "time_ms": max(0.0, verify_ms - timed),
        "bytes": 24 * rows_n * cfg.d_model * cfg.n_layers * elt,
        "flops": 40 * rows_n * cfg.d_model * cfg.n_layers,
    }
    # The cost model's classes are tensor-core types; float32 runs (CPU tests) are filed as bf16.
    dtype = "fp16" if engine.dtype == torch.float16 else "bf16"
    for k in kernels:
        kernels[k] = {key: float(v) for key, v in kernels[k].items()} | {"dtype": dtype}
    return {
        "format": "specpilot-profile",
        "version": 1,
        "gpu": gpu,
        "system": f"specpilot pure-torch engine, {opts.tree} ({opts.positions} positions, {opts.nodes} nodes), "
        f"{engine.dtype}, one request",
        "synthetic": engine.synthetic,
        "nodes": rows_n - 1,
        "tau": run.tau,
        "T_step_ms": t_step,
        "T_AR_ms": t_ar,
        "kernels": kernels,
        "date": dt.date.today().isoformat(),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpu", default="H200", help="GPU name for the cost model's table (the machine's GPU)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tree", default="chain")
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    engine = Engine.load_default(device, dtype)
    engine = engine.with_options(tree=args.tree, positions=args.positions, nodes=args.nodes)
    prompt = torch.randint(
        0, engine.target.cfg.vocab_size, (args.prompt_len,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    payload = profile_engine(engine, prompt, args.gpu)
    payload["command"] = " ".join(
        ["python3 -m specpilot_mem.engine.profile"] + (argv if argv is not None else sys.argv[1:])
    )
    args.out.write_text(json.dumps(payload, indent=1) + "\n")
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
