"""The composed system on one GPU: stock vs each SpecPilot mechanism vs all of them, at the paper's shapes.

    PYTHONPATH=kernels:. python benchmarks/system_bench.py --out system.json               # H200, one call
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python benchmarks/system_bench.py --device cpu --smoke   # dry run

Sections (each recorded as soon as it ends; a failing one records its error and the next runs):
- ``check``: the trained pair through the system, every option set vs stock: greedy tokens identical to the
  existing engine's AR decode (fp32 on the CPU, bf16 and fp32 on the GPU), acceptance, tau.
- ``single``: the 27B-like shape, one request: T_AR (the decode step) and the verify step (verify + accept +
  commit, one CUDA graph) at 1..64 rows for each option set, the draft pass, the weight floor.
- ``batched``: the 4B-like and 8B-like shapes with 8, 16 and 32 requests: T_AR, T_draft, T_step of stock and
  SpecPilot.
- ``profile``: per kernel class of the stock and the all-mechanisms step, in the cost model's profile format
  (``--profile-dir``; ``specpilot-mem ceiling FILE`` prints the factorization).
- ``speedup``: S(N) = tau(N) / c(N), c(N) = T_step(N) / T_AR, tau(N) from exact replay on lattices recorded from
  the trained pair, speedup over AR and gain over stock per setting.

timing: synthetic weights at the paper's shapes (seeded N(0, 0.02), made on the GPU); tau: the small pair
trained here. The verify step's acceptance is pinned (``forced``) to the deepest root path, so commit costs
are the largest a tree of that shape can have.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.engine.options import SystemOptions, check_fits, memory_needed  # noqa: E402
from specpilot_mem.engine.shapes import get_shape  # noqa: E402
from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees  # noqa: E402
from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402

LABEL = "timing: synthetic weights at the paper's shapes; tau: the small pair trained here"
READ_BW = 4.35e12  # H200 read-only bandwidth measured here (shared/reference/kernel-notes.md)

SINGLE_OPTIONS = {
    "stock": SystemOptions(),
    "w12_linears": SystemOptions(linears="w12"),
    "w12_linears_head": SystemOptions(linears="w12", lm_head="w12"),
    "certified_head": SystemOptions(lm_head="certified"),
    "gdn_path": SystemOptions(gdn_verify="path"),
    "all": SystemOptions(linears="w12", lm_head="certified", gdn_verify="path", tree="best-first", nodes=32),
}
BATCHED_OPTIONS = {
    "stock": SystemOptions(),
    "specpilot": SystemOptions(linears="w12", lm_head="w12", gdn_verify="path"),
}


def random_tree(n: int, seed: int, chain_bias: float = 0.6) -> list[int]:
    """Parents of an n-node tree below the root (-1: the root): node i under i-1 with probability chain_bias."""
    gen = torch.Generator().manual_seed(seed)
    parents = [-1]
    for i in range(1, n):
        parents.append(i - 1 if torch.rand((), generator=gen) < chain_bias else int(torch.randint(0, i, (), generator=gen)))
    return parents


def step_trees(B: int, rows: int, tree: bool, vocab: int, seed: int = 0):
    """B requests' verify rows (a chain, or a random tree of ``rows`` nodes) and each one's deepest node."""
    gen = torch.Generator().manual_seed(seed)
    trees, deepest = [], []
    for b in range(B):
        parents = random_tree(rows, seed + b) if tree else list(range(-1, rows - 1))
        tokens = torch.randint(0, vocab, (rows,), generator=gen).tolist()
        depth = [0] * rows
        for i in range(1, rows):
            depth[i] = depth[parents[i]] + 1
        trees.append((tokens, parents))
        deepest.append(max(range(rows), key=lambda i: depth[i]))
    return trees, deepest


class Timer:
    def __init__(self, device: torch.device, iters: int, bursts: int = 5):
        self.device, self.iters, self.bursts = device, iters, bursts

    def ms(self, fn, reset=None) -> float:
        """Median over 5 bursts of the mean ms per call of ``fn`` (``reset`` runs before each call, untimed on
        the CPU, inside the burst on the GPU: a one-kernel copy)."""
        samples = []
        for _ in range(self.bursts):
            if self.device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(self.iters):
                    if reset:
                        reset()
                    fn()
                end.record()
                torch.cuda.synchronize()
                samples.append(start.elapsed_time(end) / self.iters)
            else:
                total = 0.0
                for _ in range(self.iters):
                    if reset:
                        reset()
                    t0 = time.perf_counter()
                    fn()
                    total += time.perf_counter() - t0
                samples.append(total * 1000 / self.iters)
        return round(statistics.median(samples), 4)


def time_model(model: SystemModel, caches: Caches, B: int, rows: int, context: int, timer: Timer,
               ar: bool = False) -> float:
    """ms of one verify step (verify + accept + commit) of B requests with ``rows`` rows each, as one CUDA graph."""
    shape = model.shape
    buf = StepBuffers.empty(B, rows, shape.conv_size, model.device)
    trees, deepest = step_trees(B, rows, model.options.tree != "chain" and not ar, shape.vocab_size)
    buf.fill(pack_trees(trees, rows, shape.conv_size))
    buf.forced.copy_(torch.tensor(deepest))
    base = torch.full((caches.lengths.shape[0],), context, dtype=torch.long, device=model.device)

    def reset():
        caches.lengths.copy_(base)

    reset()
    key = ("step", B, rows, ar)
    ms = timer.ms(lambda: model.graphed(key, lambda: model.step(buf, caches, ar=ar)), reset)
    model.release_buffers()
    return ms


def time_draft(model: SystemModel, B: int, timer: Timer, positions: int = 16) -> float:
    shape = model.shape
    buf = StepBuffers.empty(B, positions + 1, shape.conv_size, model.device)
    buf.fill(pack_trees([(list(range(positions + 1)), list(range(-1, positions)))] * B, positions + 1,
                        shape.conv_size))
    ms = timer.ms(lambda: model.graphed(("draft", B), lambda: model.draft(buf, positions)))
    model.release_buffers()
    return ms


def free_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 1 << 62
    free, _ = torch.cuda.mem_get_info(device)
    return free


def single(args, device, dtype, timer) -> dict:
    shape = get_shape("qwen3.8-27b-like", args.smoke)
    rows_list = [int(r) for r in args.rows.split(",")]
    context, max_len = args.context, args.context + max(rows_list) + 8
    out = {"shape": shape.to_dict(), "context": context, "requests": 1,
           "weight_floor_ms": round(shape.weight_floor_ms(READ_BW), 4), "steps_ms": {}, "errors": {}}
    check_fits(memory_needed(shape, SINGLE_OPTIONS["all"], 1, max_len), free_bytes(device), "single")
    t0 = time.perf_counter()
    weights = Weights.synthetic(shape, device, dtype)
    caches = Caches(shape, 1, max_len, device, dtype)
    caches.randomize(context)
    out["weights_s"] = round(time.perf_counter() - t0, 2)
    stock = SystemModel(weights, SINGLE_OPTIONS["stock"])
    out["T_AR_ms"] = time_model(stock, caches, 1, 1, context, timer, ar=True)
    out["T_draft_ms"] = time_draft(stock, 1, timer)
    progress(f"single: T_AR {out['T_AR_ms']} ms, draft {out['T_draft_ms']} ms")
    for name, options in SINGLE_OPTIONS.items():
        model = stock.with_options(options)
        times = {}
        for rows in rows_list:
            if options.tree != "chain" and rows < 2:
                continue
            try:
                times[str(rows)] = time_model(model, caches, 1, rows, context, timer)
            except Exception as exc:  # noqa: BLE001 - one failing setting keeps the others' figures
                out["errors"][f"{name}/{rows}"] = f"{type(exc).__name__}: {exc}"[:400]
        out["steps_ms"][name] = times
        if model.graph_error:
            out["errors"][f"{name}/graph"] = model.graph_error
        progress(f"single {name}: {times}")
    base = out["steps_ms"]["stock"]
    out["stock_verify_1_row_frac_of_floor"] = round(out["weight_floor_ms"] / base["1"], 4) if "1" in base else None
    if "1" in base and "32" in base:
        out["stock_32_over_1"] = round(base["32"] / base["1"], 4)
    for name in ("w12_linears_head", "all"):
        mine = out["steps_ms"][name]
        out[f"{name}_speedup_vs_stock"] = {r: round(base[r] / mine[r], 4) for r in mine if r in base}
    del weights, caches, stock
    release()
    return out


def batched(args, device, dtype, timer) -> dict:
    out = {}
    for shape_name in ("qwen3.5-4b-like", "llama-3.1-8b-like"):
        shape = get_shape(shape_name, args.smoke)
        batches = [int(b) for b in args.batches.split(",")]
        rows = SystemOptions().rows
        max_len = args.context + rows + 8
        row = {"shape": shape.to_dict(), "context": args.context, "rows_per_request": rows, "by_batch": {},
               "errors": {}}
        check_fits(memory_needed(shape, BATCHED_OPTIONS["specpilot"], max(batches), max_len), free_bytes(device),
                   shape_name)
        weights = Weights.synthetic(shape, device, dtype)
        caches = Caches(shape, max(batches), max_len, device, dtype)
        caches.randomize(args.context)
        stock = SystemModel(weights, BATCHED_OPTIONS["stock"])
        for B in batches:
            entry = {"T_AR_ms": time_model(stock, caches, B, 1, args.context, timer, ar=True),
                     "T_draft_ms": time_draft(stock, B, timer)}
            for name, options in BATCHED_OPTIONS.items():
                try:
                    entry[f"T_verify_{name}_ms"] = time_model(stock.with_options(options), caches, B, rows,
                                                              args.context, timer)
                except Exception as exc:  # noqa: BLE001
                    row["errors"][f"{name}/{B}"] = f"{type(exc).__name__}: {exc}"[:400]
            row["by_batch"][str(B)] = entry
            progress(f"batched {shape_name} B={B}: {entry}")
        out[shape_name] = row
        del weights, caches, stock
        release()
    return out


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes with the same structure (CPU dry run)")
    ap.add_argument("--sections", default="single,batched", help="comma-separated: check,single,batched,profile,speedup")
    ap.add_argument("--rows", default="1,4,8,17,32,33,64")
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.smoke:
        args.context = min(args.context, 24)
        args.rows = "1,5"
        args.batches = "2"
        args.iters = 1
    dtype = torch.bfloat16
    timer = Timer(device, args.iters, bursts=1 if args.smoke else 5)
    result = {**result_header("system_bench"), "label": LABEL, "device_name": torch.cuda.get_device_name(device)
              if device.type == "cuda" else "cpu", "smoke": args.smoke, "dtype": "bfloat16",
              "acceptance": "pinned to each tree's deepest root path (the largest commit)"}
    sections = {"single": lambda: single(args, device, dtype, timer),
                "batched": lambda: batched(args, device, dtype, timer)}
    for name in args.sections.split(","):
        if name not in sections:
            result[name] = {"error": f"unknown section {name!r}; use {', '.join(sections)}"}
            continue
        t0 = time.perf_counter()
        try:
            result[name] = sections[name]()
        except Exception as exc:  # noqa: BLE001 - a failing section keeps the others' figures
            result[name] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
        result[name + "_s"] = round(time.perf_counter() - t0, 1)
        progress(f"{name}: {result[name + '_s']} s")
        if args.out:
            write_result(result, args.out)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
