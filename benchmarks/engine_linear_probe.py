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


_DEADLINE = [float("inf")]  # perf_counter time after which the sweeps time no more settings (--budget-s)


def _time_setting(fn, replays: int) -> dict:
    if time.perf_counter() > _DEADLINE[0]:
        return {"skipped": "past the sweep's time budget"}
    try:
        return {"us": graph_us(fn, replays)}
    except Exception as exc:  # noqa: BLE001 - a setting that does not build keeps the others
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def attention(shape, rows: list[int], context: int, device, replays: int) -> dict:
    """Tree attention (split + combine) of one request at each row count: the table's tile (``ATTENTION_TILES``),
    then a coordinate descent from it over programs a multiprocessor, block_m, block_n, (warps, stages) and the
    combine's warps; per setting µs and max abs difference from the reference (bf16)."""
    from dataclasses import asdict, replace

    out = {}
    hq, hkv, D = shape.attn_heads, shape.attn_kv_heads, shape.attn_head_dim
    gen = torch.Generator(device=device).manual_seed(1)
    L = context + max(rows) + 8
    kc = torch.randn(1, hkv, L, D, generator=gen, device=device).bfloat16()
    vc = torch.randn(1, hkv, L, D, generator=gen, device=device).bfloat16()
    table = fused_ops.ATTENTION_TILES
    axes = [
        ("programs_per_sm", [0.5, 1, 2, 4]),
        ("block_m", [16, 32, 64, 128]),
        ("block_n", [32, 64]),
        (("num_warps", "num_stages"), [(4, 1), (4, 2), (4, 3), (8, 1), (8, 2), (8, 3)]),
        ("combine_warps", [2, 4, 8]),
    ]

    def at_rows(T):
        q = torch.randn(1, T, hq, D, generator=gen, device=device).bfloat16()
        k = torch.randn(1, T, hkv, D, generator=gen, device=device).bfloat16()
        v = torch.randn(1, T, hkv, D, generator=gen, device=device).bfloat16()
        gate = torch.randn(1, T, hq * D, generator=gen, device=device).bfloat16()
        lengths = torch.full((1,), context, device=device)
        anc = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None]
        args = (q, kc, vc, k, v, lengths, anc, gate)
        ref = fused_ops.tree_attention_reference(*args).float()
        R = hq // hkv * T
        if R <= 16:  # one 16-row block holds every row: larger blocks only add padding
            axes_t = [a for a in axes if a[0] != "block_m"]
        else:
            axes_t = axes
        seen: dict = {}

        def run(tile):
            key = tuple(asdict(tile).values())
            if key not in seen and time.perf_counter() > _DEADLINE[0]:
                seen[key] = {**asdict(tile), "skipped": "past the sweep's time budget"}
            if key not in seen:
                fused_ops.ATTENTION_TILES = ((1 << 30, 1 << 30, tile),)
                try:
                    got = fused_ops.tree_attention(*args)
                    entry = _time_setting(lambda: fused_ops.tree_attention(*args), replays)
                    entry["max_abs_err"] = round((got.float() - ref).abs().max().item(), 5)
                except Exception as exc:  # noqa: BLE001 - a tile that does not build keeps the others
                    entry = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                finally:
                    fused_ops.ATTENTION_TILES = table
                seen[key] = {**asdict(tile), **entry}
            return seen[key].get("us", float("inf"))

        default = fused_ops.attention_tile(R, D)
        best, best_us = default, run(default)
        for names, values in axes_t:
            for value in values:
                change = dict(zip(names, value)) if isinstance(names, tuple) else {names: value}
                tile = replace(best, **change)
                us = run(tile)
                if us < best_us:
                    best, best_us = tile, us
        entry = {
            "folded_rows": R,
            "table": {**asdict(default), "us": seen[tuple(asdict(default).values())].get("us")},
            "best": {**asdict(best), "us": best_us},
            "gain": round(seen[tuple(asdict(default).values())].get("us", float("nan")) / best_us, 3),
            "settings": list(seen.values()),
        }
        print(f"attention T={T}: table {entry['table']} best {entry['best']}", file=sys.stderr, flush=True)
        return entry

    for T in rows:
        out[str(T)] = at_rows(T)
    return out


FUSED_CANDIDATES = {
    "tree_conv_silu": [
        (1, 256, 2),
        (1, 1024, 4),
        (2, 512, 4),
        (2, 1024, 4),
        (4, 512, 4),
        (4, 1024, 4),
        (8, 512, 4),
        (8, 1024, 8),
    ],
    "silu_mul": [
        (1, 1024, 4),
        (1, 2048, 4),
        (2, 1024, 4),
        (2, 2048, 8),
        (4, 512, 4),
        (4, 1024, 4),
        (8, 512, 4),
        (8, 1024, 8),
    ],
    "gated_rms_norm": [(1, 0, 4), (2, 0, 4), (4, 0, 4), (8, 0, 4), (16, 0, 8), (1, 0, 1), (4, 0, 2)],
    "qk_norm_rope": [(1, 0, 1), (1, 0, 2), (2, 0, 1), (2, 0, 2), (4, 0, 2), (4, 0, 4), (8, 0, 4)],
}


