"""The system engine's linears and tree attention alone, at its own shapes: cuBLAS BF16 vs the W12 kernel per fused
linear of the 27B-like step, and the tree attention's split configurations, at the verify step's row counts.

    PYTHONPATH=kernels:. python benchmarks/engine_linear_probe.py --out probe.json                     # H200
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python benchmarks/engine_linear_probe.py --device cpu --smoke

Why: the composed step's W12 gain falls from 1.28x at 1 row to 1.02-1.04x at 17-32 rows while the W12 GEMM bench's
own shapes keep 1.05-1.49x there; the engine's fused shapes (gdn_in = qkv | z | a b, attn_qkv = q | gate | k | v,
the 6,144-wide output projections) are not the bench's, and have no tuned partition. Per (linear, rows): µs of one
CUDA-graph replay of each (the weight bigger than L2 or rotated through two copies), the W12 kernel's launches
(``launched``), the partition used (tuned or default). Attention: the engine's tree attention at the 27B-like heads
and a 1,024-token context per (BM, warps, programs per SM) setting, the default marked.

Imports only torch, triton, numpy (the GPU machine has nothing else). On a CPU only the code path runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_kernels import fused_ops  # noqa: E402
from specpilot_mem.engine.shapes import get_shape  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

L2_BYTES = 60 << 20


def graph_us(fn, replays: int) -> float:
    """Median µs of one call of ``fn`` replayed from a CUDA graph (5 bursts of ``replays`` calls)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(replays):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / replays)
    return round(sorted(samples)[2], 2)


def borrowed_configs(n: int, k: int, tuned: dict) -> dict:
    """For a shape with no tuned partition: the tuned partitions of shapes with the same K or the same N (their
    second row region dropped: it is sized for the other N), and the default with warpgroup MMAs at 9-64 rows."""
    from dataclasses import replace

    from specpilot_kernels.w12.mma import MmaConfig, default_mma_config

    out = {}
    for key, cfg in tuned.items():
        tn, tk = map(int, key.split(","))
        if (tn, tk) != (n, k) and (tk == k or tn == n):
            out[f"from {key}"] = replace(MmaConfig(**cfg), tail_rows=0, tail=(0, 0, 0))
    base = default_mma_config(n, k, 132)
    fit = 32 // (4 * base.warps_k)  # warpgroups a K class that fit a block of at most 32 warps
    for wg in sorted({1, min(2, fit)}) if fit else ():
        out[f"default + wgmma {wg},{wg},{wg}"] = replace(base, wgmma=(wg, wg, wg))
    return out


def rotating(call, count: int):
    """A call over ``count`` weight copies in turn (a weight that fits L2 would otherwise be timed from it)."""
    state = {"i": 0}

    def fn():
        state["i"] += 1
        return call(state["i"] % count)

    return fn


def linears(shape, rows: list[int], device, replays: int) -> dict:
    from specpilot_kernels.w12 import encode, to_mma_layout, w12_mma_gemm
    from specpilot_kernels.w12.mma import _tuned

    out = {}
    gen = torch.Generator(device=device).manual_seed(0)
    tuned = _tuned().get(torch.cuda.get_device_name(device), {})
    table = dict(shape.linear_shapes())
    table["head"] = (shape.vocab_size, shape.d_model)
    for name, (n, k) in table.items():
        w = (torch.randn(n, k, generator=gen, device=device) * 0.02).bfloat16()
        copies = 1 if w.numel() * 2 > L2_BYTES else 2
        ws = [w] + [w.clone() for _ in range(copies - 1)]
        mmas = [to_mma_layout(encode(x.contiguous(), check=True)) for x in ws]
        xs = {m: (torch.randn(m, k, generator=gen, device=device) * 0.5).bfloat16() for m in rows}
        entry = {"N": n, "K": k, "tuned": f"{n},{k}" in tuned, "rows": {}}
        for m, x in xs.items():
            launched: list[int] = []
            w12_mma_gemm(x, mmas[0], launched=launched)
            cb = graph_us(rotating(lambda i, x=x, ws=ws: F.linear(x, ws[i]), copies), replays * copies)
            wt = graph_us(rotating(lambda i, x=x, mmas=mmas: w12_mma_gemm(x, mmas[i]), copies), replays * copies)
            entry["rows"][str(m)] = {
                "cublas_us": cb,
                "w12_us": wt,
                "speedup": round(cb / wt, 3),
                "w12_launches": len(launched),
                "w12_warpgroups": launched,
            }
        if not entry["tuned"]:  # would another shape's partition serve this one?
            entry["borrowed"] = {}
            for label, cfg in borrowed_configs(n, k, tuned).items():
                times = {}
                for m, x in xs.items():
                    try:
                        fn = rotating(lambda i, x=x, mmas=mmas, cfg=cfg: w12_mma_gemm(x, mmas[i], config=cfg), copies)
                        times[str(m)] = graph_us(fn, replays * copies)
                    except Exception as exc:  # noqa: BLE001 - a partition this shape cannot take
                        times[str(m)] = f"{type(exc).__name__}: {exc}"[:200]
                entry["borrowed"][label] = times
        out[name] = entry
        print(f"{name} {n}x{k} tuned={entry['tuned']}: {entry['rows']} {entry.get('borrowed')}", file=sys.stderr)
        torch.cuda.empty_cache()
    return out


