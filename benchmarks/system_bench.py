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

from specpilot_kernels.batched_ops import verify_attention  # noqa: E402
from specpilot_kernels.fused_ops import select_states  # noqa: E402
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
    "all_w12_head": SystemOptions(linears="w12", lm_head="w12", gdn_verify="path", tree="best-first", nodes=32),
}
# Batched: stock verifies its drafter's 16-chain every step; SpecPilot verifies best-first trees of a node budget
# the planner chooses per batch size from the measured steps (AR among the choices), with only the mechanisms
# that pay at batch rows: cuBLAS BF16 linears and head (W12 at 136-544 rows is slower than cuBLAS), GDN path
# verify (no per-node state snapshots). The rows per request each option set is timed at:
BATCHED_OPTIONS = {
    "stock": SystemOptions(),
    "specpilot": SystemOptions(gdn_verify="path", tree="best-first", nodes=16),
}
BATCHED_ROWS = {"stock": (2, 3, 5, 9, 17), "specpilot": (2, 3, 5, 9, 17)}


def random_tree(n: int, seed: int, chain_bias: float = 0.6) -> list[int]:
    """Parents of an n-node tree below the root (-1: the root): node i under i-1 with probability chain_bias."""
    gen = torch.Generator().manual_seed(seed)
    parents = [-1]
    for i in range(1, n):
        parents.append(
            i - 1 if torch.rand((), generator=gen) < chain_bias else int(torch.randint(0, i, (), generator=gen))
        )
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
        if reset:
            reset()
        fn()  # untimed: the first call builds kernels and captures the graph
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


def time_model(
    model: SystemModel, caches: Caches, B: int, rows: int, context: int, timer: Timer, ar: bool = False
) -> float:
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


def time_draft(model: SystemModel, B: int, timer: Timer, positions: int = 16, top_k: int = 8) -> float:
    """ms of the drafter's pass over B blocks of ``positions`` masked positions; ``top_k`` candidates a position
    (1 for a chain: its argmax; trees take 8)."""
    shape = model.shape
    buf = StepBuffers.empty(B, positions + 1, shape.conv_size, model.device)
    buf.fill(pack_trees([(list(range(positions + 1)), list(range(-1, positions)))] * B, positions + 1, shape.conv_size))
    ms = timer.ms(lambda: model.graphed(("draft", B, positions), lambda: model.draft(buf, positions, top_k)))
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
    out = {
        "shape": shape.to_dict(),
        "context": context,
        "requests": 1,
        "weight_floor_ms": round(shape.weight_floor_ms(READ_BW), 4),
        "steps_ms": {},
        "errors": {},
    }
    check_fits(memory_needed(shape, SINGLE_OPTIONS["all"], 1, max_len), free_bytes(device), "single")
    t0 = time.perf_counter()
    weights = Weights.synthetic(shape, device, dtype)
    caches = Caches(shape, 1, max_len, device, dtype)
    caches.randomize(context)
    out["weights_s"] = round(time.perf_counter() - t0, 2)
    stock = SystemModel(weights, SINGLE_OPTIONS["stock"])
    out["T_AR_ms"] = time_model(stock, caches, 1, 1, context, timer, ar=True)
    out["T_draft_ms"] = time_draft(stock, 1, timer, top_k=1)  # the chain's drafter pass (argmax a position)
    out["T_draft_tree_ms"] = time_draft(stock, 1, timer)  # a tree's (top-8 a position)
    progress(f"single: T_AR {out['T_AR_ms']} ms, draft {out['T_draft_ms']} ms (trees {out['T_draft_tree_ms']} ms)")
    names = args.single_options.split(",") if args.single_options else list(SINGLE_OPTIONS)
    unknown = [n for n in names if n not in SINGLE_OPTIONS]
    if unknown or "stock" not in names:
        raise ValueError(f"--single-options {args.single_options!r}: needs stock, from {', '.join(SINGLE_OPTIONS)}")
    for name in names:
        options = SINGLE_OPTIONS[name]
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
    for name in ("w12_linears_head", "gdn_path", "all", "all_w12_head"):
        if name not in out["steps_ms"]:
            continue
        mine = out["steps_ms"][name]
        out[f"{name}_speedup_vs_stock"] = {r: round(base[r] / mine[r], 4) for r in mine if r in base}
    out["targets"] = single_targets(out)
    del weights, caches, stock
    release()
    return out


def single_targets(out: dict) -> dict:
    """Issue 28's single-request numbers against this run: stock at 1 row >= 80% of its weight floor, 32 rows <= 1.15x
    the 1-row step, W12 linears + head >= 1.25x stock at every measured row count from 1 to 33."""
    targets = {}
    if out.get("stock_verify_1_row_frac_of_floor") is not None:
        targets["stock_1_row_at_80pct_of_floor"] = out["stock_verify_1_row_frac_of_floor"] >= 0.8
    if "stock_32_over_1" in out:
        targets["stock_32_over_1_at_most_1.15"] = out["stock_32_over_1"] <= 1.15
    w12 = {int(r): x for r, x in out.get("w12_linears_head_speedup_vs_stock", {}).items() if 1 <= int(r) <= 33}
    if w12:
        targets["w12_linears_head_at_least_1.25_at_1_to_33"] = min(w12.values()) >= 1.25
        targets["w12_linears_head_min_1_to_33"] = min(w12.values())
    return targets