def fused(shape, rows: list[int], context: int, device, replays: int) -> dict:
    """The element-wise fused ops at the shape's sizes, per row count and row tile (``FUSED_TILES`` candidates): µs,
    whether the tile's output equals the table tile's bit for bit (no bit may depend on the tile), and the table
    tile's max abs difference from the torch reference (bf16)."""
    from specpilot_mem.engine.system import pack_trees

    gen = torch.Generator(device=device).manual_seed(2)
    dt = torch.bfloat16

    def rnd(*size):
        return torch.randn(*size, generator=gen, device=device).to(dt)

    C, HV, N, CS = shape.gdn_conv_channels, shape.gdn_value_heads, shape.gdn_head_dim, shape.conv_size
    hq, hkv, D = shape.attn_heads, shape.attn_kv_heads, shape.attn_head_dim
    out = {}
    table = fused_ops.FUSED_TILES

    def at_rows(T):
        gproj = rnd(1, T, C + HV * N + 2 * HV)  # the GDN input projection: conv input and z read in place
        x, z = gproj[..., :C], gproj[..., C : C + HV * N].view(1, T, HV, N)
        state, weight = rnd(1, CS - 1, C), rnd(C, CS)
        idx = torch.as_tensor(pack_trees([(list(range(T)), list(range(-1, T - 1)))], T, CS)["conv_idx"]).to(device)
        o, w = rnd(1, T, HV, N), rnd(N)
        gu = rnd(1, T, 2 * shape.ffn_dim)
        sizes = [hq * D, hq * D, hkv * D, hkv * D]
        q, _, k, v = rnd(1, T, sum(sizes)).split(sizes, dim=-1)
        q, k, v = q.view(1, T, hq, D), k.view(1, T, hkv, D), v.view(1, T, hkv, D)
        ang = (context + torch.arange(T, device=device)).float()[None, :, None] * (
            1.0 / (10000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
        )
        cos, sin, qw, kw = ang.cos(), ang.sin(), rnd(D), rnd(D)
        kcache, vcache = rnd(1, hkv, context + T + 8, D), rnd(1, hkv, context + T + 8, D)
        slots = context + torch.arange(T, device=device)[None]
        calls = {
            "tree_conv_silu": (
                lambda: fused_ops.tree_conv_silu(state, x, idx, weight),
                lambda: fused_ops.tree_conv_silu_reference(state, x, idx, weight),
            ),
            "silu_mul": (lambda: fused_ops.silu_mul(gu), lambda: fused_ops.silu_mul_reference(gu)),
            "gated_rms_norm": (
                lambda: fused_ops.gated_rms_norm(o, w, z, 1e-6),
                lambda: fused_ops.gated_rms_norm_reference(o, w, z, 1e-6),
            ),
            "qk_norm_rope": (
                lambda: torch.cat(
                    [
                        t.flatten()
                        for t in fused_ops.qk_norm_rope(q, k, v, cos, sin, qw, kw, 1e-6, kcache, vcache, slots)
                    ]
                ),
                lambda: torch.cat(
                    [t.flatten() for t in fused_ops.qk_norm_rope_reference(q, k, v, cos, sin, qw, kw, 1e-6)]
                ),
            ),
        }
        entry = {}
        for op, (call, reference) in calls.items():
            base = call()
            row = {
                "table": str(fused_ops.row_tile(op, T * (HV if op == "gated_rms_norm" else 1))),
                "table_us": _time_setting(call, replays).get("us"),
                "max_abs_err_vs_reference": round((base.float() - reference().float()).abs().max().item(), 5),
                "tiles": {},
            }
            for rows_a, block, warps in FUSED_CANDIDATES[op]:
                if time.perf_counter() > _DEADLINE[0]:
                    row["tiles"][f"{rows_a},{block},{warps}"] = {"skipped": "past the sweep's time budget"}
                    continue
                tile = fused_ops.RowTile(rows_a, block, warps)
                fused_ops.FUSED_TILES = {**table, op: ((1 << 30, tile),)}
                try:
                    got = call()
                    res = _time_setting(call, replays)
                    res["bits_equal"] = bool(torch.equal(got, base))
                except Exception as exc:  # noqa: BLE001 - a tile that does not build keeps the others
                    res = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                finally:
                    fused_ops.FUSED_TILES = table
                row["tiles"][f"{rows_a},{block},{warps}"] = res
            timed = {key: r["us"] for key, r in row["tiles"].items() if "us" in r}
            row["best"] = min(timed, key=timed.get) if timed else None
            row["best_us"] = timed.get(row["best"])
            row["all_bits_equal"] = all(r.get("bits_equal", True) for r in row["tiles"].values())
            entry[op] = row
        print(
            f"fused T={T}: "
            + str(
                {
                    op: (r["table_us"], r["best"], r["best_us"], r["all_bits_equal"], r["max_abs_err_vs_reference"])
                    for op, r in entry.items()
                }
            ),
            file=sys.stderr,
            flush=True,
        )
        return entry

    for T in rows:
        out[str(T)] = at_rows(T)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shape", default="qwen3.8-27b-like")
    ap.add_argument("--rows", default="1,8,16,17,32,33")
    ap.add_argument("--attention-rows", default="1,8,17,32,33", help="row counts of the attention and fused sweeps")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--sections", default="linears,attention,fused")
    ap.add_argument("--budget-s", type=float, default=float("inf"), help="seconds each sweep section may time for")
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
    att_rows = [int(r) for r in args.attention_rows.split(",")]
    for name, fn in (("attention", attention), ("fused", fused)):
        if name in sections:
            _DEADLINE[0] = time.perf_counter() + args.budget_s
            try:
                result[name] = fn(shape, att_rows, args.context, device, args.replays)
            except Exception as exc:  # noqa: BLE001 - the other sections still come
                result[name] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
