"""Where the Q pass's time goes, one request at the 27B-like shapes: the GEMMs against the bytes they read, and the
whole Q pass against its GEMMs.

Per shape (qkv, gate_up, down, lm_head) and row count (1, 16, 32, 33), under CUDA-graph replay over rotating copies larger
than L2 (``cuda_timing.graph_replay_us``):

- the **floor**: a plain streaming read of the view plane alone, and of both planes (what the exact pass reads);
- the exact W12 CUDA kernel; its Q mode (midpoint, truncated) with the exact partition, the untuned default, and
  two partitions with more warps (twice the K splits; twice the warps a tile);
- the Triton Q pass (``w12_qpass_gemm``, default partition).

Then the system engine (27B-like, synthetic weights, 1,024-token context): the draft, the exact step and the Q pass
(the CUDA Q mode hook) at 1, 32 and 33 rows, the cycle (two drafts, Q pass, exact step) against a single-pass step, each one CUDA graph, the projections of a forward alone in each mode (``gemm``), the LM
head alone, and the rest (norms, GDN and attention kernels, conv, glue) as pass - gemm - head; and a kernel table of
one eager Q pass (torch.profiler, top kernels by device time).

    PYTHONPATH=kernels:. python benchmarks/tlv_qpass_probe.py --out FILE          # H200
    PYTHONPATH=kernels:. python benchmarks/tlv_qpass_probe.py --device cpu --smoke  # dry run (no timing)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot_mem.bench.cuda_timing import graph_replay_us  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

SHAPES = {"qkv": (10240, 5120), "gate_up": (34816, 5120), "down": (5120, 17408), "lm_head": (248320, 5120)}
TINY_SHAPES = {"qkv": (320, 256)}
L2_BYTES = 60 * 2**20
STREAM_BLOCK = 4096  # int32 words a program step: 16 KB in flight a program


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


@triton.jit
def _stream_kernel(ptr, out_ptr, n_words, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    """Read ITERS x BLOCK words once (evict first) and keep their xor: the bandwidth a reader of these bytes gets."""
    pid = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for i in range(ITERS):
        offs = (pid * ITERS + i).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc ^= tl.load(ptr + offs, mask=offs < n_words, other=0, eviction_policy="evict_first")
    tl.store(out_ptr + pid, tl.xor_sum(acc, 0))


def stream(planes: list[torch.Tensor], sink: torch.Tensor) -> None:
    for plane in planes:
        words = plane.view(-1).view(torch.int32)
        iters = 8
        grid = triton.cdiv(words.numel(), iters * STREAM_BLOCK)
        _stream_kernel[(grid,)](words, sink, words.numel(), ITERS=iters, BLOCK=STREAM_BLOCK, num_warps=8)


def gemm_section(shapes: dict, rows: list[int], replays: int, cuda: bool) -> dict:
    out = {}
    for name, (n, k) in shapes.items():
        out[name] = bench_shape(name, n, k, rows, replays, cuda)
        if cuda:
            torch.cuda.empty_cache()
    return out


def bench_shape(name: str, n: int, k: int, rows: list[int], replays: int, cuda: bool) -> dict:
    from specpilot_kernels.w12 import encode, to_mma_layout, w12_mma_gemm
    from specpilot_kernels.w12.format import W12Error
    from specpilot_kernels.w12.mma import default_mma_config, select_mma_config
    from specpilot_kernels.w12.qpass import qpass_gemm_reference, w12_qpass_gemm

    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    copies = max(2, math.ceil(2 * L2_BYTES / (n * k))) if cuda else 1
    mmas = [to_mma_layout(encode((torch.randn(n, k, device=device) * 0.02).bfloat16())) for _ in range(copies)]
    view_bytes = mmas[0].view.numel()
    plane_bytes = view_bytes + mmas[0].nibbles.numel()
    sink = torch.empty(1 << 20, dtype=torch.int32, device=device)
    entry = {"N": n, "K": k, "copies": copies, "view_bytes": view_bytes, "planes_bytes": plane_bytes}
    if not cuda:  # the dry run: each kernel once, no figure
        stream([mmas[0].view], sink)
        w12_qpass_gemm(torch.randn(2, k).bfloat16(), mmas[0])
        return entry

    def timed(fn):
        return graph_replay_us(fn, copies=copies, replays=replays)

    entry["stream_view_us"] = timed(lambda i: stream([mmas[i].view], sink))
    entry["stream_planes_us"] = timed(lambda i: stream([mmas[i].view, mmas[i].nibbles], sink))
    entry["stream_view_TBps"] = view_bytes / entry["stream_view_us"] / 1e6
    entry["stream_planes_TBps"] = plane_bytes / entry["stream_planes_us"] / 1e6
    # correctness first: the CUDA Q mode against the fp32 reference of its weights, and one-hot rows (single weights)
    x16 = torch.randn(16, k, device=device).bfloat16()
    for low_bits in ("midpoint", "truncated"):
        ref = qpass_gemm_reference(x16, mmas[0], low_bits)
        got = w12_mma_gemm(x16, mmas[0], low_bits=low_bits).float()
        entry[f"cuda_q_{low_bits}_rel_err"] = ((got - ref).norm() / ref.norm()).item()
    cols = torch.arange(0, k, max(1, k // 16), device=device)[:16]
    onehot = torch.zeros(cols.numel(), k, device=device, dtype=torch.bfloat16)
    onehot[torch.arange(cols.numel(), device=device), cols] = 1.0
    expected = qpass_gemm_reference(onehot, mmas[0], "midpoint").bfloat16().float()
    entry["cuda_q_one_hot_equal_values"] = torch.equal(
        w12_mma_gemm(onehot, mmas[0], low_bits="midpoint").float(), expected
    )
    log(name, {key: value for key, value in entry.items() if key.startswith("cuda_q")})
    default = default_mma_config(n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    tuned = select_mma_config(n, k, mmas[0].device)
    # more warps in flight for the same bytes: the Q mode streams 2/3 of the exact pass's bytes a step
    wider = {}
    for label, change in (
        ("splits2x", {"splits": 2 * tuned.splits}),
        ("warps_k2x", {"warps_k": min(16 // tuned.warps_n, 2 * tuned.warps_k), "shared_x_32": (0, 0)}),
    ):
        try:
            wider[label] = replace(tuned, **change)
        except W12Error as err:
            entry[f"skipped_{label}"] = str(err)[:200]
    entry["rows"] = []
    for m in rows:
        x = torch.randn(m, k, device=device).bfloat16()
        row = {
            "M": m,
            "exact_us": timed(lambda i, x=x: w12_mma_gemm(x, mmas[i])),
            "cuda_q_midpoint_us": timed(lambda i, x=x: w12_mma_gemm(x, mmas[i], low_bits="midpoint")),
            "cuda_q_truncated_us": timed(lambda i, x=x: w12_mma_gemm(x, mmas[i], low_bits="truncated")),
            "cuda_q_midpoint_default_config_us": timed(
                lambda i, x=x: w12_mma_gemm(x, mmas[i], low_bits="midpoint", config=default)
            ),
            "triton_q_midpoint_us": timed(lambda i, x=x: w12_qpass_gemm(x, mmas[i], "midpoint")),
        }
        for label, config in wider.items():
            row[f"cuda_q_midpoint_{label}_us"] = timed(
                lambda i, x=x, config=config: w12_mma_gemm(x, mmas[i], low_bits="midpoint", config=config)
            )
        row["exact_TBps"] = plane_bytes / row["exact_us"] / 1e6
        row["cuda_q_TBps"] = view_bytes / row["cuda_q_midpoint_us"] / 1e6
        row["triton_q_TBps"] = view_bytes / row["triton_q_midpoint_us"] / 1e6
        row["floor_q_over_exact"] = entry["stream_view_us"] / row["exact_us"]
        entry["rows"].append(row)
        log(name, row)
    return entry


def system_section(smoke: bool, cuda: bool, context: int, rows_list: list[int]) -> dict:
    from system_bench import Timer, step_trees
    from tlv_cycle_bench import EXACT

    from specpilot_mem.engine.shapes import get_shape
    from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees

    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    timer = Timer(device, 10 if cuda else 1, bursts=5 if cuda else 1)
    shape = get_shape("qwen3.8-27b-like", smoke)
    weights = Weights.synthetic(shape, device, dtype)
    caches = Caches(shape, 1, context + max(rows_list) + 8, device, dtype)
    caches.randomize(context)
    model = SystemModel(weights, EXACT)
    q_mode = "q8_midpoint" if cuda else None  # the CPU has no Q mode of the CUDA kernel: the dry run times w12
    out = {}
    for rows in rows_list:
        out[f"rows={rows}"] = system_rows(model, caches, rows, context, timer, q_mode)
    out["stock"] = stock_step(weights, caches, context, timer)
    if cuda:  # one eager Q pass under the profiler: the kernels by device time
        rows = rows_list[-1]
        buf = StepBuffers.empty(1, rows, shape.conv_size, device)
        trees, _ = step_trees(1, rows, True, shape.vocab_size)
        buf.fill(pack_trees(trees, rows, shape.conv_size))
        caches.lengths.fill_(context)

        def qpass():
            h, _, _ = model.forward(buf, caches, write_cache=False, linear_mode=q_mode)
            return weights.head_linear()(h, q_mode).argmax(-1)

        qpass()
        torch.cuda.synchronize()
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            qpass()
            torch.cuda.synchronize()
        table = []
        for ev in prof.key_averages():
            us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if us:
                table.append({"kernel": ev.key[:120], "calls": ev.count, "us": round(us, 1)})
        table.sort(key=lambda r: -r["us"])
        out["qpass_kernels_eager"] = {
            "rows": rows,
            "total_us": round(sum(r["us"] for r in table), 1),
            "top": table[:30],
        }
    return out


def stock_step(weights, caches, context: int, timer) -> dict:
    """Stock's step for the model's "over stock": one draft, the BF16 chain of 16 positions and its anchor."""
    from system_bench import time_draft, time_model

    from specpilot_mem.engine.options import SystemOptions
    from specpilot_mem.engine.system import SystemModel

    stock = SystemModel(weights, SystemOptions())
    entry = {
        "rows": stock.options.rows,
        "draft_ms": time_draft(stock, 1, timer),
        "step_ms": time_model(stock, caches, 1, stock.options.rows, context, timer),
    }
    stock.release_buffers()
    return entry


def system_rows(model, caches, rows: int, context: int, timer, q_mode: str | None) -> dict:
    """The exact step, the Q pass, and each one's projections and LM head alone, at ``rows`` rows."""
    from tlv_cycle_bench import time_qpass

    from system_bench import time_draft, time_model

    shape, weights, device, dtype = model.shape, model.w, model.device, model.dtype
    gen = torch.Generator(device=device).manual_seed(5)
    inputs = {
        name: torch.randn(rows, n_in, generator=gen, device=device).to(dtype)
        for name, (_, n_in) in shape.linear_shapes().items()
    }
    hidden = torch.randn(rows, shape.d_model, generator=gen, device=device).to(dtype)

    def gemms(mode):
        for i, kind in enumerate(shape.layer_types):
            for name in shape.layer_linears(kind):
                weights.lin(f"layers.{i}.{name}.w")(inputs[name], mode)

    entry = {"rows": rows}
    entry["draft_ms"] = time_draft(model, 1, timer)
    entry["exact_step_ms"] = time_model(model, caches, 1, rows, context, timer)
    entry["qpass_ms"] = time_qpass(model, caches, rows, context, timer, q_mode)
    for label, mode in (("exact", "w12"), ("q", q_mode or "w12")):
        entry[f"{label}_gemm_ms"] = timer.ms(lambda mode=mode: model.graphed(("gemm", mode), lambda: gemms(mode)))
        entry[f"{label}_head_ms"] = timer.ms(
            lambda mode=mode: model.graphed(("head", mode), lambda: weights.head_linear()(hidden, mode))
        )
    if q_mode and q_mode.startswith("fp8_"):
        entry["q_quantize_ms"] = timer.ms(lambda: model.graphed(("quantize", rows), quantizer(shape, inputs)))
    model.release_buffers()
    entry["exact_rest_ms"] = entry["exact_step_ms"] - entry["exact_gemm_ms"] - entry["exact_head_ms"]
    entry["q_rest_ms"] = entry["qpass_ms"] - entry["q_gemm_ms"] - entry["q_head_ms"]
    entry["q_over_exact"] = entry["qpass_ms"] / entry["exact_step_ms"]
    # a TLV cycle (two drafts, the Q pass, the exact step) against a single-pass step (one draft, the exact step)
    entry["cycle_ms"] = 2 * entry["draft_ms"] + entry["qpass_ms"] + entry["exact_step_ms"]
    entry["cycle_over_single"] = entry["cycle_ms"] / (entry["draft_ms"] + entry["exact_step_ms"])
    log("system", entry)
    return entry