def single_headline(single: dict) -> str | None:
    """Stock's 1-row step (share of the floor), its 32 / 1 ratio and W12 linears + head over stock at 1-33 rows."""
    base = single.get("steps_ms", {}).get("stock", {}) if isinstance(single, dict) else {}
    if "1" not in base:
        return None
    text = f"27B-like, 1 request: stock {base['1']:.2f} ms at 1 row ({single['stock_verify_1_row_frac_of_floor']:.0%} of floor)"
    if "stock_32_over_1" in single:
        text += f", 32 rows {single['stock_32_over_1']:.2f}x"
    w12 = single.get("w12_linears_head_speedup_vs_stock", {})
    if w12:
        text += (
            "; W12 linears + head " + " / ".join(f"{w12[r]:.2f}" for r in w12) + f"x stock at {' / '.join(w12)} rows"
        )
    return text


def batched(args, device, dtype, timer) -> dict:
    """T_AR, the draft pass and each option set's verify step at ``BATCHED_ROWS`` rows per request, per batch size
    (stock's own setting is its 16-chain, 17 rows; the other rows are what a planner chooses from)."""
    out = {}
    for shape_name in args.batched_shapes.split(","):
        shape = get_shape(shape_name, args.smoke)
        batches = [int(b) for b in args.batches.split(",")]
        widest = max(max(r) for r in BATCHED_ROWS.values())
        max_len = args.context + widest + 8
        row = {
            "shape": shape.to_dict(),
            "context": args.context,
            "rows_per_request": SystemOptions().rows,
            "options": {name: options.label() for name, options in BATCHED_OPTIONS.items()},
            "by_batch": {},
            "errors": {},
        }
        check_fits(
            memory_needed(shape, BATCHED_OPTIONS["stock"].replace(positions=widest - 1), max(batches), max_len),
            free_bytes(device),
            shape_name,
        )
        weights = Weights.synthetic(shape, device, dtype)
        caches = Caches(shape, max(batches), max_len, device, dtype)
        caches.randomize(args.context)
        stock = SystemModel(weights, BATCHED_OPTIONS["stock"])
        for B in batches:
            entry = {
                "T_AR_ms": time_model(stock, caches, B, 1, args.context, timer, ar=True),
                "T_draft_ms": time_draft(stock, B, timer, top_k=1),  # stock's chain: each position's argmax
                "T_draft_tree_ms": time_draft(stock, B, timer),  # SpecPilot's trees: top-8 a position
            }
            # stock run with a smaller block (--speculative-num-draft-tokens): the drafter's pass over that block
            entry["T_draft_by_block_ms"] = {
                str(rows - 1): entry["T_draft_ms"] if rows - 1 == 16 else time_draft(stock, B, timer, rows - 1, 1)
                for rows in BATCHED_ROWS["stock"]
            }
            # SpecPilot's drafter over the block its trees reach (a best-first tree of N nodes is at most N deep)
            entry["T_draft_tree_by_block_ms"] = {
                str(rows - 1): entry["T_draft_tree_ms"] if rows - 1 == 16 else time_draft(stock, B, timer, rows - 1)
                for rows in BATCHED_ROWS["specpilot"]
            }
            for name, options in BATCHED_OPTIONS.items():
                model = stock.with_options(options)
                steps = {}
                for rows in BATCHED_ROWS[name]:
                    try:
                        steps[str(rows)] = time_model(model, caches, B, rows, args.context, timer)
                    except Exception as exc:  # noqa: BLE001
                        row["errors"][f"{name}/{B}/{rows}"] = f"{type(exc).__name__}: {exc}"[:400]
                entry[f"T_verify_{name}_ms"] = steps
                if model.graph_error:
                    row["errors"][f"{name}/{B}/graph"] = model.graph_error
            row["by_batch"][str(B)] = entry
            progress(f"batched {shape_name} B={B}: {entry}")
        out[shape_name] = row
        del weights, caches, stock
        release()
    return out


