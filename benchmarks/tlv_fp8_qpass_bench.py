"""The FP8 Q pass (``w12_fp8_qpass_gemm``: the W12 8-bit view fed to the FP8 tensor cores in place) against the exact
W12 GEMM and the BF16 Q mode, one request at the 27B-like shapes, then the system engine's Q pass and TLV cycle in
each Q mode.

GEMMs (the 27B-like engine's linears and its LM head) at 1, 16, 32 and 33 rows (33: a 32-node tree and its root),
under CUDA-graph replay over rotating copies larger than L2 (``cuda_timing.graph_replay_us``), the quantizer included
in every FP8 time; beside the default partition a sweep of partitions (weight tiles a warp, warps a K, warps a block),
truncated, for tuning. Correctness first, per shape: the kernel against its torch emulation (``fp8_qpass_reference``:
the same E4M3 activations and weights, fp32 sums) for every built tiles-a-warp at 33 rows, the quantizer's bytes
against ``fp8_rows_reference`` bit for bit, one-hot rows (single weights, exact), and the same bits for a row at 1
and at 33 rows under one partition.

System (27B-like, synthetic weights, 1,024-token context): per row count (1, 32, 33) the exact step, the Q pass in
each mode (``q8_midpoint``: the BF16 Q mode; ``fp8_midpoint``, ``fp8_truncated``), its projections and head alone,
and the cycle (two drafts, Q pass, exact step) against a single-pass step (``tlv_qpass_probe.system_rows``).

    PYTHONPATH=kernels:. python benchmarks/tlv_fp8_qpass_bench.py --out FILE          # H200
    PYTHONPATH=kernels:. python benchmarks/tlv_fp8_qpass_bench.py --device cpu        # dry run: the emulation only
    PYTHONPATH=kernels:. python benchmarks/tlv_fp8_qpass_bench.py --tuned-out FILE    # H200: + the tuned table
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.provenance import print_result, result_header  # noqa: E402

SHAPE = "qwen3.8-27b-like"
L2_BYTES = 60 * 2**20
Q_MODES = ("fp8_midpoint", "fp8_truncated")  # the BF16 Q mode (q8_midpoint) was timed beside them in call 1
WGMMA_KINDS = ("wgmma_f16",)  # the warpgroup kinds (csrc/w12_qpass_fp8_wgmma.cu, sm_90a)
KINDS = ["e4m3", "f16", "wgmma_f16"]  # the operand kinds the sweep times (--kinds)


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def check_shape(n: int, k: int, device: str) -> dict:
    """Correctness of the kernel at one shape (CUDA) or of the emulation's pieces (CPU dry run)."""
    from specpilot_kernels.w12 import encode, to_mma_layout
    from specpilot_kernels.w12.qpass_fp8 import fp8_qpass_reference, fp8_rows_reference, w12_fp8_qpass_gemm

    torch.manual_seed(1)
    w12 = encode((torch.randn(n, k, device=device) * 0.02).bfloat16())
    x = torch.randn(33, k, device=device).bfloat16()
    out = {}
    q, scale = fp8_rows_reference(x)
    out["quantized_max"] = float(q.float().abs().max())
    if device == "cpu":
        out["emulation_rel_err_vs_bf16_q"] = rel_err(fp8_qpass_reference(x, w12), x.float() @ qpass_weight(w12).t())
        return out
    mma = to_mma_layout(w12)
    from specpilot_kernels.cuda_extension import load_cuda_extension
    from specpilot_kernels.w12.qpass_fp8 import CSRC, EXTENSION, SOURCES

    ext = load_cuda_extension(EXTENSION, CSRC, SOURCES)
    kp = mma.padded_shape[1]
    image = torch.empty(40 * kp, dtype=torch.uint8, device=device)
    got_scale = torch.empty(33, dtype=torch.float32, device=device)
    ext.quantize_rows(x, image, got_scale, kp, False)
    # the image back in row order: [j][p][4g + t][8h + i] -> token 8j + g, column 64p + 32h + 8t + i
    rows = image.view(5, kp // 64, 8, 4, 2, 8).permute(0, 2, 1, 4, 3, 5).reshape(40, kp)[:33, :k]
    out["quantizer_bytes_equal"] = torch.equal(rows, q.view(torch.uint8))
    out["quantizer_scale_equal"] = torch.equal(got_scale, scale)
    hopper = torch.cuda.get_device_capability() == (9, 0)
    wgmma_kinds = [kind for kind in WGMMA_KINDS if kind in KINDS] if hopper else []
    if hopper:  # the warpgroup f16 image back in row order (padding rows must come out zero):
        # [b][s][h][j][g][2t + e] -> token 8j + g, column 32b + 8t + 4s + 2h + e
        fimage = torch.full((80 * kp,), 0xFF, dtype=torch.uint8, device=device)
        ext.quantize_rows_wgmma(x, fimage, got_scale, kp, 5, False)
        frows = fimage.view(torch.float16).view(kp // 32, 2, 2, 5, 8, 4, 2).permute(3, 4, 0, 5, 1, 2, 6).reshape(40, kp)
        as_e4m3 = frows.to(torch.float8_e4m3fn).view(torch.uint8)  # exact: the f16 numbers are E4M3 numbers
        out["quantizer_wgmma_f16_bytes_equal"] = torch.equal(as_e4m3[:33, :k], q.view(torch.uint8))
        out["quantizer_wgmma_f16_padding_zero_equal"] = bool((frows[33:] == 0).all() and (frows[:33, k:] == 0).all())
        out["quantizer_wgmma_scale_equal"] = torch.equal(got_scale, scale)
    from specpilot_kernels.w12.qpass_fp8 import TILES_PER_WARP, select_fp8_qpass_config, tiles_per_warp_fits

    for low_bits in ("midpoint", "truncated"):
        ref = fp8_qpass_reference(x, w12, low_bits)
        got = w12_fp8_qpass_gemm(x, mma, low_bits).float()
        out[f"{low_bits}_rel_err_vs_emulation"] = rel_err(got, ref)
        out[f"{low_bits}_rel_err_vs_bf16_q"] = rel_err(got, x.float() @ qpass_weight(w12, low_bits).t())
        config = select_fp8_qpass_config(n, k, x.device, 33, low_bits == "midpoint")
        for r in TILES_PER_WARP:  # every built tiles-a-warp, the chosen K split and operands
            if tiles_per_warp_fits(33, r, low_bits == "midpoint", config.operands):
                other = replace(config, tiles_per_warp=r)
                bits = w12_fp8_qpass_gemm(x, mma, low_bits, config=other)
                out[f"{low_bits}_tiles_per_warp{r}_rel_err_vs_emulation"] = rel_err(bits, ref)
                one = w12_fp8_qpass_gemm(x[5:6].contiguous(), mma, low_bits, config=replace(other, tiles_per_warp=1))
                out[f"{low_bits}_tiles_per_warp{r}_row_bits_same_at_1_row"] = torch.equal(one, bits[5:6])
        for kind in wgmma_kinds:  # the warpgroup kinds at 33 and 1 rows, split or not (counters reset by each launch)
            for c in wgmma_configs(n, k, torch.cuda.get_device_properties(0).multi_processor_count, kind)[:3]:
                for _ in range(2):
                    bits = w12_fp8_qpass_gemm(x, mma, low_bits, config=c)
                out[f"{low_bits}_{label(c)}_rel_err_vs_emulation"] = rel_err(bits, ref)
                one = w12_fp8_qpass_gemm(x[5:6].contiguous(), mma, low_bits, config=c)
                out[f"{low_bits}_{label(c)}_rel_err_vs_emulation_1_row"] = rel_err(one, ref[5:6])
                out[f"{low_bits}_{label(c)}_row_bits_same_at_1_row"] = torch.equal(one, bits[5:6])
    cols = torch.arange(0, k, max(1, k // 16), device=device)[:16]
    onehot = torch.zeros(cols.numel(), k, device=device, dtype=torch.bfloat16)
    onehot[torch.arange(cols.numel(), device=device), cols] = 1.0
    expected = fp8_qpass_reference(onehot, w12, "midpoint").bfloat16()
    out["one_hot_equal_values"] = torch.equal(w12_fp8_qpass_gemm(onehot, mma, "midpoint"), expected)
    return out


def wgmma_check(kinds: list[str]) -> dict:
    """The warpgroup kinds against the emulation before any sweep launches them (a broken ring would hang the stage):
    a short last tile group (1000 rows) and the 27B-like gdn_out, 1-64 rows, both modes, unsplit and split, each
    element within the GPU tests' slack (2**-8 relative + 1e-5 of the largest); the worst element's error over its
    slack and the elements past it. Then gdn_out and gate_up at 1 and 33 rows timed in each kind beside the per-warp
    kernel's table choice. ``passed``: the kinds within it everywhere."""
    from specpilot_kernels.w12 import encode, to_mma_layout
    from specpilot_kernels.w12.qpass_fp8 import Fp8QpassConfig, fp8_qpass_reference, w12_fp8_qpass_gemm

    out, passed = {}, {}
    for n, k in ((1000, 1536), (5120, 6144)):
        torch.manual_seed(2)
        w12 = encode((torch.randn(n, k, device="cuda") * 0.02).bfloat16())
        mma = to_mma_layout(w12)
        for m in (1, 16, 33, 64):
            x = torch.randn(m, k, device="cuda").bfloat16()
            for low_bits in ("midpoint", "truncated"):
                ref = fp8_qpass_reference(x, w12, low_bits)
                slack = 2.0**-8 * ref.abs() + 1e-5 * ref.abs().max()
                for kind in ["per_warp", *kinds]:  # per_warp: the default partition, the check's own baseline
                    for groups, splits in ((1, 1), (2, 3)) if kind != "per_warp" else ((0, 0),):
                        config = Fp8QpassConfig(1, groups, 1, splits, kind) if groups else None
                        for _ in range(2):  # the second launch finds the split counters reset
                            y = w12_fp8_qpass_gemm(x, mma, low_bits, config=config)
                        torch.cuda.synchronize()  # a hang shows as the last case logged
                        over = (y.float() - ref).abs() / slack
                        entry = {"rel_err": rel_err(y, ref), "worst_over_slack": float(over.max()),
                                 "past_slack": int((over > 1).sum()), "of": over.numel()}  # fmt: skip
                        name = label(config) if config else kind
                        passed[kind] = passed.get(kind, True) and entry["past_slack"] == 0
                        out[f"{n}x{k},M={m},{low_bits},{name}"] = entry
                        log("wgmma check", n, k, m, low_bits, name, entry)
    shapes = engine_shapes()
    for name in ("gdn_out", "gate_up"):
        out.update(time_wgmma_kinds(name, *shapes[name], kinds))
        torch.cuda.empty_cache()
    out["per_warp_within"] = passed["per_warp"]
    out["passed"] = [kind for kind in kinds if passed[kind]]
    return out


def time_wgmma_kinds(name: str, n: int, k: int, kinds: list[str]) -> dict:
    """The shape at 1 and 33 rows in each mode: the per-warp kernel's table choice and each warpgroup kind's first two
    partitions (``wgmma_configs``), in µs."""
    from specpilot_kernels.w12 import encode, to_mma_layout
    from specpilot_kernels.w12.qpass_fp8 import w12_fp8_qpass_gemm

    from specpilot_mem.bench.cuda_timing import graph_replay_us

    copies = max(2, math.ceil(2 * L2_BYTES / (n * k)))
    mmas = [to_mma_layout(encode((torch.randn(n, k, device="cuda") * 0.02).bfloat16())) for _ in range(copies)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {}
    for m in (1, 33):
        x = torch.randn(m, k, device="cuda").bfloat16()
        for low_bits in ("midpoint", "truncated"):
            configs = {"per_warp_table": None}
            configs.update({label(c): c for kind in kinds for c in wgmma_configs(n, k, sms, kind)[:2]})
            row = {
                key: graph_replay_us(
                    lambda i, c=c, lb=low_bits, x=x: w12_fp8_qpass_gemm(x, mmas[i], lb, config=c),
                    copies=copies,
                    replays=10,
                )
                for key, c in configs.items()
            }
            out[f"time {name} M={m} {low_bits}"] = row
            log("wgmma time", name, m, low_bits, row)
    return out


def qpass_weight(w12, low_bits: str = "midpoint") -> torch.Tensor:
    from specpilot_kernels.w12.reference import qpass_weight_reference

    return qpass_weight_reference(w12, low_bits).float()


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref.float()).norm() / ref.float().norm()).item()


def engine_shapes() -> dict[str, tuple[int, int]]:
    from specpilot_mem.engine.shapes import get_shape

    shape = get_shape(SHAPE, False)
    return {**shape.linear_shapes(), "lm_head": (shape.vocab_size, shape.d_model)}


def gemm_section(rows: list[int], replays: int, sweep_rows: list[int], sweep_s: float) -> dict:
    """Per shape: checks, then the timings; partitions swept at ``sweep_rows`` for up to ``sweep_s`` seconds over
    all shapes (an equal share each, counted from its first sweep: the weights' encoding and the extensions' builds
    are not the sweep's; in call 1 of 2026-12-03 they left the first shape one timed partition)."""
    from specpilot_kernels.w12.qpass_fp8 import fp8_qpass_available

    if not fp8_qpass_available("cuda"):  # builds (or loads) the extension before any clock runs
        raise SystemExit("the FP8 Q pass does not build on this GPU (needs sm_89+)")
    out = {}
    shapes = engine_shapes()
    for name, (n, k) in shapes.items():
        out[name] = {"N": n, "K": k, **time_shape(name, n, k, rows, replays, sweep_rows, sweep_s / len(shapes))}
        torch.cuda.empty_cache()
        out[name]["check"] = check_shape(n, k, "cuda")  # the partitions the timings chose (tuned where swept)
        log(name, out[name]["check"])
        torch.cuda.empty_cache()
    return out


def wgmma_configs(n: int, k: int, sms: int, kind: str) -> list:
    """The warpgroup kind's partitions (sm_90): 1-2 warpgroups a block x K splits of at least 4 chunks of 128
    columns, nearest first to 4 blocks of 4 warps a multiprocessor (its ring's shared memory admits about that many
    at 33 rows)."""
    from specpilot_kernels.w12.qpass_fp8 import MAX_WARPGROUPS, Fp8QpassConfig

    tiles, chunks = -(-n // 16), -(-k // 128)
    configs = [
        Fp8QpassConfig(1, groups, 1, splits, kind)
        for groups in range(1, MAX_WARPGROUPS + 1)
        for splits in (1, 2, 3, 4, 6, 8, 12)
        if chunks // splits >= 4
    ]
    blocks = {c: -(-tiles // (4 * c.groups_per_block)) * c.splits * c.groups_per_block for c in configs}
    return sorted(configs, key=lambda c: abs(math.log(blocks[c] / (4 * sms))))


def sweep_configs(n: int, k: int, m: int, midpoint: bool) -> list:
    """Partitions beside the default: on sm_90 the warpgroup kind's first (``wgmma_configs``), then for both
    per-warp operand kinds 1-2 weight tiles a warp (f16) or 2-4 (E4M3: one never won on the H200) x warps a K x 4- or
    8-warp blocks, one block a K; and the K-split rule's partition. Likelier winners first (a sweep may run out of
    time): at 1-8 rows E4M3 and many warps a K, past them f16 (the H200's winners of call 1, 2026-12-03)."""
    from specpilot_kernels.w12.qpass_fp8 import Fp8QpassConfig, fp8_qpass_partition, tiles_per_warp_fits

    pairs = -(-k // 128) * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    configs = [c for kind in WGMMA_KINDS if hopper and kind in KINDS for c in wgmma_configs(n, k, sms, kind)]
    kinds = (("f16", (1, 2)), ("e4m3", (2, 4)))
    for operands, tiles in kinds[::-1] if m <= 8 else kinds:
        for r in tiles:
            if operands not in KINDS or not tiles_per_warp_fits(m, r, midpoint, operands):
                continue
            split = replace(fp8_qpass_partition(n, k, sms, r), operands=operands)
            for config in [Fp8QpassConfig(wk, max(1, b // wk), r, 1, operands) for wk in (8, 4, 2, 1) for b in (4, 8)]:
                if config not in configs and pairs // config.warps_k >= 4:
                    configs.append(config)
            if split not in configs:
                configs.append(split)
    return configs


def label(config) -> str:
    return f"{config.operands}_r{config.tiles_per_warp}_wk{config.warps_k}_g{config.groups_per_block}_s{config.splits}"


def parse_label(text: str):
    from specpilot_kernels.w12.qpass_fp8 import Fp8QpassConfig

    words = text.split("_")
    operands = "_".join(words[:-4])  # the kind may hold "_" (wgmma_f16)
    r, wk, g, splits = (int(part.lstrip("rwkgs")) for part in words[-4:])
    return Fp8QpassConfig(warps_k=wk, groups_per_block=g, tiles_per_warp=r, splits=splits, operands=operands)


def tuned_table() -> dict:
    """This GPU's part of the tuned table as the kernels read it (the in-memory copy: a sweep's choice applies at
    once, to the timings and the system engine after it)."""
    from specpilot_kernels.w12 import qpass_fp8

    return qpass_fp8._tuned().setdefault(torch.cuda.get_device_name(), {})


def sweep_shape(n: int, k: int, m: int, mmas, w12, x, timed, until: float) -> dict:
    """Every sweep partition at m rows in both modes, the table's current choice first: its µs and its error
    against the emulation; the fastest correct one (relative error < 4e-3, the bf16 output rounding being ~1.7e-3)
    goes into the tuned table. The current choice is always among those timed, so a sweep that runs out of time
    cannot leave an entry slower than it found it."""
    from specpilot_kernels.w12.qpass_fp8 import (
        fp8_qpass_reference,
        select_fp8_qpass_config,
        tuned_key,
        w12_fp8_qpass_gemm,
    )

    out = {}
    for index, low_bits in enumerate(("truncated", "midpoint")):
        mode_until = time.perf_counter() + (until - time.perf_counter()) / (2 - index)
        midpoint = low_bits == "midpoint"
        ref = fp8_qpass_reference(x, w12, low_bits)
        current = select_fp8_qpass_config(n, k, x.device, m, midpoint)
        times, errors = {}, {}
        for c in [current] + [c for c in sweep_configs(n, k, m, midpoint) if c != current]:
            if time.perf_counter() > mode_until and c is not current:
                break
            try:
                errors[label(c)] = rel_err(w12_fp8_qpass_gemm(x, mmas[0], low_bits, config=c), ref)
                times[label(c)] = timed(lambda i, c=c, lb=low_bits, x=x: w12_fp8_qpass_gemm(x, mmas[i], lb, config=c))
            except RuntimeError as err:  # a partition that does not launch: recorded, not fatal
                errors[label(c)] = str(err)[:200]
        correct = {key: us for key, us in times.items() if isinstance(errors[key], float) and errors[key] < 4e-3}
        entry = {"us": times, "rel_err": errors}
        if correct:
            best = min(correct, key=correct.get)
            entry["best"] = best
            tuned_table().setdefault(f"{n},{k}", {})[tuned_key(m, low_bits == "midpoint")] = vars(parse_label(best))
        out[low_bits] = entry
        del ref
    return out


def time_shape(name: str, n: int, k: int, rows: list[int], replays: int, sweep_rows: list[int], sweep_s: float) -> dict:
    from specpilot_kernels.w12 import encode, to_mma_layout, w12_mma_gemm
    from specpilot_kernels.w12.qpass_fp8 import select_fp8_qpass_config, w12_fp8_qpass_gemm

    from specpilot_mem.bench.cuda_timing import graph_replay_us

    copies = max(2, math.ceil(2 * L2_BYTES / (n * k)))
    torch.manual_seed(0)
    w12 = encode((torch.randn(n, k, device="cuda") * 0.02).bfloat16())  # copy 0's: the sweep's reference
    mmas = [to_mma_layout(w12)]
    mmas += [to_mma_layout(encode((torch.randn(n, k, device="cuda") * 0.02).bfloat16())) for _ in range(copies - 1)]
    entry = {"copies": copies, "rows": []}
    view_bytes, plane_bytes = mmas[0].view.numel(), mmas[0].view.numel() + mmas[0].nibbles.numel()

    def timed(fn, replays=replays):
        return graph_replay_us(fn, copies=copies, replays=replays)

    sweep_until = None  # the shape's sweep seconds run from its first sweep
    for m in rows:
        x = torch.randn(m, k, device="cuda").bfloat16()
        row = {"M": m, "exact_us": timed(lambda i, x=x: w12_mma_gemm(x, mmas[i]))}
        if m in sweep_rows and sweep_until is None:
            sweep_until = time.perf_counter() + sweep_s
        if m in sweep_rows and time.perf_counter() < sweep_until:  # first, so the timings below use its choice
            left = sum(1 for r in rows[rows.index(m) :] if r in sweep_rows)  # an equal share of what is left
            until = time.perf_counter() + (sweep_until - time.perf_counter()) / left
            row["sweep"] = sweep_shape(n, k, m, mmas, w12, x, lambda fn: timed(fn, max(4, replays // 3)), until)
        for low_bits in ("midpoint", "truncated"):
            config = select_fp8_qpass_config(n, k, x.device, m, low_bits == "midpoint")
            row[f"fp8_q_{low_bits}_config"] = label(config)
            row[f"fp8_q_{low_bits}_tuned"] = "best" in row.get("sweep", {}).get(low_bits, {})
            row[f"fp8_q_{low_bits}_us"] = timed(lambda i, x=x, lb=low_bits: w12_fp8_qpass_gemm(x, mmas[i], lb))
            row[f"fp8_q_{low_bits}_over_exact"] = row[f"fp8_q_{low_bits}_us"] / row["exact_us"]
        row["exact_TBps"] = plane_bytes / row["exact_us"] / 1e6
        row["fp8_q_truncated_TBps"] = view_bytes / row["fp8_q_truncated_us"] / 1e6
        entry["rows"].append(row)
        log(
            name,
            {key: round(v, 3) if isinstance(v, float) else v for key, v in row.items() if key != "sweep"},
        )
    return entry


def system_section(rows_list: list[int], context: int, modes: tuple[str, ...]) -> dict:
    from system_bench import Timer
    from tlv_cycle_bench import EXACT
    from tlv_qpass_probe import stock_step, system_rows

    from specpilot_mem.engine.shapes import get_shape
    from specpilot_mem.engine.system import Caches, SystemModel, Weights

    device = torch.device("cuda")
    timer = Timer(device, 10, bursts=5)
    shape = get_shape(SHAPE, False)
    weights = Weights.synthetic(shape, device, torch.bfloat16)
    caches = Caches(shape, 1, context + max(rows_list) + 8, device, torch.bfloat16)
    caches.randomize(context)
    model = SystemModel(weights, EXACT)
    out = {}
    for rows in rows_list:
        for mode in modes:
            out[f"rows={rows},{mode}"] = system_rows(model, caches, rows, context, timer, mode)
    out["stock"] = stock_step(weights, caches, context, timer)
    return out


def headline(system: dict) -> str:
    """Q pass / exact step per row count and mode (the <= 0.75 target), e.g. "Q pass / exact step, 1 row: 0.70x
    midpoint, 0.69x truncated; 33 rows: ..."."""
    by_rows: dict[int, list[str]] = {}
    for key, entry in system.items():
        if key.startswith("rows="):
            mode = key.split(",", 1)[1].removeprefix("fp8_")
            by_rows.setdefault(entry["rows"], []).append(f"{entry['q_over_exact']:.2f}x {mode}")
    parts = [f"{rows} row{'s' if rows > 1 else ''}: {', '.join(v)}" for rows, v in sorted(by_rows.items())]
    return "FP8 Q pass / exact step (target <= 0.75), " + "; ".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", default="1,16,32,33")
    ap.add_argument("--system-rows", default="1,33")
    ap.add_argument("--modes", default=",".join(Q_MODES))
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--sweep-rows", default="1,33")
    ap.add_argument("--sweep-s", type=float, default=60.0, help="seconds of the GEMM section that sweep partitions")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--sections", default="gemm,system", help="gemm, system, wgmma_check (its passing kinds: --passed)")
    ap.add_argument(
        "--passed", type=Path, help="wgmma_check: write the warpgroup kinds it passed here, comma-separated"
    )
    ap.add_argument("--kinds", default=",".join(KINDS), help="operand kinds the sweep times")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--tuned-out", type=Path, help="write the tuned table (qpass_fp8_configs.json) after the sweeps")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    result = {**result_header("tlv_fp8_qpass"), "weights": "synthetic: seeded N(0, 0.02) BF16"}
    if args.device == "cpu":  # the dry run: the emulation's pieces at a small shape
        result["dry_run"], result["check"] = True, check_shape(320, 256, "cpu")
    else:
        result["dry_run"] = False
        sections = args.sections.split(",")
        KINDS[:] = args.kinds.split(",")
        if "wgmma_check" in sections:
            result["wgmma_check"] = wgmma_check([kind for kind in WGMMA_KINDS if kind in KINDS])
            if args.passed:
                args.passed.write_text(",".join(result["wgmma_check"]["passed"]))
        if "gemm" in sections:
            result["gemm"] = gemm_section(
                [int(r) for r in args.rows.split(",")],
                args.replays,
                [int(r) for r in args.sweep_rows.split(",")],
                args.sweep_s,
            )
        if args.tuned_out:  # this GPU's sweeps over the table the run started from
            from specpilot_kernels.w12 import qpass_fp8

            table = json.loads(qpass_fp8.TUNED_PATH.read_text()) if qpass_fp8.TUNED_PATH.exists() else {}
            table[torch.cuda.get_device_name()] = tuned_table()
            args.tuned_out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
            result["tuned"] = tuned_table()
        if "system" in sections:
            rows = [int(r) for r in args.system_rows.split(",")]
            result["system"] = system_section(rows, args.context, tuple(args.modes.split(",")))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    if result.get("system"):
        result["headline"] = headline(result["system"])
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
