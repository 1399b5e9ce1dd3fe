"""Step times of the composed engine (``specpilot_mem.engine.system``) at the rows the batching policies use:
T_AR(B), the drafter's pass at blocks 16/12/8 and the verify step (verify + accept + commit, one CUDA graph)
with T rows per request, for B requests in flight, at the 4B-like or 27B-like shape (``--shape``; synthetic
weights made on the GPU).
Per option set (``--variants``): ``stock`` (SGLang's snapshot GDN verify: ``T_step_ms``) and ``path`` (SpecPilot's
batched option set, GDN path verify: ``T_step_path_ms``), both best-first trees, cuBLAS BF16 linears and head.

    PYTHONPATH=kernels:. python3 benchmarks/batched_engine_costs.py --out batched-engine-costs-h200.json
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python3 benchmarks/batched_engine_costs.py --device cpu --smoke   # dry run

Reuses ``benchmarks/system_bench.py``'s timing of the engine (its ``time_model``/``time_draft``, stock options).
The per-request part of a step (KV and state traffic), T_AR(B) minus the target GEMMs at B rows, is what
``benchmarks/batched_bench.py --engine-costs`` takes from here; the rest of its costs are ``batched_costs.py``'s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402

SHAPES = ("qwen3.5-4b-like", "qwen3.8-27b-like")


def isolated(args, doc: dict, argv: list[str]) -> int:
    """Run every batch size in a child process of this script; merge what each measured (or how it failed)."""
    import json
    import subprocess
    import tempfile

    base = [a for a in argv if a != "--isolate"]
    for flag in ("--batches", "--out"):
        if flag in base:
            i = base.index(flag)
            del base[i : i + 2]
    for b in args.batches.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / "part.json"
            run = subprocess.run(
                [sys.executable, __file__, *base, "--batches", b, "--out", str(part)], capture_output=True, text=True
            )
            if part.exists():
                child = json.loads(part.read_text())
                doc["by_batch"].update(child.get("by_batch", {}))
                doc["errors"].update(child.get("errors", {}))
                for key in ("shape", "skipped"):
                    if key in child:
                        doc[key] = child[key]
            if run.returncode:
                doc["errors"][f"process/{b}"] = f"exit {run.returncode}: {run.stderr.strip()[-300:]}"
        print(f"B={b}: {doc['by_batch'].get(b, 'failed')}", file=sys.stderr, flush=True)
        if args.out:
            write_result(doc, args.out)
    print_result(doc, args.out)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", default=SHAPES[0], choices=SHAPES)
    ap.add_argument("--smoke", action="store_true", help="the engine's tiny smoke shape (CPU dry run)")
    ap.add_argument("--batches", default="1,8,16,24,32,64")
    ap.add_argument("--rows", default="2,3,5,9,17", help="verify rows per request (root included)")
    ap.add_argument("--blocks", default="16,12,8")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--variants", default="stock,path", help="option sets: stock (T_step_ms), path (T_step_path_ms)")
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--isolate",
        action="store_true",
        help="each batch size in its own process (a device-side assert poisons its CUDA context only)",
    )
    args = ap.parse_args(argv)
    doc = {
        **result_header("batched_engine_costs"),
        "synthetic": True,
        "shape_name": args.shape,
        "context": args.context,
        "by_batch": {},
        "errors": {},
    }
    if args.isolate:
        return isolated(args, doc, argv if argv is not None else sys.argv[1:])
    try:
        from specpilot_mem.engine.options import SystemOptions
        from specpilot_mem.engine.shapes import get_shape
        from specpilot_mem.engine.system import Caches, SystemModel, Weights
        from system_bench import Timer, time_draft, time_model
    except ImportError as exc:  # the composed engine is not in this tree: say so, measure nothing
        doc["skipped"] = f"composed engine not importable: {exc}"
        print_result(doc, args.out)
        return 0
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = get_shape(args.shape, args.smoke)
    batches = [int(b) for b in args.batches.split(",")]
    rows = [int(r) for r in args.rows.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    timer = Timer(device, 2 if args.smoke else args.iters, bursts=1 if args.smoke else args.bursts)
    weights = Weights.synthetic(shape, device, dtype)
    caches = Caches(shape, max(batches), args.context + max(rows) + 8, device, dtype)
    caches.randomize(args.context)
    stock = SystemModel(weights, SystemOptions())
    tree_options = SystemOptions(tree="best-first", positions=max(rows) - 1, nodes=max(rows) - 1)
    variants = {
        "stock": ("T_step_ms", stock.with_options(tree_options)),
        "path": ("T_step_path_ms", stock.with_options(tree_options.replace(gdn_verify="path"))),
    }
    chosen = [v for v in args.variants.split(",") if v]
    unknown = set(chosen) - set(variants)
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))}; use stock, path")
    doc["shape"] = shape.to_dict()
    for b in batches:
        started = time.perf_counter()
        entry = {
            "T_AR_ms": time_model(stock, caches, b, 1, args.context, timer, ar=True),
            "T_draft_ms": {},
            **{variants[v][0]: {} for v in chosen},
        }
        for block in blocks:
            try:
                entry["T_draft_ms"][str(block)] = time_draft(stock, b, timer, positions=block)
            except Exception as exc:  # noqa: BLE001 - keep the other figures
                doc["errors"][f"draft/{b}/{block}"] = f"{type(exc).__name__}: {exc}"[:300]
        for v in chosen:
            key, model = variants[v]
            for r in rows:
                try:
                    entry[key][str(r)] = time_model(model, caches, b, r, args.context, timer)
                except Exception as exc:  # noqa: BLE001 - e.g. stock's snapshot buffers out of memory at the 27B-like shape
                    doc["errors"][f"step/{v}/{b}/{r}"] = f"{type(exc).__name__}: {exc}"[:300]
                    model.release_buffers()
        entry["seconds"] = round(time.perf_counter() - started, 1)
        doc["by_batch"][str(b)] = entry
        print(f"B={b}: {entry}", file=sys.stderr, flush=True)
        if args.out:
            write_result(doc, args.out)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