def quantizer(shape, inputs: dict):
    """The FP8 Q pass's activation quantizer alone, once per linear of a forward (in the pass's order, launched as
    the GEMMs launch it): its share of the Q pass's GEMM time."""
    from specpilot_kernels.cuda_extension import load_cuda_extension
    from specpilot_kernels.w12.qpass_fp8 import CSRC, EXTENSION, SOURCES

    ext = load_cuda_extension(EXTENSION, CSRC, SOURCES)
    rows = next(iter(inputs.values())).shape[0]
    kp = max(-(-x.shape[1] // 128) * 128 for x in inputs.values())
    image = torch.empty(-(-rows // 8) * 8 * kp, dtype=torch.uint8, device=next(iter(inputs.values())).device)
    scale = torch.empty(rows, dtype=torch.float32, device=image.device)

    def run():
        for kind in shape.layer_types:
            for name in shape.layer_linears(kind):
                x = inputs[name]
                ext.quantize_rows(x, image, scale, -(-x.shape[1] // 128) * 128, True)

    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rows", default="1,16,32,33")  # 32: a 31-node tree and its root, the 4-token-tile kernels
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--sections", default="gemm,system")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    rows = [int(r) for r in args.rows.split(",")]
    started = time.perf_counter()
    result = {**result_header("tlv_qpass_probe"), "weights": "synthetic: seeded N(0, 0.02) BF16", "dry_run": not cuda}
    sections = args.sections.split(",")
    if "gemm" in sections:
        result["gemm"] = gemm_section(SHAPES if cuda else TINY_SHAPES, rows, args.replays, cuda)
    if "system" in sections:
        result["system"] = system_section(
            args.smoke or not cuda, cuda, args.context if cuda else 16, [1, *rows[-2:]] if cuda else [1, 3]
        )
    result["wall_s"] = round(time.perf_counter() - started, 1)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