def attention(shape, rows: list[int], context: int, device, replays: int) -> dict:
    """Tree attention of one request at each row count, per split setting (BM, warps, programs per SM)."""
    out = {}
    hq, hkv, D = shape.attn_heads, shape.attn_kv_heads, shape.attn_head_dim
    gen = torch.Generator(device=device).manual_seed(1)
    L = context + max(rows) + 8
    kc = torch.randn(1, hkv, L, D, generator=gen, device=device).bfloat16()
    vc = torch.randn(1, hkv, L, D, generator=gen, device=device).bfloat16()
    default = fused_ops._attention_split
    # (BM, warps, programs per SM): fewer splits write fewer FP32 partial outputs (splits x rows x D), more spread
    # the keys over more SMs
    settings = [None, (16, 4, 1), (16, 4, 4), (32, 4, 1), (32, 4, 2), (64, 8, 0.5), (64, 8, 1), (64, 4, 1)]
    for T in rows:
        q = torch.randn(1, T, hq, D, generator=gen, device=device).bfloat16()
        k = torch.randn(1, T, hkv, D, generator=gen, device=device).bfloat16()
        v = torch.randn(1, T, hkv, D, generator=gen, device=device).bfloat16()
        gate = torch.randn(1, T, hq * D, generator=gen, device=device).bfloat16()
        lengths = torch.full((1,), context, device=device)
        anc = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None]
        want = fused_ops.tree_attention(q, kc, vc, k, v, lengths, anc, gate)
        entry = {}
        for setting in settings:
            if setting is not None:
                bm, warps, per_sm = setting

                def split(B, HKV, R, keys, D, sms, bm=bm, warps=warps, per_sm=per_sm):
                    bn = fused_ops._attention_block_n(D)
                    blocks = triton.cdiv(R, bm)
                    splits = max(1, min(triton.cdiv(keys, bn), round(per_sm * sms / (B * HKV * blocks))))
                    chunk = triton.cdiv(triton.cdiv(keys, splits), bn) * bn
                    return bm, warps, triton.cdiv(keys, chunk), chunk

                fused_ops._attention_split = split
            label = "default" if setting is None else "bm%d_w%d_x%g" % setting
            try:
                got = fused_ops.tree_attention(q, kc, vc, k, v, lengths, anc, gate)
                err = (got.float() - want.float()).abs().max().item()
                args = (q, kc, vc, k, v, lengths, anc, gate)
                us = graph_us(lambda args=args: fused_ops.tree_attention(*args), replays)
                entry[label] = {"us": us, "max_abs_diff_vs_default": round(err, 5)}
            except Exception as exc:  # noqa: BLE001 - a setting that does not build keeps the others
                entry[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            finally:
                fused_ops._attention_split = default
        out[str(T)] = entry
        print(f"attention T={T}: {entry}", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shape", default="qwen3.8-27b-like")
    ap.add_argument("--rows", default="1,8,16,17,32,33")
    ap.add_argument("--attention-rows", default="1,17,33")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--sections", default="linears,attention")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    shape = get_shape(args.shape, args.smoke)
    result = {**result_header("engine_linear_probe"), "shape": shape.name, "smoke": args.smoke}
    if device.type != "cuda":  # dry run: the code path up to the GPU timing
        result["note"] = "CPU dry run: nothing timed"
        print_result(result, args.out)
        return 0
    t0 = time.perf_counter()
    rows = [int(r) for r in args.rows.split(",")]
    sections = args.sections.split(",")
    if "linears" in sections:
        try:
            result["linears"] = linears(shape, rows, device, args.replays)
        except Exception as exc:  # noqa: BLE001 - the attention still comes
            result["linears"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    if "attention" in sections:
        att_rows = [int(r) for r in args.attention_rows.split(",")]
        result["attention"] = attention(shape, att_rows, args.context, device, args.replays)
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