def batched_speedup(run: dict, lattice, block_lattices: dict | None = None) -> dict:
    """Per batch size: stock as configured by default (its drafter's 16-chain every step), stock tuned (the best
    static block for that batch size, as an SGLang user sets ``--speculative-num-draft-tokens``: the drafter's pass
    over that block, tau from lattices the pair's drafter recorded at that block — ``block_lattices`` {block:
    lattice}) and SpecPilot (best-first trees, the planner's rows per request from the measured steps and replayed
    tau, AR included: ``batching.planner.BudgetPlanner``); speedup over AR and gain over both stocks. tau: the
    trained pair's exact replay of per-request trees (a shared budget brings more: the batched bench's closed loop
    measures that)."""
    import numpy as np

    from specpilot_mem.batching.planner import BudgetPlanner

    table = {}
    for B, entry in run["by_batch"].items():
        t_ar = entry["T_AR_ms"]
        row = {"T_AR_ms": t_ar}
        for name, options in BATCHED_OPTIONS.items():
            steps = entry.get(f"T_verify_{name}_ms", {})
            if not isinstance(steps, dict) or not steps:
                continue
            builder = "chain" if options.tree == "chain" else "best-first"
            t_draft = entry["T_draft_ms"] if builder == "chain" else entry.get("T_draft_tree_ms", entry["T_draft_ms"])
            # SpecPilot's trees: the drafter's pass over the smallest block that reaches a bucket's nodes (the
            # planner's drafter blocks), tau from the lattices the pair's drafter recorded at that block
            drafts = {16: t_draft}
            if builder != "chain" and entry.get("T_draft_tree_by_block_ms"):
                drafts = {int(k): v for k, v in entry["T_draft_tree_by_block_ms"].items()}
            lattices = {**(block_lattices or {}), 16: lattice}
            costs = _MeasuredSteps(t_ar, drafts, {int(r): t for r, t in steps.items()}, int(B))
            planner = BudgetPlanner(costs, tuple(int(r) for r in steps), blocks=tuple(drafts))
            by_rows = {}
            for r, t_verify in steps.items():
                block = planner.draft_block(int(r)) if builder != "chain" else 16
                tau = replay_tau(lattices.get(block, lattice), builder, int(r) - 1)
                c = (drafts[block] + t_verify) / t_ar
                by_rows[r] = {"tau": tau, "c": round(c, 4), "S": round(tau / c, 4)}
                if builder != "chain":
                    by_rows[r]["drafter_block"] = block
            mine = {"by_rows": by_rows}
            fixed = str(options.rows)
            if name == "stock" and fixed in by_rows:  # stock as it runs by default: its drafter's chain, every step
                mine["rows"], mine["speedup_over_ar"] = int(fixed), by_rows[fixed]["S"]
                tuned = stock_tuned(entry, steps, block_lattices or {16: lattice})
                if tuned:
                    row["stock_tuned"] = tuned
            elif name != "stock":
                tau = np.array([by_rows[str(r)]["tau"] for r in planner.buckets])
                rows = planner.rows_for(int(B), tau)
                mine["rows"] = rows
                mine["speedup_over_ar"] = 1.0 if rows == 1 else by_rows[str(rows)]["S"]
                mine["plan"] = "AR" if rows == 1 else f"{rows - 1} nodes per request"
            row[name] = mine
        mine = row.get("specpilot", {}).get("speedup_over_ar")
        if mine and "speedup_over_ar" in row.get("stock", {}):
            row["gain_over_stock"] = round(mine / row["stock"]["speedup_over_ar"], 4)
        if mine and "speedup_over_ar" in row.get("stock_tuned", {}):
            row["gain_over_stock_tuned"] = round(mine / row["stock_tuned"]["speedup_over_ar"], 4)
        table[B] = row
    stock_static(table)
    return table


def stock_static(table: dict) -> None:
    """Stock as one SGLang launch serves every batch size: a single ``--speculative-dflash-block-size`` for the
    whole range measured, the block whose worst speedup over AR across the batch sizes is the largest (what an
    operator who must never fall below AR sets). Adds ``stock_static`` (and the gain over it) to each row."""
    by_block: dict[str, dict[str, float]] = {}
    for B, row in table.items():
        for k, e in row.get("stock_tuned", {}).get("by_block", {}).items():
            by_block.setdefault(k, {})[B] = e["S"]
    complete = {k: v for k, v in by_block.items() if len(v) == len(table)}
    if not complete:
        return
    best = max(complete, key=lambda k: min(complete[k].values()))
    for B, row in table.items():
        row["stock_static"] = {
            "label": f"stock with one static block for {min(map(int, table))}-{max(map(int, table))} requests "
            "(--speculative-dflash-block-size, chosen for the best worst case over them)",
            "block": int(best),
            "rows": int(best) + 1,
            "speedup_over_ar": complete[best][B],
            "worst_over_batches": min(complete[best].values()),
        }
        mine = row.get("specpilot", {}).get("speedup_over_ar")
        if mine:
            row["gain_over_stock_static"] = round(mine / complete[best][B], 4)


def stock_tuned(entry: dict, steps: dict, block_lattices: dict) -> dict | None:
    """Stock's best static block at one batch size: for each block k whose drafter pass was timed and whose lattices
    were recorded at that block, c = (T_draft(k) + T_verify(k + 1 rows)) / T_AR and tau from the chain replay; the
    block with the largest tau / c. It is still stock (SGLang's DFlash chain, snapshots, cuBLAS), only configured."""
    drafts = entry.get("T_draft_by_block_ms", {})
    by_block = {}
    for r, t_verify in steps.items():
        k = int(r) - 1
        if str(k) not in drafts or k not in block_lattices:
            continue
        tau = replay_tau(block_lattices[k], "chain", k)
        c = (drafts[str(k)] + t_verify) / entry["T_AR_ms"]
        by_block[str(k)] = {"rows": int(r), "tau": tau, "c": round(c, 4), "S": round(tau / c, 4)}
    if not by_block:
        return None
    best = max(by_block, key=lambda k: by_block[k]["S"])
    return {
        "label": "stock with its best static block for this batch size (--speculative-num-draft-tokens)",
        "block": int(best),
        "rows": by_block[best]["rows"],
        "speedup_over_ar": by_block[best]["S"],
        "by_block": by_block,
    }


