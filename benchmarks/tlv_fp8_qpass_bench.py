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
    PYTHONPATH=kernels:. python benchmarks/tlv_fp8_qpass_bench.py --write-configs FILE # its sweeps -> the tuned table
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
    from specpilot_kernels.w12.qpass_fp8 import TILES_PER_WARP, select_fp8_qpass_config, tiles_per_warp_fits

    for low_bits in ("midpoint", "truncated"):
        ref = fp8_qpass_reference(x, w12, low_bits)
        got = w12_fp8_qpass_gemm(x, mma, low_bits).float()
        out[f"{low_bits}_rel_err_vs_emulation"] = rel_err(got, ref)
        out[f"{low_bits}_rel_err_vs_bf16_q"] = rel_err(got, x.float() @ qpass_weight(w12, low_bits).t())
        config = select_fp8_qpass_config(n, k, x.device, 33, low_bits == "midpoint")
        for r in TILES_PER_WARP:  # every built tiles-a-warp, the default's K split
            if tiles_per_warp_fits(33, r, low_bits == "midpoint"):
                other = replace(config, tiles_per_warp=r)
                bits = w12_fp8_qpass_gemm(x, mma, low_bits, config=other)
                out[f"{low_bits}_tiles_per_warp{r}_rel_err_vs_emulation"] = rel_err(bits, ref)
                one = w12_fp8_qpass_gemm(x[5:6].contiguous(), mma, low_bits, config=replace(other, tiles_per_warp=1))
                out[f"{low_bits}_tiles_per_warp{r}_row_bits_same_at_1_row"] = torch.equal(one, bits[5:6])
    cols = torch.arange(0, k, max(1, k // 16), device=device)[:16]
    onehot = torch.zeros(cols.numel(), k, device=device, dtype=torch.bfloat16)
    onehot[torch.arange(cols.numel(), device=device), cols] = 1.0
    expected = fp8_qpass_reference(onehot, w12, "midpoint").bfloat16()
    out["one_hot_equal_values"] = torch.equal(w12_fp8_qpass_gemm(onehot, mma, "midpoint"), expected)
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
    all shapes (an equal share each)."""
    out = {}
    shapes = engine_shapes()
    for name, (n, k) in shapes.items():
        out[name] = {"N": n, "K": k, "check": check_shape(n, k, "cuda")}
        log(name, out[name]["check"])
        sweep_until = time.perf_counter() + sweep_s / len(shapes)
        out[name].update(time_shape(name, n, k, rows, replays, sweep_rows, sweep_until))
        torch.cuda.empty_cache()
    return out


def sweep_configs(n: int, k: int, m: int, midpoint: bool) -> list:
    """Partitions beside the default: every built tiles-a-warp x (warps a K x 4- or 8-warp blocks, one block a K;
    the K-split partition and twice its splits)."""
    from specpilot_kernels.w12.qpass_fp8 import TILES_PER_WARP, Fp8QpassConfig, fp8_qpass_partition
    from specpilot_kernels.w12.qpass_fp8 import tiles_per_warp_fits

    pairs = -(-k // 128) * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    configs = []
    for r in TILES_PER_WARP:
        if not tiles_per_warp_fits(m, r, midpoint):
            continue
        split = fp8_qpass_partition(n, k, sms, r)
        more = replace(split, splits=2 * split.splits) if pairs // (2 * split.splits * split.warps_k) >= 2 else split
        for config in [Fp8QpassConfig(wk, max(1, b // wk), r) for wk in (1, 2, 4, 8) for b in (4, 8)] + [split, more]:
            if config not in configs and pairs // (config.warps_k * config.splits) >= 2:
                configs.append(config)
    return configs


def label(config) -> str:
    return f"r{config.tiles_per_warp}_wk{config.warps_k}_g{config.groups_per_block}_s{config.splits}"


def parse_label(text: str):
    from specpilot_kernels.w12.qpass_fp8 import Fp8QpassConfig

    r, wk, g, splits = (int(part[1:] if part[0] != "w" else part[2:]) for part in text.split("_"))
    return Fp8QpassConfig(warps_k=wk, groups_per_block=g, tiles_per_warp=r, splits=splits)


def write_configs(result_path: Path, table_path: Path) -> dict:
    """The fastest truncated partition of each swept (shape, row count) in a result of this bench (the default's
    time included) into the tuned table, under the result's GPU; other GPUs' entries are kept."""
    from specpilot_kernels.w12.qpass_fp8 import tuned_key

    result = json.loads(result_path.read_text())
    table = json.loads(table_path.read_text()) if table_path.exists() else {}
    mine = table.setdefault(result["device"]["name"], {})
    for shape in result["gemm"].values():
        for row in shape["rows"]:
            if "sweep_truncated_us" not in row:
                continue
            times = {**row["sweep_truncated_us"], row["fp8_q_truncated_config"]: row["fp8_q_truncated_us"]}
            best = parse_label(min(times, key=times.get))
            mine.setdefault(f"{shape['N']},{shape['K']}", {})[tuned_key(row["M"], False)] = vars(best)
    table_path.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return table


def time_shape(
    name: str, n: int, k: int, rows: list[int], replays: int, sweep_rows: list[int], sweep_until: float
) -> dict:
    from specpilot_kernels.w12 import encode, to_mma_layout, w12_mma_gemm
    from specpilot_kernels.w12.qpass_fp8 import select_fp8_qpass_config, w12_fp8_qpass_gemm

    from specpilot_mem.bench.cuda_timing import graph_replay_us

    copies = max(2, math.ceil(2 * L2_BYTES / (n * k)))
    torch.manual_seed(0)
    mmas = [to_mma_layout(encode((torch.randn(n, k, device="cuda") * 0.02).bfloat16())) for _ in range(copies)]
    entry = {"copies": copies, "rows": []}
    view_bytes, plane_bytes = mmas[0].view.numel(), mmas[0].view.numel() + mmas[0].nibbles.numel()

    def timed(fn, replays=replays):
        return graph_replay_us(fn, copies=copies, replays=replays)

    for m in rows:
        x = torch.randn(m, k, device="cuda").bfloat16()
        row = {"M": m, "exact_us": timed(lambda i, x=x: w12_mma_gemm(x, mmas[i]))}
        for low_bits in ("midpoint", "truncated"):
            config = select_fp8_qpass_config(n, k, x.device, m, low_bits == "midpoint")
            row[f"fp8_q_{low_bits}_config"] = label(config)
            row[f"fp8_q_{low_bits}_us"] = timed(lambda i, x=x, lb=low_bits: w12_fp8_qpass_gemm(x, mmas[i], lb))
            row[f"fp8_q_{low_bits}_over_exact"] = row[f"fp8_q_{low_bits}_us"] / row["exact_us"]
        row["exact_TBps"] = plane_bytes / row["exact_us"] / 1e6
        row["fp8_q_truncated_TBps"] = view_bytes / row["fp8_q_truncated_us"] / 1e6
        if m in sweep_rows and time.perf_counter() < sweep_until:
            row["sweep_truncated_us"] = sweep = {}
            for c in sweep_configs(n, k, m, False):
                try:
                    sweep[label(c)] = timed(
                        lambda i, x=x, c=c: w12_fp8_qpass_gemm(x, mmas[i], "truncated", config=c), replays // 2
                    )
                except RuntimeError as err:  # a partition that does not launch: recorded, not fatal
                    row.setdefault("sweep_errors", {})[label(c)] = str(err)[:200]
            best = min(sweep, key=sweep.get)
            row["sweep_truncated_best"] = best
            row["sweep_truncated_best_over_exact"] = sweep[best] / row["exact_us"]
        entry["rows"].append(row)
        log(
            name,
            {key: round(v, 3) if isinstance(v, float) else v for key, v in row.items() if key != "sweep_truncated_us"},
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
    ap.add_argument("--sweep-s", type=float, default=20.0, help="seconds of the GEMM section that sweep partitions")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--sections", default="gemm,system")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--write-configs", type=Path, metavar="RESULT", help="tune: a result's sweeps -> the table")
    args = ap.parse_args(argv)
    if args.write_configs:
        from specpilot_kernels.w12.qpass_fp8 import TUNED_PATH

        print(json.dumps(write_configs(args.write_configs, TUNED_PATH), indent=1))
        return 0
    started = time.perf_counter()
    result = {**result_header("tlv_fp8_qpass"), "weights": "synthetic: seeded N(0, 0.02) BF16"}
    if args.device == "cpu":  # the dry run: the emulation's pieces at a small shape
        result["dry_run"], result["check"] = True, check_shape(320, 256, "cpu")
    else:
        result["dry_run"] = False
        sections = args.sections.split(",")
        if "gemm" in sections:
            result["gemm"] = gemm_section(
                [int(r) for r in args.rows.split(",")],
                args.replays,
                [int(r) for r in args.sweep_rows.split(",")],
                args.sweep_s,
            )
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
