"""Where the composed engine's batched verify step spends its time (4B-like shape, synthetic weights).

    PYTHONPATH=kernels:. python3 benchmarks/probes/batched-probe-h200-2026-12-02/batched_verify_probe.py --out p.json
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python3 .../batched_verify_probe.py --device cpu --smoke   # dry run

For B requests in flight and R verify rows per request (a chain: root + R - 1 drafted positions), per option
set (stock: snapshot GDN verify; path: GDN path verify; both cuBLAS BF16 linears and head):
- the whole step (verify + accept + commit) as one CUDA-graph replay, and AR (one row, decode kernel);
- a torch.profiler kernel table of graph replays (eager steps where the profiler sees no graph kernels),
  grouped by kernel class, with the top kernels;
- isolated: SGLang's verify kernel alone with FP32 / BF16 snapshot buffers and without snapshots (one layer),
  and attention (SDPA with the boolean tree mask, with no mask, and FlashAttention-style unmasked) for one layer.
Imports only torch/triton/numpy/safetensors (+ this repository).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from specpilot_mem.engine.options import SystemOptions  # noqa: E402
from specpilot_mem.engine.shapes import get_shape  # noqa: E402
from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees  # noqa: E402
from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402
from system_bench import Timer, step_trees  # noqa: E402

CLASSES = [  # first match wins
    ("gdn_sglang", r"fused_sigmoid_gating|fused_recurrent"),
    ("gdn_path", r"gdn_tree|path_verify|tree_schedule|_commit|lanes"),
    ("attention", r"fmha|attention|flash|efficient|softmax|sdpa"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|sm90_|cublas|splitk|matmul"),
    ("fused_ops", r"rms_norm|silu|tree_conv|gated"),
    ("index_scatter", r"index|scatter|gather|put_"),
    ("copy", r"copy|cat|memcpy|memset|fill"),
    ("reduce", r"reduce|argmax|max_|sum"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
]


def classify(name: str) -> str:
    low = name.lower()
    for cls, pattern in CLASSES:
        if re.search(pattern, low):
            return cls
    return "other"


def kernel_table(run, reps: int, device) -> dict:
    """Device time per kernel class (ms per step) over ``reps`` calls of ``run``, and the top kernels."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(reps):
            run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    by_class: dict = defaultdict(float)
    kernels: dict = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if device.type == "cuda":
            if ev.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = ev.time_range.elapsed_us()
        else:  # CPU dry run: the aten ops' own time stands in for kernels
            if not ev.name.startswith("aten::") or ev.cpu_parent is not None:
                continue
            us = ev.self_cpu_time_total
        by_class[classify(ev.name)] += us
        kernels[ev.name][0] += us
        kernels[ev.name][1] += 1
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]
    return {
        "kernels_seen": sum(n for _, n in kernels.values()),
        "by_class_ms": {k: round(v / 1000 / reps, 4) for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "total_ms": round(sum(by_class.values()) / 1000 / reps, 4),
        "top": [
            {"name": name[:120], "ms_per_step": round(us / 1000 / reps, 4), "calls_per_step": n / reps}
            for name, (us, n) in top
        ],
    }


def step_setting(model, caches, B, rows, context, timer, ar, reps):
    shape = model.shape
    buf = StepBuffers.empty(B, rows, shape.conv_size, model.device)
    trees, deepest = step_trees(B, rows, False, shape.vocab_size)
    buf.fill(pack_trees(trees, rows, shape.conv_size))
    buf.forced.copy_(torch.tensor(deepest))
    base = torch.full((caches.lengths.shape[0],), context, dtype=torch.long, device=model.device)

    def reset():
        caches.lengths.copy_(base)

    key = ("probe", B, rows, ar)

    def graph_step():
        reset()
        return model.graphed(key, lambda: model.step(buf, caches, ar=ar))

    reset()
    out = {"step_ms": timer.ms(lambda: model.graphed(key, lambda: model.step(buf, caches, ar=ar)), reset)}
    table = kernel_table(graph_step, reps, model.device)
    out["profiled"] = "graph replay"
    if table["kernels_seen"] < 10:  # the profiler did not see inside the graph: profile eager steps

        def eager():
            reset()
            model.step(buf, caches, ar=ar)

        eager()
        table = kernel_table(eager, reps, model.device)
        out["profiled"] = "eager steps"
    out.update(table)
    model.release_buffers()
    return out


def isolated(model, caches, B, rows, timer) -> dict:
    """One GDN layer's SGLang verify kernel by snapshot dtype, and one attention layer by mask form."""
    s, dev, dt = model.shape, model.device, model.dtype
    gen = torch.Generator(device=dev).manual_seed(3)
    out = {}
    if s.gdn_layers and dev.type == "cuda":
        H, HV, D = s.gdn_key_heads, s.gdn_value_heads, s.gdn_head_dim
        q, k = (torch.randn(B, rows, H, D, generator=gen, device=dev).to(dt) for _ in range(2))
        v = torch.randn(B, rows, HV, D, generator=gen, device=dev).to(dt)
        a, b = (torch.randn(B, rows, HV, generator=gen, device=dev).to(dt) for _ in range(2))
        i = next(j for j, kind in enumerate(s.layer_types) if kind == "gdn")
        t = model.w.t
        pool = caches.state[i][:B]
        slots = torch.arange(B, dtype=torch.int32, device=dev)
        for name, dtype in (("snapshots_fp32", torch.float32), ("snapshots_bf16", torch.bfloat16), ("none", None)):
            inter = torch.empty(B, rows, HV, D, D, device=dev, dtype=dtype) if dtype else None

            def run(inter=inter):
                model._sglang(q, k, v, a, b, t[f"layers.{i}.A_log"], t[f"layers.{i}.dt_bias"], pool, slots, inter, None)

            out[f"gdn_layer_{name}_ms"] = timer.ms(lambda run=run, key=("iso", name, B, rows): model.graphed(key, run))
            del inter
        out["snapshot_bytes_per_layer_fp32"] = B * rows * HV * D * D * 4
    if s.attn_layers:
        hq, hkv, D, L = s.attn_heads, s.attn_kv_heads, s.attn_head_dim, caches.max_len
        rep = hq // hkv
        i = next(j for j, kind in enumerate(s.layer_types) if kind == "attn")
        kc, vc = caches.k[i][:B], caches.v[i][:B]
        qf = torch.randn(B, hkv, rep * rows, D, generator=gen, device=dev).to(dt)
        mask = torch.ones(B, 1, rep * rows, L, dtype=torch.bool, device=dev)
        F = torch.nn.functional
        forms = {
            "bool_mask": lambda: F.scaled_dot_product_attention(qf, kc, vc, attn_mask=mask),
            "no_mask": lambda: F.scaled_dot_product_attention(qf, kc, vc),
        }
        for name, fn in forms.items():
            try:
                out[f"attn_layer_{name}_ms"] = timer.ms(
                    lambda fn=fn, key=("attn", name, B, rows): model.graphed(key, fn)
                )
            except Exception as exc:  # noqa: BLE001 - keep the other forms
                out[f"attn_layer_{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    model.release_buffers()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--rows", default="1,5,9,17")
    ap.add_argument("--options", default="stock,path")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3, help="profiled steps per setting")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.smoke:
        args.context = min(args.context, 24)
    shape = get_shape("qwen3.5-4b-like", args.smoke)
    batches = [int(b) for b in args.batches.split(",")]
    rows_list = [int(r) for r in args.rows.split(",")]
    option_sets = {"stock": SystemOptions(), "path": SystemOptions(gdn_verify="path")}
    doc = {
        **result_header("batched_verify_probe"),
        "synthetic": True,
        "shape": shape.to_dict(),
        "context": args.context,
        "label": "timing: synthetic weights at the paper's shapes",
        "by_batch": {},
        "errors": {},
    }
    t0 = time.perf_counter()
    timer = Timer(device, 1 if args.smoke else args.iters, bursts=1 if args.smoke else 3)
    weights = Weights.synthetic(shape, device, dtype)
    caches = Caches(shape, max(batches), args.context + max(rows_list) + 8, device, dtype)
    caches.randomize(args.context)
    stock = SystemModel(weights, option_sets["stock"])
    doc["setup_s"] = round(time.perf_counter() - t0, 1)
    for B in batches:
        entry: dict = {}
        try:
            entry["ar"] = step_setting(stock, caches, B, 1, args.context, timer, True, args.reps)
        except Exception as exc:  # noqa: BLE001 - keep the other settings
            doc["errors"][f"ar/{B}"] = f"{type(exc).__name__}: {exc}"[:400]
        for name in args.options.split(","):
            model = stock.with_options(option_sets[name])
            entry[name] = {}
            for rows in rows_list:
                try:
                    entry[name][str(rows)] = step_setting(model, caches, B, rows, args.context, timer, False, args.reps)
                except Exception as exc:  # noqa: BLE001
                    doc["errors"][f"{name}/{B}/{rows}"] = f"{type(exc).__name__}: {exc}"[:400]
                print(f"B={B} {name} rows={rows}: {entry[name].get(str(rows), {}).get('step_ms')}", file=sys.stderr)
            if model.graph_error:
                doc["errors"][f"{name}/{B}/graph"] = model.graph_error
        try:
            entry["isolated_17"] = isolated(stock, caches, B, max(rows_list), timer)
        except Exception as exc:  # noqa: BLE001
            doc["errors"][f"isolated/{B}"] = f"{type(exc).__name__}: {exc}"[:400]
        doc["by_batch"][str(B)] = entry
        if args.out:
            write_result(doc, args.out)
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
