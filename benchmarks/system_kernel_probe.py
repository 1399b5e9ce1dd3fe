"""Where the system engine's verify step spends its time, kernel by kernel (torch.profiler, CUDA activity).

    PYTHONPATH=kernels:. python benchmarks/system_kernel_probe.py --out probe.json                 # H200
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python benchmarks/system_kernel_probe.py --device cpu --smoke

For each row count (and the AR decode step) of the 27B-like stock step (synthetic weights made on the GPU, one
request or ``--batch`` of them, ``--context`` tokens of cache): the graph-replay step time (CUDA events), then two profiled runs —
eager steps, where every kernel launch is attributed to the engine part that issued it (the layer mixers, the
MLPs, the attention context, the LM head, acceptance, commit, and "residual+norm" for what the pass itself
launches), and CUDA-graph replays, where the kernels are the same but have no launch to attribute them by (the
eager run's name -> part shares apportion them). Per part and per kernel name: launches per step and GPU µs
per step; for the graph replay also the step time minus the summed kernel time (the gaps between kernels).

On a CPU (dry run) the "kernels" are the top-level torch operators' CPU time; only the code path is checked.
Imports only torch, triton, numpy (the GPU machine has nothing else).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.engine.options import SystemOptions  # noqa: E402
from specpilot_mem.engine.shapes import get_shape  # noqa: E402
from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees  # noqa: E402
from benchmarks.system_bench import READ_BW  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

LABEL = "timing: synthetic weights at the paper's shapes"
# SystemModel methods whose launches form one part each (innermost wins); the rest of forward is "residual+norm"
PARTS = {
    "forward": "residual+norm",
    "_attn_context": "attn_context",
    "_gdn": "gdn_layer",
    "_attn": "attn_layer",
    "_mlp": "mlp",
    "head_argmax": "lm_head",
    "accept": "accept",
    "commit": "commit",
}
MARK = "probe::"


def annotate(model: SystemModel) -> None:
    """Wrap the model's parts in profiler ranges (instance attributes shadow the methods; eager runs only)."""
    for method, part in PARTS.items():
        inner = getattr(model, method)

        def wrapped(*args, _inner=inner, _part=part, **kwargs):
            with torch.profiler.record_function(MARK + _part):
                return _inner(*args, **kwargs)

        setattr(model, method, wrapped)


def kineto_tables(prof, steps: int, device_kernels: bool) -> dict:
    """``_kineto_tables``, or when the profiler's raw events do not read as expected, its averaged table."""
    try:
        return _kineto_tables(prof, steps, device_kernels)
    except Exception as exc:  # noqa: BLE001 - a probe keeps what it can read
        sort = "self_cuda_time_total" if device_kernels else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=60, max_name_column_width=90)
        return {
            "error": f"{type(exc).__name__}: {exc}",
            "table": table.splitlines(),
            "by_kernel": [],
            "kernels_per_step": None,
            "kernel_us_per_step": 0.0,
            "by_part": {},
        }


def _kineto_tables(prof, steps: int, device_kernels: bool) -> dict:
    """Per part and per kernel name: launches and µs per step. Kernels are attributed through the CPU launch
    call they are linked to (correlation id), that call to the innermost probe range around it on its thread."""
    events = list(prof.profiler.kineto_results.events())
    cuda = torch.autograd.DeviceType.CUDA
    cpu_events = [e for e in events if e.device_type() != cuda]
    ranges = defaultdict(list)  # thread -> [(start, end, part)]
    for e in cpu_events:
        if e.name().startswith(MARK):
            ranges[e.start_thread_id()].append((e.start_ns(), e.start_ns() + e.duration_ns(), e.name()[len(MARK) :]))

    def part_at(thread, t):
        best, width = "unattributed", None
        for start, end, part in ranges.get(thread, ()):
            if start <= t <= end and (width is None or end - start < width):
                best, width = part, end - start
        return best

    if device_kernels:
        launch = {e.correlation_id(): (e.start_thread_id(), e.start_ns()) for e in cpu_events if e.correlation_id()}
        kernels = []
        for e in events:
            if e.device_type() != cuda or e.is_user_annotation() or e.name().startswith(MARK):
                continue  # the ranges' GPU-side copies are not kernels
            corr = e.linked_correlation_id() or e.correlation_id()
            where = launch.get(corr)
            part = part_at(*where) if where else "unattributed"
            kernels.append((e.name(), e.duration_ns() / 1e3, part))
    else:  # CPU dry run: the top-level operators stand in for kernels
        ops = [e for e in cpu_events if e.name().startswith("aten::")]
        ops.sort(key=lambda e: e.start_ns())
        kernels, end = [], -1
        for e in ops:
            if e.start_ns() >= end:  # top level only (nested aten calls are inside their caller)
                kernels.append((e.name(), e.duration_ns() / 1e3, part_at(e.start_thread_id(), e.start_ns())))
                end = e.start_ns() + e.duration_ns()
    by_name = defaultdict(lambda: [0, 0.0, defaultdict(int)])
    by_part = defaultdict(lambda: [0, 0.0])
    for name, us, part in kernels:
        row = by_name[name]
        row[0], row[1] = row[0] + 1, row[1] + us
        row[2][part] += 1
        by_part[part][0] += 1
        by_part[part][1] += us
    return {
        "kernels_per_step": round(len(kernels) / steps, 2),
        "kernel_us_per_step": round(sum(k[1] for k in kernels) / steps, 1),
        "by_part": {
            p: {"launches": round(n / steps, 2), "us": round(us / steps, 1)}
            for p, (n, us) in sorted(by_part.items(), key=lambda kv: -kv[1][1])
        },
        "by_kernel": [
            {
                "name": name[:160],
                "count": round(n / steps, 2),
                "us": round(us / steps, 1),
                "mean_us": round(us / n, 2),
                "parts": {p: round(c / steps, 2) for p, c in parts.items()},
            }
            for name, (n, us, parts) in sorted(by_name.items(), key=lambda kv: -kv[1][1])
        ],
    }


