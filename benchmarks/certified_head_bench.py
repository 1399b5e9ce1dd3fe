"""Certified LM head vs the BF16 head on the H200 (synthetic weights), with a 1M-row property check.

    PYTHONPATH=kernels:. python benchmarks/certified_head_bench.py [--rows-checked 1048576] [--repeats 3] [--out FILE]

Prints one JSON document: device, date, command, the measured read bandwidth, the tuning of both INT8
passes (every CUDA partition's and Triton tile's time per row count), per row count 1..32 side by side:
BF16 head (cuBLAS via F.linear), the certified head and the INT8 pass alone through the CUDA pass and
through the Triton pass, each with its fastest partition or tile, all by CUDA-graph replay over rotating
weight copies larger than L2, with the INT8 byte floor and fractions, and the property check (certified
token through the default path, the CUDA pass where it runs with the partition tuned for 32 rows, vs the
exact head's argmax over >= 1M synthetic adversarial rows, real head shape). ``--repeats`` times every CUDA
partition that many times in interleaved rounds (the median counts); ``--sections`` runs some sections only,
``--row-counts`` some row counts; ``stages`` gives each kernel's time and the gaps between them (profiler over
graph replays) and the rescore alone. Each section is written to ``--out`` as soon as it ends; a failing section records its error and the others
still run.
The exact argmax of the check comes from an independent prefilter: cuBLAS logits select every row
within twice their error bound of the best, and those rows are scored with the exact head's arithmetic.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile

import torch
import torch.nn.functional as F
import triton

from specpilot_kernels.certified_head import certified_argmax_graphable, int8_pass, quantize_head
from specpilot_kernels.certified_head.adversarial import adversarial_head, adversarial_inputs
from specpilot_kernels.certified_head.cuda_pass import CudaPassConfig, cuda_pass_available
from specpilot_kernels.certified_head.exact_cuda import exact_head_logits_cuda, rescore_cuda
from specpilot_kernels.certified_head.head import interpreting, uses_cuda_exact, uses_cuda_pass
from specpilot_kernels.certified_head.reference import accumulation_gamma, radius_coefficients
from specpilot_kernels.certified_head.rescore import exact_k_splits, rescore
from specpilot_mem.bench.cuda_timing import graph_replay_us, read_bandwidth, record_section
from specpilot_mem.provenance import print_result, result_header

VOCAB, HIDDEN = 248320, 5120
ROW_COUNTS = (1, 2, 4, 8, 16, 32)
TILES = [
    dict(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
    for bn, bk, w, s in ((64, 128, 4, 4), (64, 128, 4, 3), (64, 64, 4, 4), (32, 128, 4, 4))
]
# the first two run the batched kernel, the others the general one
CUDA_CONFIGS = [
    CudaPassConfig(t, wpb, st, wps, xs, cpb)
    for t, wpb, st, wps, xs, cpb in (
        (2, 8, 3, 16, True, 8),
        (1, 8, 3, 16, True, 8),
        (2, 8, 3, 16, True, 4),
        (2, 8, 4, 16, True, 4),
    )
]
SECTIONS = ("stages", "cuda_tuning", "tuning", "variants", "rows", "rescore_tuning", "property_check")
# side by side in interleaved rounds: the whole certified call (c:; s: the same with the pass's compaction launch
# before the rescore instead of the rescore compacting the lists itself), the INT8 pass alone (p:) or the BF16 head
# (b:, cuBLAS), by the radius ("any": valid for any exact order; "warp": for the CUDA exact head's depth) and the
# exact arithmetic ("triton": the K-split MMA rescore and its finalize; "cuda": one launch of exact_cuda);
# "c:incumbents", "c:no_incumbents": the certified call with incumbents whatever the lists hold, and never (the
# default settles them from exact_cuda.INCUMBENT_MIN_PAIRS listed pairs on)
VARIANTS = {
    "c:warp_cuda_exact": ("warp", dict(cuda_config=CudaPassConfig(), exact="cuda")),
    "c:incumbents": ("warp", dict(cuda_config=CudaPassConfig(), exact="cuda", incumbent_min_pairs=0)),
    "c:no_incumbents": ("warp", dict(cuda_config=CudaPassConfig(), exact="cuda", incumbent_min_pairs=-1)),
    "s:compaction_launch": ("warp", dict(cuda_config=CudaPassConfig())),
    "p:warp": ("warp", dict(cuda_config=CudaPassConfig())),
    "b:bf16_head": ("warp", {}),
}


def exact_argmax_prefiltered(x: torch.Tensor, weight: torch.Tensor, row_norms: torch.Tensor, cap: int = 256):
    """Exact head argmax of x [M, K] via cuBLAS prefilter + exact rescoring of every row that may win (with the
    exact head's arithmetic of the default path)."""
    M, K = x.shape
    approx = F.linear(x, weight).float()  # bf16 output: relative error <= 2^-8 plus accumulation
    x_norm = x.float().norm(dim=1, keepdim=True)
    err = approx.abs() * 2.0**-8 + 2 * accumulation_gamma(K) * x_norm * row_norms[None, :]
    best = (approx - err).amax(1, keepdim=True)
    keep = approx + err >= best
    counts = keep.sum(1).to(torch.int32)
    if int(counts.max()) > cap:
        raise RuntimeError(f"prefilter kept {int(counts.max())} rows, over {cap}")
    row, col = keep.nonzero(as_tuple=True)  # row-major: each row's kept columns in increasing order
    starts = torch.cumsum(counts, 0) - counts
    order = torch.zeros((M, cap), dtype=torch.int32, device=x.device)
    order[row, torch.arange(row.numel(), device=x.device) - starts[row]] = col.to(torch.int32)
    upper = torch.zeros((M, cap), dtype=torch.float32, device=x.device)
    best_lower = torch.full((M,), float("-inf"), device=x.device)
    if uses_cuda_exact(x, "auto", None):  # the arithmetic the certified head's default path takes
        return rescore_cuda(x, weight, best_lower, counts, order, upper)
    return rescore(x, weight, best_lower, counts, order, upper, programs=1, dot_fp32=interpreting())


def property_check(
    head, pairs, rows: int, gen: torch.Generator, cuda_config: CudaPassConfig | None, chunk: int = 1024
) -> dict:
    row_norms = torch.cat(
        [torch.linalg.vector_norm(head.weight[s : s + 8192].float(), dim=1) for s in range(0, head.vocab, 8192)]
    )
    disagreements = torch.zeros((), dtype=torch.int64, device="cuda")
    fallback = torch.zeros((), dtype=torch.int64, device="cuda")
    candidates, done = [], 0
    while done < rows:
        x = adversarial_inputs(head.weight, pairs, chunk, gen)
        want = exact_argmax_prefiltered(x, head.weight, row_norms)
        for s in range(0, chunk, 32):
            tokens, count = certified_argmax_graphable(x[s : s + 32], head, cuda_config=cuda_config)
            fallback += (tokens < 0).sum()
            disagreements += ((tokens != want[s : s + 32]) & (tokens >= 0)).sum()
            candidates.append(count)
        done += chunk
    counts = torch.cat(candidates).float()
    return {
        "rows": done,
        "int8_pass": "cuda" if uses_cuda_pass(x, head, "auto") else "triton",
        "cuda_config": vars(cuda_config) if cuda_config else "default",
        "disagreements": int(disagreements),
        "fallback_rows": int(fallback),
        "candidates_mean": counts.mean().item(),
        "candidates_max": int(counts.max()),
        "synthetic": True,
    }


def tune(heads, gen, no_tune: bool) -> tuple[dict, dict]:
    """The fastest Triton tile per row count (the certificate does not depend on it), and every timing."""
    best_tiles, timings_out = {}, {}
    probe = torch.randn(32, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)
    for m in ROW_COUNTS:
        timings = []
        for tile in TILES[:1] if no_tune else TILES:
            try:
                us = (
                    triton.testing.do_bench(
                        lambda m=m, tile=tile: certified_argmax_graphable(
                            probe[:m], heads[0], backend="triton", **tile
                        ),
                        warmup=10,
                        rep=60,
                        return_mode="median",
                    )
                    * 1e3
                )
            except Exception as exc:  # a tile that does not fit (shared memory) is skipped, and said so
                print(f"tile {tile} failed at M={m}: {exc}", file=sys.stderr)
                continue
            timings.append((us, tile))
        best_tiles[m] = min(timings, key=lambda t: t[0])[1]
        timings_out[m] = [{"us": us, **tile} for us, tile in timings]
        print(
            f"M={m}: "
            + ", ".join(
                f"{t['block_n']}x{t['block_k']}w{t['num_warps']}s{t['num_stages']} {us:.0f} us" for us, t in timings
            ),
            file=sys.stderr,
            flush=True,
        )
    return best_tiles, timings_out


def tune_cuda(heads, gen, copies: int, repeats: int) -> tuple[dict, dict]:
    """The fastest CUDA partition per row count, by CUDA-graph replay of the INT8 pass alone, and every timing.

    Every partition is timed ``repeats`` times in interleaved rounds (single timings minutes apart drift by a few
    percent with the clock); the one of least median wins."""
    best, timings_out = {}, {}
    for m in ROW_COUNTS:
        xs = [torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        runs = {config: [] for config in CUDA_CONFIGS}
        for _ in range(repeats):
            for config in list(runs):
                try:
                    runs[config].append(
                        graph_replay_us(
                            lambda i, xs=xs, config=config: int8_pass(
                                xs[i], heads[i], backend="cuda", cuda_config=config
                            ),
                            copies,
                        )
                    )
                except Exception as exc:  # a partition that does not fit is skipped, and said so
                    print(f"CUDA partition {config} failed at M={m}: {exc}", file=sys.stderr)
                    del runs[config]
        medians = {config: statistics.median(us) for config, us in runs.items()}
        best[m] = min(medians, key=medians.get)
        timings_out[m] = [{"us": medians[config], "runs_us": us, **vars(config)} for config, us in runs.items()]
        print(
            f"M={m} CUDA: "
            + ", ".join(
                f"t{c.tiles_per_warp}w{c.warps_per_block}s{c.stages}x{c.warps_per_sm}"
                f"{'X' if c.shared_activations else ''}b{c.chunks_per_barrier} {us:.0f} us"
                for c, us in medians.items()
            ),
            file=sys.stderr,
            flush=True,
        )
    return best, timings_out


def rescored_after_incumbent(x: torch.Tensor, head) -> float:
    """Mean candidates per input row that the rescore reads with incumbents: those whose upper bound reaches the
    exact logit of the row's candidate of largest upper bound (that candidate included; on tied upper bounds the
    kernel takes the lowest row index, this the first listed)."""
    _, count, cand_idx, cand_upper = int8_pass(x, head, backend="cuda")
    logits = exact_head_logits_cuda(x, head.weight)
    kept = []
    for m in range(x.shape[0]):
        n = int(count[m])
        if not 0 < n <= cand_idx.shape[1]:
            continue
        upper, rows = cand_upper[m, :n], cand_idx[m, :n].long()
        incumbent = logits[m, rows[int(upper.argmax())]]
        kept.append(int((upper >= incumbent).sum()))
    return statistics.mean(kept) if kept else 0.0


def compare_variants(heads, gen, copies: int, repeats: int) -> dict:
    """Every VARIANTS entry per row count by CUDA-graph replay, ``repeats`` interleaved rounds (the median counts),
    every other round in reverse order, so that clock drift under the power limit falls on all of them alike; and
    the rows each radius keeps."""
    by_radius = {
        "warp": heads,
        "any": [dataclasses.replace(h, radius_coef=radius_coefficients(h.weight), exact_depth=None) for h in heads],
    }
    if heads[0].exact_depth is None:
        raise RuntimeError("the default head carries the radius for any order: the CUDA exact head did not build")
    out = {}
    for m in ROW_COUNTS:
        xs = [torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        runs = {name: [] for name in VARIANTS}
        for round_ in range(repeats):  # every other round in reverse order (ABBA): drift falls on both sides alike
            for name, (radius, options) in list(VARIANTS.items())[:: -1 if round_ % 2 else 1]:
                hs = by_radius[radius]

                def call(i, name=name, xs=xs, hs=hs, options=options):
                    if name.startswith("b:"):
                        return F.linear(xs[i], hs[i].weight)
                    if name.startswith("s:"):
                        return rescore_cuda(xs[i], hs[i].weight, *int8_pass(xs[i], hs[i], backend="cuda", **options))
                    run = certified_argmax_graphable if name.startswith("c:") else int8_pass
                    return run(xs[i], hs[i], backend="cuda", **options)

                runs[name].append(graph_replay_us(call, copies))
        out[m] = {name: {"us": statistics.median(us), "runs_us": us} for name, us in runs.items()}
        out[m]["rescored_per_row"] = {
            radius: int8_pass(xs[0], hs[0])[1].float().mean().item() for radius, hs in by_radius.items()
        }
        out[m]["rescored_per_row"]["warp_incumbent"] = rescored_after_incumbent(xs[0], heads[0])
        print(
            f"M={m} variants: "
            + ", ".join(f"{name} {statistics.median(us):.1f} us" for name, us in runs.items())
            + f"; rows kept per input row {out[m]['rescored_per_row']}",
            file=sys.stderr,
            flush=True,
        )
    return out


KERNEL_NAMES = ("prologue_kernel", "int8_pass_batched_kernel", "int8_pass_kernel", "compact_kernel", "rescore_kernel")


def kernel_trace(fn_for_copy, copies: int, replays: int = 10) -> dict:
    """Per kernel of a CUDA graph of ``copies`` calls (replayed ``replays`` times under the profiler): the median
    duration, and the median gap from each kernel's end to the next kernel's start (negative: overlapped launch)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(copies):
            fn_for_copy(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            fn_for_copy(i)
    graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    del graph
    with tempfile.NamedTemporaryFile(suffix=".json") as fh:
        prof.export_chrome_trace(fh.name)
        trace = json.load(open(fh.name))
    kernels = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])

    def short(name: str) -> str:
        return next((k for k in KERNEL_NAMES if k in name), name[:60])

    durations, gaps = {}, {}
    for prev, nxt in zip([None] + kernels[:-1], kernels):
        durations.setdefault(short(nxt["name"]), []).append(nxt["dur"])
        if prev is not None:
            gaps.setdefault(f"{short(prev['name'])} -> {short(nxt['name'])}", []).append(
                nxt["ts"] - prev["ts"] - prev["dur"]
            )
    return {
        "kernels": len(kernels),
        "duration_us": {k: statistics.median(v) for k, v in durations.items()},
        "gap_us": {k: statistics.median(v) for k, v in gaps.items()},
        "replay_span_us": (kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]) / replays if kernels else None,
    }


def stages(heads, gen, copies: int, repeats: int) -> dict:
    """Where the certified call's time goes: each kernel's duration and the gaps between them (profiler over graph
    replays), and the rescore alone by blocks per multiprocessor on the pass's lists (interleaved rounds, median)."""
    out = {}
    for m in ROW_COUNTS:
        xs = [torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        lists = [int8_pass(xs[i], heads[i]) for i in range(copies)]
        entry = {"trace": kernel_trace(lambda i, xs=xs: certified_argmax_graphable(xs[i], heads[i]), copies)}
        runs = {blocks: [] for blocks in (0, 1, 2)}  # 0: the rescore's own choice
        for _ in range(repeats):
            for blocks in runs:
                runs[blocks].append(
                    graph_replay_us(
                        lambda i, xs=xs, lists=lists, blocks=blocks: rescore_cuda(
                            xs[i], heads[i].weight, *lists[i], blocks_per_sm=blocks
                        ),
                        copies,
                    )
                )
        entry["rescore_alone_us"] = {f"blocks_per_sm_{b}": statistics.median(us) for b, us in runs.items()}
        entry["rescored_per_row"] = lists[0][1].float().mean().item()
        out[m] = entry
        print(f"M={m} stages: {json.dumps(entry)}", file=sys.stderr, flush=True)
    return out


RESCORE_TILES = [
    (1, 32, 256, 4, 64),
    (1, 32, 256, 4, 32),
    (1, 64, 256, 4, 32),
    (2, 32, 256, 4, 32),
    (4, 32, 256, 4, 16),
    (4, 32, 256, 4, 64),
    (5, 32, 256, 4, 16),
    (4, 16, 256, 4, 32),
    (2, 32, 512, 4, 32),
]  # (K splits, candidates per block, K slice, warps, programs per row)


def tune_rescore(heads, gen, copies: int) -> dict:
    """Rescore + finalize alone by CUDA-graph replay on the candidate lists of one INT8 pass per copy: the CUDA
    rescore (one launch) by blocks per multiprocessor, the Triton one for other summation orders (K splits, K slice:
    the exact head changes with them) and tilings."""
    out = {}
    for m in (1, 8, 16, 32):
        xs = [torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        lists = [int8_pass(xs[i], heads[i]) for i in range(copies)]
        timings = []
        for blocks_per_sm in (1, 2):
            shape = {"exact": "cuda", "blocks_per_sm": blocks_per_sm}
            try:
                shape["us"] = graph_replay_us(
                    lambda i, xs=xs, lists=lists, blocks=blocks_per_sm: rescore_cuda(
                        xs[i], heads[i].weight, *lists[i], blocks_per_sm=blocks
                    ),
                    copies,
                )
            except Exception as exc:
                shape["error"] = f"{type(exc).__name__}: {exc}"
            timings.append(shape)
        for splits, bs, bk, warps, programs in RESCORE_TILES:
            tiling = {"k_splits": splits, "block_s": bs, "block_k": bk, "num_warps": warps, "programs": programs}
            shape = dict(tiling)
            try:
                shape["us"] = graph_replay_us(
                    lambda i, xs=xs, lists=lists, tiling=tiling: rescore(
                        xs[i], heads[i].weight, *lists[i], dot_fp32=False, **tiling
                    ),
                    copies,
                )
            except Exception as exc:
                shape["error"] = f"{type(exc).__name__}: {exc}"
            timings.append(shape)
        out[m] = timings
        print(f"M={m} rescore: {timings}", file=sys.stderr, flush=True)
    return out


def timing(heads, gen, best_tiles: dict, best_cuda: dict, copies: int, bandwidth: float) -> list[dict]:
    rows_out = []
    int8_bytes = VOCAB * HIDDEN + VOCAB * 8
    for m in ROW_COUNTS:
        xs = [torch.randn(m, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        tile = {key: best_tiles[m][key] for key in ("block_n", "block_k", "num_warps", "num_stages")}
        floor_us = (int8_bytes + m * HIDDEN * 2) / bandwidth * 1e6
        bf16_floor_us = (VOCAB * HIDDEN * 2 + m * VOCAB * 2) / bandwidth * 1e6
        bf16_us = graph_replay_us(lambda i, xs=xs: F.linear(xs[i], heads[i].weight), copies)
        row = {
            "M": m,
            "bf16_head_us": bf16_us,
            "int8_floor_us": floor_us,
            "bf16_frac_of_floor": bf16_floor_us / bf16_us,
        }
        passes = {"triton": dict(backend="triton", **best_tiles[m])}
        if m in best_cuda:
            passes["cuda"] = dict(backend="cuda", cuda_config=best_cuda[m])
        for name, options in passes.items():
            cert_us = graph_replay_us(
                lambda i, xs=xs, options=options: certified_argmax_graphable(xs[i], heads[i], **options), copies
            )
            int8_us = graph_replay_us(lambda i, xs=xs, options=options: int8_pass(xs[i], heads[i], **options), copies)
            best_lower, count, _, cand_upper = int8_pass(xs[0], heads[0], **options)
            listed = torch.arange(cand_upper.shape[1], device="cuda")[None, :] < count[:, None]
            rescored = (listed & (cand_upper >= best_lower[:, None])).sum(1)
            row[name] = {
                "certified_us": cert_us,
                "speedup": bf16_us / cert_us,
                "int8_pass_us": int8_us,
                "certified_frac_of_int8_floor": floor_us / cert_us,
                "int8_pass_frac_of_int8_floor": floor_us / int8_us,
                "partition": vars(best_cuda[m]) if name == "cuda" else tile,
                "candidates_listed_per_row": count.float().mean().item(),
                "candidates_rescored_per_row": rescored.float().mean().item(),
            }
        rows_out.append(row)
        print(json.dumps(rows_out[-1]), file=sys.stderr, flush=True)
    return rows_out


def main() -> None:
    global ROW_COUNTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-checked", type=int, default=1 << 20)
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-tune", action="store_true", help="use the first Triton INT8 tile for every row count")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved timings of every CUDA partition")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated sections to run, in this order: {', '.join(SECTIONS)}",
    )
    parser.add_argument(
        "--row-counts",
        default=",".join(map(str, ROW_COUNTS)),
        help="comma-separated row counts the timing sections run (the property check takes 32)",
    )
    args = parser.parse_args()
    ROW_COUNTS = tuple(int(m) for m in args.row_counts.split(","))
    sections = args.sections.split(",")
    if unknown := set(sections) - set(SECTIONS):
        parser.error(f"unknown sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    bandwidth = read_bandwidth()
    # timing on a Gaussian head (how many rows survive is a property of the data: the adversarial head's
    # outlier rows carry radii far above the logit spread and survive every input), the check on the adversarial one
    gaussian = (torch.randn(VOCAB, HIDDEN, generator=gen, device="cuda") * 0.02).to(torch.bfloat16)
    heads = [quantize_head(gaussian)] + [quantize_head(gaussian.clone()) for _ in range(args.copies - 1)]
    print(f"heads ready; read bandwidth {bandwidth / 1e12:.2f} TB/s", file=sys.stderr, flush=True)
    result = {
        **result_header("certified_head_bench"),
        "synthetic": "timing: random bf16 head 0.02 * N(0,1) and N(0,1) inputs (flat logits, no token stands out); "
        "property check: that head plus duplicate, near-duplicate, outlier and rescaled rows, with "
        "inputs aimed at tied pairs and of extreme norms",
        "shape": [VOCAB, HIDDEN],
        "read_bandwidth_TBps": bandwidth / 1e12,
        "copies": args.copies,
        "exact_k_splits": exact_k_splits(HIDDEN),
        "timing": "CUDA-graph replay over rotating weight copies (each copy >= 1.2 GB, L2 60 MB), median of 20",
    }

    best_tiles = {m: TILES[0] for m in ROW_COUNTS}
    best_cuda = {}

    def run_tuning():
        tuned, timings = tune(heads, gen, args.no_tune)
        best_tiles.update(tuned)
        return timings

    def run_cuda_tuning():
        if not cuda_pass_available():
            raise RuntimeError("the CUDA INT8 pass is not available on this GPU (see the warning)")
        tuned, timings = tune_cuda(heads, gen, args.copies, args.repeats)
        best_cuda.update(tuned)
        return timings

    def run_check():
        weight, pairs = adversarial_head(VOCAB, HIDDEN, gen)
        # in calls of 32 rows, through the 32-row partition the tuning picked (the default without tuning)
        return property_check(quantize_head(weight), pairs, args.rows_checked, gen, best_cuda.get(32))

    runs = {
        "stages": lambda: stages(heads, gen, args.copies, args.repeats),
        "cuda_tuning": run_cuda_tuning,
        "tuning": run_tuning,
        "rows": lambda: timing(heads, gen, best_tiles, best_cuda, args.copies, bandwidth),
        "rescore_tuning": lambda: tune_rescore(heads, gen, args.copies),
        "property_check": run_check,
        "variants": lambda: compare_variants(heads, gen, args.copies, args.repeats),
    }
    for name in SECTIONS:
        if name not in sections:
            continue
        if name == "property_check":
            heads = None  # the timing copies' memory goes back before the adversarial head is built
        record_section(result, name, runs[name], args.out)
    print_result(result, args.out)


if __name__ == "__main__":
    main()
