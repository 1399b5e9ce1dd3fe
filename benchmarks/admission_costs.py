"""The composed engine's step times that prompt admission trades between, at the 4B-like and 27B-like shapes
(synthetic weights made on the GPU), each as one CUDA graph:

* ``T_step_ms[B]``: the decode step of B requests verifying a chain of 16 drafted tokens (17 rows each) — the
  step a waiting prompt's rows would join;
* ``T_mixed_ms[B][S]``: the same step with one S-row prompt segment of another request in the same forward
  (``SystemModel.step_with_segments``: the projections and MLP GEMMs over all rows, the segment's attention and
  GDN over its own cache slot, committed as a chunked prefill);
* ``T_prefill_ms[S]``: stock's separate prefill pass of S prompt rows (``SystemDecoder.prefill``'s pass, the
  prefill option set) — what every request in flight waits for when a prompt is not admitted;
* ``T_draft_ms[B]``: the drafter's pass over B requests' 16-position blocks (the synthetic 5-layer drafter).

Decode steps use SpecPilot's batched option set (GDN path verify): stock's snapshot verify does not fit 27B-like
at 32+ requests (one fp32 state per row and GDN layer).

    PYTHONPATH=kernels:. python3 benchmarks/admission_costs.py --out admission-costs-h200.json
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python3 benchmarks/admission_costs.py --device cpu --smoke   # dry run
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

SHAPES = {"4b": "qwen3.5-4b-like", "27b": "qwen3.8-27b-like"}
CHAIN_ROWS = 17  # stock's verify rows per request: the root and DFlash's 16-position chain


def time_segments(model, caches, B: int, rows: int, segment: int, context: int, timer) -> float:
    """ms of one decode step of B requests (``rows`` chain rows each) with one ``segment``-row prompt segment of the
    request in cache slot B (its first ``context // 2`` prompt tokens already in), as one CUDA graph."""
    from specpilot_mem.engine.system import StepBuffers, pack_trees
    from system_bench import step_trees

    shape = model.shape
    buf = StepBuffers.empty(B, rows, shape.conv_size, model.device)
    trees, deepest = step_trees(B, rows, False, shape.vocab_size)
    buf.fill(pack_trees(trees, rows, shape.conv_size))
    buf.forced.copy_(torch.tensor(deepest))
    seg = StepBuffers.empty(1, segment, shape.conv_size, model.device)
    seg_trees, _ = step_trees(1, segment, False, shape.vocab_size, seed=B)
    seg.fill(pack_trees(seg_trees, segment, shape.conv_size))
    seg.forced.fill_(segment - 1)
    view = caches.view(B)
    base = torch.full((caches.lengths.shape[0],), context, dtype=torch.long, device=model.device)
    base[B] = context // 2

    def reset():
        caches.lengths.copy_(base)

    reset()
    key = ("segments", B, rows, segment)
    ms = timer.ms(lambda: model.graphed(key, lambda: model.step_with_segments(buf, caches, [(seg, view)])), reset)
    model.release_buffers()
    return ms


def measure_shape(name: str, args, timer, device, dtype) -> dict:
    from specpilot_mem.engine.decode import PREFILL_CHUNK
    from specpilot_mem.engine.options import SystemOptions
    from specpilot_mem.engine.shapes import get_shape
    from specpilot_mem.engine.system import Caches, SystemModel, Weights
    from system_bench import time_draft, time_model

    shape = get_shape(SHAPES[name], args.smoke)
    batches = [int(b) for b in args.batches.split(",")]
    segments = [int(s) for s in args.segments.split(",")]
    out = {
        "shape": shape.to_dict(),
        "T_step_ms": {},
        "T_mixed_ms": {},
        "T_prefill_ms": {},
        "T_draft_ms": {},
        "errors": {},
    }
    started = time.perf_counter()
    weights = Weights.synthetic(shape, device, dtype)
    # one slot more than the largest batch: the admitted prompt's
    caches = Caches(shape, max(batches) + 1, args.context + max(segments + [CHAIN_ROWS]) + 8, device, dtype)
    caches.randomize(args.context)
    decode = SystemModel(weights, SystemOptions(gdn_verify="path"))
    prefill = SystemModel(weights, SystemOptions())  # the decoder's prefill option set (snapshot GDN, chain)
    for s in sorted({s for s in segments if s <= PREFILL_CHUNK} | {PREFILL_CHUNK}):  # longer: PREFILL_CHUNK passes
        try:
            out["T_prefill_ms"][str(s)] = time_model(prefill, caches, 1, s, args.context, timer)
        except Exception as exc:  # noqa: BLE001 - keep the other figures
            out["errors"][f"prefill/{s}"] = f"{type(exc).__name__}: {exc}"[:300]
    for b in batches:
        try:
            out["T_step_ms"][str(b)] = time_model(decode, caches, b, CHAIN_ROWS, args.context, timer)
        except Exception as exc:  # noqa: BLE001
            out["errors"][f"step/{b}"] = f"{type(exc).__name__}: {exc}"[:300]
        try:
            out["T_draft_ms"][str(b)] = time_draft(prefill, b, timer, positions=CHAIN_ROWS - 1)
        except Exception as exc:  # noqa: BLE001
            out["errors"][f"draft/{b}"] = f"{type(exc).__name__}: {exc}"[:300]
        if not hasattr(decode, "step_with_segments"):
            out["errors"]["mixed"] = "this commit's engine has no step_with_segments"
            continue
        out["T_mixed_ms"][str(b)] = {}
        for s in segments:
            try:
                out["T_mixed_ms"][str(b)][str(s)] = time_segments(decode, caches, b, CHAIN_ROWS, s, args.context, timer)
            except Exception as exc:  # noqa: BLE001
                out["errors"][f"mixed/{b}/{s}"] = f"{type(exc).__name__}: {exc}"[:300]
        print(f"{name} B={b}: step {out['T_step_ms'].get(str(b))} mixed {out['T_mixed_ms'][str(b)]}", file=sys.stderr)
    out["seconds"] = round(time.perf_counter() - started, 1)
    del weights, caches, decode, prefill
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="the engine's tiny smoke shapes (CPU dry run)")
    ap.add_argument("--shapes", default="4b,27b")
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--segments", default="16,64,128", help="prompt segment rows (mixed steps)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--bursts", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    doc = {**result_header("admission_costs"), "synthetic": True, "context": args.context, "shapes": {}}
    try:
        from system_bench import Timer
    except ImportError as exc:
        doc["skipped"] = f"composed engine not importable: {exc}"
        print_result(doc, args.out)
        return 0
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    timer = Timer(device, 2 if args.smoke else args.iters, bursts=1 if args.smoke else args.bursts)
    for name in args.shapes.split(","):
        if name not in SHAPES:
            raise SystemExit(f"--shapes: unknown {name!r}; use {', '.join(SHAPES)}")
        doc["shapes"][name] = measure_shape(name, args, timer, device, dtype)
        if args.out:
            write_result(doc, args.out)
    print_result(doc, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