def apportion(graph: dict, eager: dict) -> dict:
    """The graph replay's kernel time per part, each kernel name split as the eager run's launches of it were."""
    shares = {k["name"]: k["parts"] for k in eager["by_kernel"]}
    parts = defaultdict(lambda: [0.0, 0.0])
    for k in graph["by_kernel"]:
        split = shares.get(k["name"]) or {"not in eager run": 1.0}
        total = sum(split.values())
        for part, c in split.items():
            parts[part][0] += k["count"] * c / total
            parts[part][1] += k["us"] * c / total
    return {
        p: {"launches": round(n, 2), "us": round(us, 1)}
        for p, (n, us) in sorted(parts.items(), key=lambda kv: -kv[1][1])
    }


def kernel_check(shape, device, context: int, rows: int = 17) -> dict:
    """Each fused kernel against its torch reference at the shape's own sizes (bf16 on the GPU): max abs error."""
    from specpilot_kernels import fused_ops as K

    gen = torch.Generator(device=device).manual_seed(1)
    dt = torch.bfloat16

    def rnd(*size, dtype=dt):
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).to(dtype)

    B, T = 1, rows
    out = {}
    hq, hkv, D, L = shape.attn_heads, shape.attn_kv_heads, shape.attn_head_dim, context + rows + 8
    sizes = [hq * D, hq * D, hkv * D, hkv * D]
    proj = rnd(B, T, sum(sizes))
    q, gate, k, v = proj.split(sizes, dim=-1)
    q, k, v = q.view(B, T, hq, D), k.view(B, T, hkv, D), v.view(B, T, hkv, D)
    lengths = torch.full((B,), context, device=device)
    ang = (lengths[:, None] + torch.arange(T, device=device)).float()[..., None] * (
        1.0 / (10000.0 ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D))
    )
    cos, sin = ang.cos(), ang.sin()
    qw, kw = rnd(D), rnd(D)
    slots = lengths[:, None] + torch.arange(T, device=device)
    caches = [rnd(B, hkv, L, D) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    want = K.qk_norm_rope_reference(q, k, v, cos, sin, qw, kw, 1e-6, *ref_caches, slots)
    got = K.qk_norm_rope(q, k, v, cos, sin, qw, kw, 1e-6, *caches, slots)
    out["qk_norm_rope"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, want))
    out["qk_norm_rope_cache"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(caches, ref_caches))
    gu = rnd(B, T, 2 * shape.ffn_dim)
    out["silu_mul"] = (K.silu_mul(gu).float() - K.silu_mul_reference(gu).float()).abs().max().item()
    anc = torch.ones(T, T, dtype=torch.bool, device=device).tril()[None]
    qr, kr, vr = want
    ref = K.tree_attention_reference(qr, *caches, kr, vr, lengths, anc, gate)
    out["tree_attention"] = (
        (K.tree_attention(qr, *caches, kr, vr, lengths, anc, gate).float() - ref.float()).abs().max().item()
    )
    if shape.gdn_layers:
        C, HV, N, CS = shape.gdn_conv_channels, shape.gdn_value_heads, shape.gdn_head_dim, shape.conv_size
        gproj = rnd(B, T, C + HV * N + 2 * HV)
        x, z = gproj[..., :C], gproj[..., C : C + HV * N].view(B, T, HV, N)
        state, weight = rnd(B, CS - 1, C), rnd(C, CS)
        idx = torch.as_tensor(pack_trees([(list(range(T)), list(range(-1, T - 1)))], T, CS)["conv_idx"]).to(device)
        raw = torch.empty(B, T, C, device=device, dtype=dt)
        got = K.tree_conv_silu(state, x, idx, weight, raw=raw)
        out["tree_conv_silu"] = (
            (got.float() - K.tree_conv_silu_reference(state, x, idx, weight).float()).abs().max().item()
        )
        out["tree_conv_raw_exact"] = bool(torch.equal(raw, x))
        o, w = rnd(B, T, HV, N), rnd(N)
        ref = K.gated_rms_norm_reference(o, w, z, 1e-6)
        out["gated_rms_norm"] = (K.gated_rms_norm(o, w, z, 1e-6).float() - ref.float()).abs().max().item()
        G = 4
        pool, snaps = rnd(G, 3, HV, N, N, dtype=torch.float32), rnd(G, B, T, HV, N, N, dtype=torch.float32)
        conv, raws = rnd(G, 3, CS - 1, C), rnd(G, B, T, C)
        deepest, keep = torch.full((B,), T - 1, device=device), torch.ones(B, dtype=torch.bool, device=device)
        p2, c2 = pool.clone(), conv.clone()
        K.select_states_reference(p2[:, 1 : 1 + B], snaps, deepest, keep)
        K.conv_commit_reference(c2[:, 1 : 1 + B], raws, idx, deepest, keep)
        K.select_states(pool[:, 1 : 1 + B], snaps, deepest, keep)
        K.conv_commit(conv[:, 1 : 1 + B], raws, idx, deepest, keep)
        out["commits_exact"] = bool(torch.equal(pool, p2) and torch.equal(conv, c2))
    return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--shape", default="qwen3.8-27b-like")
    ap.add_argument("--rows", default="ar,1,17,33", help="comma-separated row counts; 'ar': the decode step")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1, help="requests in the step (chains of --rows rows each)")
    ap.add_argument("--linears", default="bf16")
    ap.add_argument("--lm-head", default="bf16")
    ap.add_argument("--gdn-verify", default="snapshot", help="snapshot (stock) or path")
    ap.add_argument("--tree", default="chain", help="chain (stock) or best-first (the commit moves KV rows)")
    ap.add_argument("--eager-steps", type=int, default=2)
    ap.add_argument("--graph-steps", type=int, default=5)
    ap.add_argument("--time-steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=40, help="kernel names kept per table")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.smoke:
        args.context = min(args.context, 24)
    shape = get_shape(args.shape, args.smoke)
    row_list = [r for r in args.rows.split(",")]
    max_rows = max([int(r) for r in row_list if r != "ar"] + [1])
    result = {
        **result_header("system_kernel_probe"),
        "label": LABEL,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "shape": shape.name,
        "smoke": args.smoke,
        "context": args.context,
        "batch": args.batch,
        "weight_floor_ms": round(shape.weight_floor_ms(READ_BW), 4),
        "options": options(args).label(),
        "by_rows": {},
    }
    t0 = time.perf_counter()
    weights = Weights.synthetic(shape, device, torch.bfloat16)
    caches = Caches(shape, args.batch, args.context + max_rows + 8, device, torch.bfloat16)
    caches.randomize(args.context)
    if cuda:
        torch.cuda.synchronize()
    result["weights_s"] = round(time.perf_counter() - t0, 2)
    try:
        # one row count per row range of the fused ops' tiles (fused_ops.FUSED_TILES, ATTENTION_TILES)
        result["kernel_check"] = {str(r): kernel_check(shape, device, args.context, r) for r in (1, 8, 17, 33)}
    except Exception as exc:  # noqa: BLE001 - the timings still come
        result["kernel_check"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
    print(f"kernel check: {result['kernel_check']}", file=sys.stderr, flush=True)
    for label in row_list:
        try:
            result["by_rows"][label] = probe_rows(label, args, shape, weights, caches, result["weight_floor_ms"])
        except Exception as exc:  # noqa: BLE001 - one failing setting keeps the others'
            result["by_rows"][label] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
            print(f"rows {label}: {result['by_rows'][label]}", file=sys.stderr, flush=True)
    result["growth"] = growth(result["by_rows"])
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print_result(result, args.out)
    return 0


# kernel classes by name: what stock takes as SGLang runs it (cuBLAS's GEMMs, SGLang's GDN kernel) and the rest
KERNEL_CLASSES = (
    ("gemm", ("nvjet", "cublas", "void cublasLt", "cutlass", "sm90_xmma", "void w12::")),
    ("sglang_gdn", ("fused_sigmoid_gating", "fused_recurrent")),
    ("engine_fused_ops", ("_",)),
)


def kernel_class(name: str) -> str:
    return next((cls for cls, prefixes in KERNEL_CLASSES if name.startswith(prefixes)), "other")


def growth(by_rows: dict) -> dict:
    """Per kernel class, graph-replay µs a step at each row count and its growth over the fewest rows; and the
    step at the most rows if only the GEMMs and SGLang's GDN kernel grew (what stock keeps whatever the engine's own
    kernels do): that over the fewest rows' step is stock's irreducible ratio on this run."""
    rows = sorted((int(r), e) for r, e in by_rows.items() if r != "ar" and "graph" in e)
    if len(rows) < 2:
        return {}
    per = {}
    for r, e in rows:
        classes = defaultdict(float)
        for k in e["graph"]["by_kernel"]:
            classes[kernel_class(k["name"])] += k["us"]
        per[str(r)] = {cls: round(us, 1) for cls, us in classes.items()}
    first, (r_last, e_last) = rows[0], rows[-1]
    lo, hi = per[str(first[0])], per[str(r_last)]
    grew = {cls: round(hi.get(cls, 0.0) - lo.get(cls, 0.0), 1) for cls in set(lo) | set(hi)}
    out = {"us_by_class": per, f"growth_us_{first[0]}_to_{r_last}": grew}
    step_lo = first[1].get("graph_step_ms")
    if step_lo:
        kept = step_lo + (grew.get("gemm", 0.0) + grew.get("sglang_gdn", 0.0)) / 1e3
        out[f"stock_kept_ratio_{r_last}_over_{first[0]}"] = round(kept / step_lo, 4)
        if e_last.get("graph_step_ms"):
            out[f"step_ratio_{r_last}_over_{first[0]}"] = round(e_last["graph_step_ms"] / step_lo, 4)
    return out


def options(args) -> SystemOptions:
    """The step's option set (default stock); a best-first tree's node budget is the probe's widest row count."""
    widest = max([int(r) for r in args.rows.split(",") if r != "ar"] + [2])
    tree = {} if args.tree == "chain" else {"tree": args.tree, "nodes": widest - 1, "positions": min(16, widest - 1)}
    return SystemOptions(linears=args.linears, lm_head=args.lm_head, gdn_verify=args.gdn_verify, **tree)


def probe_rows(label, args, shape, weights, caches, floor_ms) -> dict:
    device = weights.device
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    base = torch.full_like(caches.lengths, args.context)
    ar = label == "ar"
    rows = 1 if ar else int(label)
    t1 = time.perf_counter()
    model = SystemModel(weights, options(args))
    buf = StepBuffers.empty(args.batch, rows, shape.conv_size, device)
    buf.fill(pack_trees([(list(range(rows)), list(range(-1, rows - 1)))] * args.batch, rows, shape.conv_size))
    buf.forced.fill_(rows - 1)

    def step(model=model, buf=buf, ar=ar):
        caches.lengths.copy_(base)
        return model.step(buf, caches, ar=ar)

    key = ("probe", rows, ar)
    entry = {}
    with torch.no_grad():
        model.graphed(key, step)  # builds kernels, captures the graph
        step()
        if cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for name, fn in (
                ("graph_step_ms", lambda m=model, k=key, f=step: m.graphed(k, f)),
                ("eager_step_ms", step),
            ):
                fn()
                start.record()
                for _ in range(args.time_steps):
                    fn()
                end.record()
                torch.cuda.synchronize()
                entry[name] = round(start.elapsed_time(end) / args.time_steps, 4)
            entry["graph_error"] = model.graph_error
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.graph_steps):
                model.graphed(key, step)
            if cuda:
                torch.cuda.synchronize()
        graph = kineto_tables(prof, args.graph_steps, cuda)
        annotate(model)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.eager_steps):
                step()
            if cuda:
                torch.cuda.synchronize()
        eager = kineto_tables(prof, args.eager_steps, cuda)
    graph["by_part_apportioned"] = apportion(graph, eager)
    if "graph_step_ms" in entry and graph["kernel_us_per_step"]:
        entry["graph_gaps_us_per_step"] = round(entry["graph_step_ms"] * 1e3 - graph["kernel_us_per_step"], 1)
        entry["floor_fraction"] = round(floor_ms / entry["graph_step_ms"], 4)
    for table in (graph, eager):
        table["by_kernel"] = table["by_kernel"][: args.top]
    entry["graph"], entry["eager"] = graph, eager
    entry["seconds"] = round(time.perf_counter() - t1, 1)
    model.release_buffers()
    summary = {k: entry.get(k) for k in ("graph_step_ms", "eager_step_ms", "graph_gaps_us_per_step")}
    print(f"rows {label}: {summary} kernels/step {graph['kernels_per_step']}", file=sys.stderr, flush=True)
    print(f"  graph parts: {graph['by_part_apportioned']}", file=sys.stderr, flush=True)
    return entry


if __name__ == "__main__":
    raise SystemExit(main())
