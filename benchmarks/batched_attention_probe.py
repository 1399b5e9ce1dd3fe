"""The batched verify step's tree attention, kernel against kernel: ``batched_ops.batched_tree_attention`` (the
engine's batched path) vs ``fused_ops.tree_attention`` (one request's kernel), at the engine shapes' attention
geometry, B requests x T chain rows over a ``--context``-token cache each; each kernel's max abs error against the
torch reference (bf16), its CUDA-graph time per call and the caches' bytes a second.

    PYTHONPATH=kernels:. python benchmarks/batched_attention_probe.py --out probe.json          # H200
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python benchmarks/batched_attention_probe.py --device cpu --smoke

Each timed call reads another copy of the caches (``--copies``), as a step's layers do, so L2 holds none of them.
Imports only torch, triton, numpy (the GPU machine has nothing else).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_kernels import batched_ops, fused_ops  # noqa: E402
from specpilot_mem.bench.cuda_timing import graph_replay_us  # noqa: E402
from specpilot_mem.engine.shapes import get_shape  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

KERNELS = {"batched": batched_ops.batched_tree_attention, "single": fused_ops.tree_attention}


def one_setting(shape, B: int, T: int, context: int, copies: int, device, dtype, replays: int) -> dict:
    gen = torch.Generator(device=device).manual_seed(B * 1000 + T)
    hq, hkv, D = shape.attn_heads, shape.attn_kv_heads, shape.attn_head_dim
    L = context + T + 8

    def rnd(*size):
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).to(dtype)

    q, k_rows, v_rows = rnd(B, T, hq, D), rnd(B, T, hkv, D), rnd(B, T, hkv, D)
    gate = rnd(B, T, hq * D) if shape.attn_output_gate else None
    caches = [(rnd(B, hkv, L, D), rnd(B, hkv, L, D)) for _ in range(copies)]
    lengths = context - torch.arange(B, device=device) % 7  # ragged: 0-6 keys fewer
    anc = torch.ones(T, T, dtype=torch.bool, device=device).tril().expand(B, T, T).contiguous()
    ref = fused_ops.tree_attention_reference(q, *caches[0], k_rows, v_rows, lengths, anc, gate).float()
    out = {"max_len": L}
    for name, kernel in KERNELS.items():
        got = kernel(q, *caches[0], k_rows, v_rows, lengths, anc, gate)
        entry = {"max_abs_err": float(f"{(got.float() - ref).abs().max().item():.3g}")}
        if device.type == "cuda":
            us = graph_replay_us(
                lambda c, kernel=kernel: kernel(q, *caches[c], k_rows, v_rows, lengths, anc, gate),
                copies=copies,
                replays=replays,
            )
            nbytes = float(lengths.sum().item()) * hkv * D * 2 * caches[0][0].element_size()
            entry.update({"us": round(us, 2), "cache_TBps": round(nbytes / us / 1e6, 3)})
        out[name] = entry
    if "us" in out["batched"]:
        out["speedup"] = round(out["single"]["us"] / out["batched"]["us"], 3)
    out["plan"] = batched_ops.batched_split(B, hkv, hq // hkv * T, L, D, 132)
    return out


def kv_move_check(shape, B: int, T: int, context: int, device, dtype) -> dict:
    """``commit_kv_rows`` against its reference on random tree paths (every attention layer, K and V): exact?"""
    from benchmarks.system_bench import step_trees
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator(device=device).manual_seed(7)
    A, hkv, D = shape.attn_layers, shape.attn_kv_heads, shape.attn_head_dim
    kv = torch.randn(A, 2, B, hkv, context + T + 8, D, generator=gen, device=device, dtype=torch.float32).to(dtype)
    trees, deepest = step_trees(B, T, True, 1000)
    packed = pack_trees(trees, T, 4)
    accepted = torch.zeros(B, T, dtype=torch.long)
    accept_len = torch.zeros(B, dtype=torch.long)
    for b, node in enumerate(deepest):  # the root path to the deepest node, root first
        path = []
        while node >= 0:
            path.append(node)
            node = int(packed["parents"][b, node])
        accepted[b, : len(path)] = torch.tensor(path[::-1])
        accept_len[b] = len(path)
    lengths = (context - torch.arange(B) % 5).to(device)
    accepted, accept_len = accepted.to(device), accept_len.to(device)
    want = kv.clone()
    batched_ops.commit_kv_rows_reference(want, lengths, accepted, accept_len)
    batched_ops.commit_kv_rows(kv, lengths, accepted, accept_len)
    moved = int(
        (accepted != torch.arange(T, device=device))
        .logical_and(torch.arange(T, device=device) < accept_len[:, None])
        .sum()
    )
    return {"exact": bool(torch.equal(kv, want)), "rows_moved": moved, "layers": A, "requests": B, "rows": T}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shapes", default="qwen3.5-4b-like:1,8,32,64:1,17;llama-3.1-8b-like:32:1,17")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--copies", type=int, default=4)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # the interpreter's bf16 loads are unreliable
    if args.smoke:
        args.context, args.copies = 40, 1
    result = {**result_header("batched_attention_probe"), "context": args.context, "dtype": str(dtype), "by_shape": {}}
    t0 = time.perf_counter()
    for spec in args.shapes.split(";"):
        name, batches, rows = spec.split(":")
        shape = get_shape(name, args.smoke)
        table = result["by_shape"].setdefault(name, {})
        for B in map(int, batches.split(",")):
            for T in map(int, rows.split(",")):
                key = f"B{B}xT{T}"
                try:
                    if cuda:
                        table[key] = one_setting(shape, B, T, args.context, args.copies, device, dtype, args.replays)
                    else:
                        with fused_ops.interpreted_kernels():
                            table[key] = one_setting(shape, B, T, args.context, 1, device, dtype, args.replays)
                except Exception as exc:  # noqa: BLE001 - one failing setting keeps the others'
                    table[key] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
                print(name, key, table[key], file=sys.stderr, flush=True)
    kv_shape = get_shape("qwen3.5-4b-like", args.smoke)
    try:
        if cuda:
            result["commit_kv_rows"] = kv_move_check(kv_shape, 32, 17, args.context, device, dtype)
        else:
            with fused_ops.interpreted_kernels():
                result["commit_kv_rows"] = kv_move_check(kv_shape, 3, 5, args.context, device, dtype)
    except Exception as exc:  # noqa: BLE001 - the timings still come
        result["commit_kv_rows"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    print("commit_kv_rows", result["commit_kv_rows"], file=sys.stderr, flush=True)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    result["headline"] = headline(result)
    print_result(result, args.out)
    return 0


def headline(result: dict) -> str:
    parts = []
    for name, table in result["by_shape"].items():
        sp = [e["speedup"] for e in table.values() if "speedup" in e]
        err = max((e["batched"]["max_abs_err"] for e in table.values() if "batched" in e), default=None)
        if sp:
            parts.append(f"{name}: batched kernel {min(sp):.2f}-{max(sp):.2f}x fused_ops' (max abs err {err})")
    kv = result.get("commit_kv_rows", {})
    parts.append(f"commit_kv_rows exact: {kv.get('exact')}")
    return "; ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