class _MeasuredSteps:
    """One batch size's measured step times as the planner's step costs (``BudgetPlanner``'s interface); drafts:
    {drafter block: ms of its pass over the batch}."""

    def __init__(self, t_ar: float, drafts: dict[int, float], verify: dict[int, float], requests: int):
        self.t_ar, self.drafts, self.verify, self.requests = t_ar, drafts, verify, requests

    def ar_ms(self, requests: int) -> float:
        return self.t_ar

    def draft_ms(self, rows: int, requests: int) -> float:
        return self.drafts[rows // requests - 1]

    def verify_ms(self, rows: int, requests: int) -> float:
        return self.verify[rows // requests]


CHECK_OPTIONS = {
    "stock": SystemOptions(positions=8),
    "w12_linears_head": SystemOptions(positions=8, linears="w12", lm_head="w12"),
    "certified_head": SystemOptions(positions=8, lm_head="certified"),
    "gdn_path": SystemOptions(positions=8, gdn_verify="path"),
    "best_first": SystemOptions(positions=8, tree="best-first", nodes=16),
    "all": SystemOptions(
        positions=8, linears="w12", lm_head="certified", gdn_verify="path", tree="best-first", nodes=16
    ),
}


def check(args, device) -> dict:
    """The trained pair through the system: every option set's greedy tokens against the existing engine's AR
    decode of the same prompts (batched, closed loop), per dtype."""
    import json as _json

    from specpilot_mem.engine.decode import SystemDecoder
    from specpilot_mem.engine.engine import Engine
    from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR, has_trained_pair

    if not has_trained_pair():
        return {"error": "no trained pair under models/"}
    prompts = [
        p[: args.check_prompt_len]
        for p in _json.loads((DEFAULT_MODEL_DIR / "greedy-reference.json").read_text())["prompts"][: args.check_prompts]
    ]
    out = {"prompts": len(prompts), "new_tokens": args.check_tokens, "batch": args.check_batch, "by_dtype": {}}
    dtypes = ("float32",) if device.type == "cpu" else ("bfloat16", "float32")
    names = args.check_options.split(",") if args.check_options else list(CHECK_OPTIONS)
    for dtype_name in dtypes:
        engine = Engine.load_default(device=device, dtype=getattr(torch, dtype_name), max_len=512)
        want = [g.output_ids for g in engine.generate(prompts, "ar", max_new_tokens=args.check_tokens)]
        base = SystemDecoder(engine, SystemOptions(positions=8), batch=args.check_batch, max_len=512)
        row = {}
        ar = base.generate(prompts, "ar", args.check_tokens)
        row["system_ar"] = agreement([g.output_ids for g in ar], want)
        for name in names:
            try:
                runs = base.with_options(CHECK_OPTIONS[name]).generate(prompts, "spec", args.check_tokens)
                row[name] = {
                    **agreement([g.output_ids for g in runs], want),
                    "tau": round(sum(sum(g.accepted) for g in runs) / max(1, sum(g.steps for g in runs)), 3),
                }
            except Exception as exc:  # noqa: BLE001 - one failing option set keeps the others' figures
                row[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            progress(f"check {dtype_name} {name}: {row[name]}")
        out["by_dtype"][dtype_name] = row
    return out


FORCING_SYSTEMS = {
    "stock": SystemOptions(positions=8),
    "w12_linears_head": SystemOptions(positions=8, linears="w12", lm_head="w12"),
    "certified_head": SystemOptions(positions=8, lm_head="certified"),
    "gdn_path": SystemOptions(positions=8, gdn_verify="path"),
    "best_first": SystemOptions(positions=8, tree="best-first", nodes=16),
    "all": SystemOptions(
        positions=8, linears="w12", lm_head="certified", gdn_verify="path", tree="best-first", nodes=16
    ),
    "fault": SystemOptions(positions=8, fault_after=32),  # the paper's §6.2 fault: token forcing must reject it
}
PROMPTS = Path(__file__).resolve().parent / "data" / "system_prompts.json"


def forcing(args, device) -> dict:
    """Outputs for token forcing (judged on the CPU by ``benchmarks/system_forcing.py``: the GPU machine has no
    pydantic): the trained pair in bf16 through the system, AR and every system of FORCING_SYSTEMS, on
    ``--forcing-seeds`` prompt sets of 16 prompts of the unseen split (closed loop, ``--check-batch`` in flight)."""
    from specpilot_mem.engine.decode import SystemDecoder
    from specpilot_mem.engine.engine import Engine

    import json as _json

    all_prompts = _json.loads(PROMPTS.read_text())["prompts"]
    seeds = range(args.forcing_seeds)
    requests = {
        f"s{seed}-{i}": all_prompts[(seed * 16 + i) % len(all_prompts)][: args.check_prompt_len - 8 * seed]
        for seed in seeds
        for i in range(args.forcing_per_seed)
    }
    ids, prompts = list(requests), list(requests.values())
    engine = Engine.load_default(
        device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32, max_len=512
    )
    base = SystemDecoder(engine, SystemOptions(positions=8), batch=args.check_batch, max_len=512)
    outputs = {"ar": base.generate(prompts, "ar", args.forcing_tokens)}
    for name, options in FORCING_SYSTEMS.items():
        outputs[name] = base.with_options(options).generate(prompts, "spec", args.forcing_tokens)
        progress(f"forcing outputs: {name}")
    doc = {
        "dtype": str(base.dtype).removeprefix("torch."),
        "new_tokens": args.forcing_tokens,
        "requests": [{"id": rid, "prompt_ids": p} for rid, p in zip(ids, prompts)],
        "systems": {name: {rid: g.output_ids for rid, g in zip(ids, runs)} for name, runs in outputs.items()},
        "tau": {
            name: round(sum(sum(g.accepted) for g in runs) / max(1, sum(g.steps for g in runs)), 3)
            for name, runs in outputs.items()
        },
        "options": {name: o.label() for name, o in FORCING_SYSTEMS.items()},
    }
    path = (args.out.parent if args.out else Path(".")) / f"system-forcing-outputs{'-smoke' if args.smoke else ''}.json"
    write_result({**result_header("system_bench forcing outputs"), **doc}, path)
    same = {
        name: sum(a == b for a, b in zip(doc["systems"][name].values(), doc["systems"]["ar"].values()))
        for name in doc["systems"]
    }
    return {"path": str(path), "requests": len(ids), "identical_to_ar": same, "tau": doc["tau"]}


def agreement(got: list[list[int]], want: list[list[int]]) -> dict:
    same = sum(a == b for a, b in zip(got, want))
    tokens = sum(len(w) for w in want)
    equal_tokens = sum(x == y for g, w in zip(got, want) for x, y in zip(g, w))
    return {"identical_requests": same, "requests": len(want), "token_agreement": round(equal_tokens / tokens, 4)}


_LATTICE: dict = {}


def pair_lattice(args, device, block: int | None = None):
    """Lattices recorded from the trained pair (teacher-forced at every position of each greedy output, 16
    drafted positions), saved beside the result so ``specpilot-mem ceiling`` can read them. ``block``: the
    lattices of the drafter run with that many masked positions (its pass over a smaller block, on the same
    greedy outputs), ``block`` positions each."""
    cache = _LATTICE
    if block is not None and block != 16:
        if block not in cache:
            from specpilot_mem.replay.lattice import LatticeRecorder

            pair_lattice(args, device)
            path = cache["path"].with_name(f"system-pair-lattices-block{block}.npz")
            recorder = LatticeRecorder(
                path,
                kind="selector",
                positions=block,
                meta={"target": "trained pair (models/)", "drafter": f"trained pair (models/), block {block}"},
            )
            cache["engine"].record_lattices(
                recorder,
                cache["prompts"],
                positions=block,
                block=block,
                labels=["greedy-reference"] * len(cache["prompts"]),
                greedy=cache["greedy"],
            )
            cache[block] = recorder.close()
        return cache[block], None
    if "lattice" not in cache:
        import json as _json

        from specpilot_mem.engine.engine import Engine
        from specpilot_mem.engine.weights import DEFAULT_MODEL_DIR
        from specpilot_mem.replay.lattice import LatticeRecorder

        prompts = [
            p[: args.check_prompt_len]
            for p in _json.loads((DEFAULT_MODEL_DIR / "greedy-reference.json").read_text())["prompts"][
                : args.tau_prompts
            ]
        ]
        engine = Engine.load_default(device=device, dtype=torch.float32, max_len=512)
        path = (args.out.parent if args.out else Path(".")) / "system-pair-lattices.npz"
        recorder = LatticeRecorder(
            path,
            kind="selector",
            positions=16,
            meta={"target": "trained pair (models/)", "drafter": "trained pair (models/)"},
        )
        cache["greedy"] = engine.record_lattices(
            recorder, prompts, positions=16, max_new_tokens=args.tau_tokens, labels=["greedy-reference"] * len(prompts)
        )
        cache["lattice"], cache["path"], cache["engine"], cache["prompts"] = recorder.close(), path, engine, prompts
    return cache["lattice"], cache["path"]


def replay_tau(lattice, builder: str, nodes: int, batch: int = 1) -> float:
    from specpilot_mem.replay.replay import replay

    steps, tokens = replay(lattice, builder, nodes, depth_cap=16 if builder != "chain" else None, batch=batch)
    return round(float(tokens.sum()) / float(steps.sum()), 4)


def speedup(args, device, result) -> dict:
    """S(N) = tau(N) / c(N), c(N) = T_step(N) / T_AR with T_step(N) = draft + verify step of N + 1 rows; speedup over AR
    and gain over stock per setting. tau(N): exact replay on the trained pair's lattices (chain for chain settings,
    best-first otherwise; batched settings: best-first with the node budget shared by the batch)."""
    lattice, path = pair_lattice(args, device)
    out = {"label": LABEL, "lattices": str(path), "single": {}, "batched": {}}
    single_run = result.get("single", {})
    if "steps_ms" in single_run:
        t_ar = single_run["T_AR_ms"]
        for name, times in single_run["steps_ms"].items():
            tree = SINGLE_OPTIONS[name].tree != "chain"
            t_draft = single_run.get("T_draft_tree_ms", single_run["T_draft_ms"]) if tree else single_run["T_draft_ms"]
            rows = {}
            for r, t_verify in times.items():
                nodes = int(r) - 1
                if nodes < 1 or (not tree and nodes > 16):
                    continue
                tau = replay_tau(lattice, "best-first" if tree else "chain", nodes)
                c = (t_draft + t_verify) / t_ar
                rows[nodes] = {"tau": tau, "c": round(c, 4), "S": round(tau / c, 4)}
            best = max(rows, key=lambda n: rows[n]["S"], default=None)
            out["single"][name] = {
                "by_nodes": rows,
                "best_nodes": best,
                "speedup_over_ar": rows[best]["S"] if best else None,
            }
        stock_best = out["single"].get("stock", {}).get("speedup_over_ar")
        for entry in out["single"].values():
            if stock_best and entry["speedup_over_ar"]:
                entry["gain_over_stock"] = round(entry["speedup_over_ar"] / stock_best, 4)
    runs = {name: run for name, run in result.get("batched", {}).items() if isinstance(run, dict) and "by_batch" in run}
    if runs:  # stock's smaller blocks: the pair's drafter recorded at each of them
        blocks = sorted({int(r) - 1 for r in BATCHED_ROWS["stock"]})
        block_lattices = {k: lattice if k == 16 else pair_lattice(args, device, k)[0] for k in blocks}
        for shape_name, run in runs.items():
            out["batched"][shape_name] = batched_speedup(run, lattice, block_lattices)
    return out


def kernel_classes(model: SystemModel, caches: Caches, B: int, rows: int, context: int, timer: Timer) -> dict:
    """Each kernel class of one verify step timed alone at the step's shapes (CUDA-graph replay), with the bytes
    it must move and its FLOPs: target GEMMs, LM head, GDN verify + commit, attention; rest = step - classes."""
    s, dev, dt = model.shape, model.device, model.dtype
    M = B * rows
    gen = torch.Generator(device=dev).manual_seed(5)
    opts = model.options
    w_bytes = 1.5 if opts.linears == "w12" else 2.0
    inputs = {}
    for name, (_, n_in) in s.linear_shapes().items():
        inputs[name] = torch.randn(M, n_in, generator=gen, device=dev).to(dt)

    def gemms():
        for i, kind in enumerate(s.layer_types):
            for name in s.layer_linears(kind):
                model.w.lin(f"layers.{i}.{name}.w")(inputs[name], model.mode)

    hidden = torch.randn(M, s.d_model, generator=gen, device=dev).to(dt)
    out = {}
    params = s.params()["target_linears"]
    out["target_gemm"] = {
        "time_ms": timer.ms(lambda: model.graphed("gemm", gemms)),
        "bytes": params * w_bytes,
        "flops": 2.0 * M * params,
        "dtype": "bf16",
    }
    head_bytes = {"bf16": 2.0, "w12": 1.5, "certified": 1.0}[opts.lm_head] * s.vocab_size * s.d_model
    out["lm_head"] = {
        "time_ms": timer.ms(lambda: model.graphed("head", lambda: model.head_argmax(hidden))),
        "bytes": head_bytes,
        "flops": 2.0 * M * s.vocab_size * s.d_model,
        "dtype": "int8" if opts.lm_head == "certified" else "bf16",
    }
    if s.gdn_layers:
        H, HV, D = s.gdn_key_heads, s.gdn_value_heads, s.gdn_head_dim
        q, k = (torch.randn(B, rows, H, D, generator=gen, device=dev).to(dt) for _ in range(2))
        v = torch.randn(B, rows, HV, D, generator=gen, device=dev).to(dt)
        a, b = (torch.randn(B, rows, HV, generator=gen, device=dev).to(dt) for _ in range(2))
        buf = StepBuffers.empty(B, rows, s.conv_size, dev)
        trees, deepest = step_trees(B, rows, opts.tree != "chain", s.vocab_size)
        buf.fill(pack_trees(trees, rows, s.conv_size))
        buf.forced.copy_(torch.tensor(deepest))
        accepted, accept_len, deepest_t, _ = model.accept(buf, torch.zeros(B, rows, dtype=torch.long, device=dev))
        gdn_ids = [i for i, kind in enumerate(s.layer_types) if kind == "gdn"]
        t = model.w.t

        def gdn():
            if opts.gdn_verify == "path":
                from specpilot_kernels.gdn_tree import tree_schedule

                schedule = (tree_schedule(buf.parents, buf.num_nodes), buf.parents, buf.num_nodes)
                path, length = model._commit_indices(accepted, accept_len)  # once a step, as the step's commit
            for i in gdn_ids:
                A_log, dt_bias, pool = t[f"layers.{i}.A_log"], t[f"layers.{i}.dt_bias"], caches.state[i][:B]
                if opts.gdn_verify == "snapshot":
                    inter = model._snapshots(i, B, rows)
                    model._sglang(q, k, v, a, b, A_log, dt_bias, pool, buf.slots32, inter, buf.parents)
                else:
                    model._path_verify(q, k, v, a, b, A_log, dt_bias, pool, buf.slots32, schedule)
                    model._commit_path(i, q, k, v, a, b, pool, buf.slots32, path, length)
            if opts.gdn_verify == "snapshot":  # the step's commit: every layer's accepted snapshot in one launch
                select_states(caches.state_all[:, :B], model._inter[B, rows], deepest_t, accept_len > 0)

        state = HV * D * D * 4
        per_layer = B * state * (2 + (rows + 1 if opts.gdn_verify == "snapshot" else 0))
        out["gdn_verify_commit"] = {
            "time_ms": timer.ms(lambda: model.graphed("gdn", gdn)),
            "bytes": float(per_layer * s.gdn_layers),
            "flops": float(4.0 * M * HV * D * D * s.gdn_layers * 2),
            "dtype": "bf16",
            "peak_tflops": 60.0,
        }
    if s.attn_layers:
        hq, hkv, D, L = s.attn_heads, s.attn_kv_heads, s.attn_head_dim, caches.max_len
        q = torch.randn(B, rows, hq, D, generator=gen, device=dev).to(dt)
        k_rows, v_rows = (torch.randn(B, rows, hkv, D, generator=gen, device=dev).to(dt) for _ in range(2))
        gate = torch.randn(B, rows, hq * D, generator=gen, device=dev).to(dt) if s.attn_output_gate else None
        lengths = torch.full((B,), context, dtype=torch.long, device=dev)
        anc = torch.ones(rows, rows, dtype=torch.bool, device=dev).tril().expand(B, rows, rows).contiguous()
        attn_ids = [i for i, kind in enumerate(s.layer_types) if kind == "attn"]

        def attention():  # the step's tree attention (split over the keys + combine with the gate)
            for i in attn_ids:
                verify_attention(q, caches.k[i][:B], caches.v[i][:B], k_rows, v_rows, lengths, anc, gate)

        out["attention"] = {
            "time_ms": timer.ms(lambda: model.graphed("attn", attention)),
            "bytes": float(s.attn_layers * B * L * hkv * D * 2 * 2),
            "flops": float(4.0 * s.attn_layers * B * hq * rows * L * D),
            "dtype": "bf16",
        }
    model.release_buffers()
    return out


def profile(args, device, dtype, timer, result) -> dict:
    """Profiles (docs/profile-format.md) of the 27B-like single-request step, stock and all mechanisms."""
    import datetime as _dt

    shape = get_shape("qwen3.8-27b-like", args.smoke)
    context = args.context
    max_len = context + 64 + 8
    weights = Weights.synthetic(shape, device, dtype)
    caches = Caches(shape, 1, max_len, device, dtype)
    caches.randomize(context)
    stock = SystemModel(weights, SINGLE_OPTIONS["stock"])
    t_ar = time_model(stock, caches, 1, 1, context, timer, ar=True)
    drafts = {"chain": time_draft(stock, 1, timer, top_k=1), "tree": time_draft(stock, 1, timer)}
    lattice, lattice_path = pair_lattice(args, device)
    folder = args.profile_dir or (args.out.parent if args.out else Path("."))
    out = {"lattices": str(lattice_path)}
    for name, options in (("stock", SINGLE_OPTIONS["stock"].replace(positions=16)), ("all", SINGLE_OPTIONS["all"])):
        t_draft = drafts["chain" if options.tree == "chain" else "tree"]
        model = stock.with_options(options)
        rows = options.rows
        t_verify = time_model(model, caches, 1, rows, context, timer)
        kernels = kernel_classes(model, caches, 1, rows, context, timer)
        measured = sum(k["time_ms"] for k in kernels.values())
        kernels["rest"] = {
            "time_ms": round(max(t_verify - measured, 0.0), 4),
            "bytes": 0.0,
            "flops": 0.0,
            "dtype": "bf16",
        }
        kernels["drafter"] = {
            "time_ms": t_draft,
            "bytes": float(2 * shape.params()["drafter_linears"] + 2 * shape.vocab_size * shape.d_model),
            "flops": float(2 * 17 * shape.params()["drafter_linears"]),
            "dtype": "bf16",
        }
        builder = "chain" if options.tree == "chain" else "best-first"
        doc = {
            "format": "specpilot-profile",
            "version": 1,
            "gpu": "H200" if device.type == "cuda" else "H100 SXM",
            "system": f"system engine {options.label()}, {shape.name} (synthetic weights), one request, "
            f"{context}-token context; tau: the trained pair's exact replay ({builder})",
            "synthetic": True,
            "nodes": rows - 1,
            "tau": replay_tau(lattice, builder, rows - 1),
            "T_step_ms": round(t_draft + t_verify, 4),
            "T_AR_ms": t_ar,
            "kernels": kernels,
            "command": " ".join(sys.argv),
            "date": _dt.date.today().isoformat(),
            "git": result_header("system-profile")["git"],
        }
        measured_steps = result.get("single", {}).get("steps_ms", {}).get(name, {})
        if measured_steps:  # T_step(N) from the single section: the draft plus the verify step of N + 1 rows
            doc["step_times_ms"] = {int(r) - 1: round(t_draft + t, 4) for r, t in measured_steps.items() if int(r) > 1}
        path = Path(folder) / f"system-profile-{name}{'-smoke' if args.smoke else ''}.json"
        write_result(doc, path)
        out[name] = {
            "path": str(path),
            "T_verify_ms": t_verify,
            "T_prof_ms": round(measured + t_draft, 4),
            "kernels": kernels,
        }
        progress(f"profile {name}: {out[name]['T_prof_ms']} ms of {doc['T_step_ms']} ms")
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
    ap.add_argument(
        "--sections",
        default="check,forcing,single,batched,profile,speedup",
        help="comma-separated: check,single,batched,profile,speedup",
    )
    ap.add_argument("--rows", default="1,4,8,17,32,33,64")
    ap.add_argument("--single-options", default="", help="comma-separated SINGLE_OPTIONS names (default: all)")
    ap.add_argument("--batches", default="8,16,32")
    ap.add_argument("--batched-shapes", default="qwen3.5-4b-like,llama-3.1-8b-like")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--check-prompts", type=int, default=8)
    ap.add_argument("--check-prompt-len", type=int, default=64)
    ap.add_argument("--check-tokens", type=int, default=48)
    ap.add_argument("--check-batch", type=int, default=4)
    ap.add_argument("--check-options", default="", help="comma-separated CHECK_OPTIONS names (default: all)")
    ap.add_argument("--forcing-seeds", type=int, default=4)
    ap.add_argument("--forcing-per-seed", type=int, default=16)
    ap.add_argument("--forcing-tokens", type=int, default=96)
    ap.add_argument("--tau-prompts", type=int, default=16)
    ap.add_argument("--tau-tokens", type=int, default=128)
    ap.add_argument("--profile-dir", type=Path, help="where the profiles go (default: beside --out)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if args.smoke:
        args.context = min(args.context, 24)
        args.rows = "1,5"
        args.batches = "2"
        args.iters = 1
        args.check_prompts, args.check_prompt_len, args.check_tokens, args.check_batch = 2, 16, 6, 2
        args.tau_prompts, args.tau_tokens = 2, 12
        args.forcing_seeds, args.forcing_per_seed, args.forcing_tokens = 1, 2, 6
    dtype = torch.bfloat16
    timer = Timer(device, args.iters, bursts=1 if args.smoke else 5)
    result = {
        **result_header("system_bench"),
        "label": LABEL,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "smoke": args.smoke,
        "dtype": "bfloat16",
        "acceptance": "pinned to each tree's deepest root path (the largest commit)",
    }
    sections = {
        "check": lambda: check(args, device),
        "single": lambda: single(args, device, dtype, timer),
        "batched": lambda: batched(args, device, dtype, timer),
        "profile": lambda: profile(args, device, dtype, timer, result),
        "speedup": lambda: speedup(args, device, result),
        "forcing": lambda: forcing(args, device),
    }
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
    headline = "; ".join(h for h in (single_headline(result.get("single")), batched_headline(result)) if h)
    if headline:
        result["headline"] = headline
        if args.out:
            write_result(result, args.out)
    print_result(result, args.out)
    return 0


def batched_headline(result: dict) -> str | None:
    """The batched speedups over AR per shape (the index's headline), when the speedup section has them."""
    parts = []
    for shape, table in (
        result.get("speedup", {}).get("batched", {}).items() if isinstance(result.get("speedup"), dict) else []
    ):
        rows = [r for r in table.values() if "speedup_over_ar" in r.get("stock", {}) and "specpilot" in r]
        if rows:
            stock = [r["stock"]["speedup_over_ar"] for r in rows]
            tuned = [r["stock_tuned"]["speedup_over_ar"] for r in rows if "stock_tuned" in r]
            static = [r["stock_static"]["speedup_over_ar"] for r in rows if "stock_static" in r]
            mine = [r["specpilot"]["speedup_over_ar"] for r in rows]
            text = f"{shape} at {'/'.join(table)} requests: stock (16-chain) {min(stock):.2f}-{max(stock):.2f}x AR, "
            if static:
                block = next(iter(table.values()))["stock_static"]["block"]
                text += f"stock (one static block, {block}) {min(static):.2f}-{max(static):.2f}x AR, "
            if tuned:
                text += f"stock (best block per batch) {min(tuned):.2f}-{max(tuned):.2f}x AR, "
            parts.append(text + f"SpecPilot {min(mine):.2f}-{max(mine):.2f}x AR")
    return "; ".join(parts) if parts else None


if __name__ == "__main__":
    raise SystemExit(main())
