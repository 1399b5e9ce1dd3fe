"""The TLV cycle's passes in the system engine at the 27B-like shape, one request: the Q pass (the whole forward —
GDN layers, attention over the cache, MLPs and the LM head — with every W12 linear read from its 8-bit view by
``w12_qpass_gemm``, caches left as they are; also through the engine's own ``linear_mode="q8_midpoint"`` hook, the
CUDA kernels' Q mode) against the exact W12 pass (verify + accept + commit), and the draft.

    PYTHONPATH=kernels:. python benchmarks/tlv_cycle_bench.py --out FILE          # H200
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python benchmarks/tlv_cycle_bench.py --device cpu --smoke   # dry run

cycle = 2 drafts + Q pass + exact step; single-pass step = 1 draft + exact step (both over the N = 32 tree and its
root); the host-side tree build between the passes is not timed. Synthetic weights (seeded N(0, 0.02)); times are
CUDA-event medians of bursts, each pass one CUDA graph (``benchmarks/system_bench.py``'s Timer and step helpers).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from system_bench import Timer, step_trees, time_draft, time_model  # noqa: E402

from specpilot_mem.engine.options import SystemOptions  # noqa: E402
from specpilot_mem.engine.shapes import get_shape  # noqa: E402
from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees  # noqa: E402
from specpilot_mem.provenance import print_result, result_header  # noqa: E402

EXACT = SystemOptions(linears="w12", lm_head="w12", gdn_verify="path", tree="best-first", nodes=32)


class QpassLinear:
    """A system-engine linear read as the Q pass reads it: the 8-bit view of its own W12 record (no copy)."""

    def __init__(self, linear, low_bits: str = "midpoint"):
        self.linear, self.low_bits = linear, low_bits

    def __call__(self, x, mode: str = "w12"):
        from specpilot_kernels.w12 import qpass_linear
        from specpilot_kernels.w12.qpass import w12_qpass_gemm

        self.linear._convert()  # the linear's own W12 form, made once (the exact pass reads the same records)
        if x.is_cuda and x.dtype == torch.bfloat16:
            flat = x.reshape(-1, x.shape[-1])
            out = w12_qpass_gemm(flat if flat.stride(-1) == 1 else flat.contiguous(), self.linear._mma, self.low_bits)
            return out.reshape(*x.shape[:-1], out.shape[-1])
        return qpass_linear(x.to(torch.bfloat16), self.linear._w12, self.low_bits).to(x.dtype)  # CPU dry run (fp32)

    @property
    def nbytes(self) -> int:
        return self.linear.nbytes


def qpass_view(weights: Weights, low_bits: str) -> Weights:
    """The same weights (every tensor shared) whose linears and LM head are read through their 8-bit views."""
    weights.head_linear()
    view = copy.copy(weights)
    view.linears = {name: QpassLinear(linear, low_bits) for name, linear in weights.linears.items()}
    return view


def time_qpass(
    qmodel: SystemModel, caches: Caches, rows: int, context: int, timer: Timer, linear_mode: str | None = None
) -> float:
    """ms of the Q pass over a ``rows``-row tree: forward without cache writes, the head's argmax, acceptance.
    ``linear_mode`` "q8_midpoint": the engine's own hook (the W12 CUDA kernels' Q mode) instead of ``qmodel``'s
    linears."""
    shape = qmodel.shape
    buf = StepBuffers.empty(1, rows, shape.conv_size, qmodel.device)
    trees, _ = step_trees(1, rows, True, shape.vocab_size)
    buf.fill(pack_trees(trees, rows, shape.conv_size))
    caches.lengths.fill_(context)

    def qpass():
        hidden, _, _ = qmodel.forward(buf, caches, write_cache=False, linear_mode=linear_mode)
        logits = qmodel.w.head_linear()(hidden, linear_mode or "w12")
        return qmodel.accept(buf, logits.argmax(-1).view(1, rows))

    ms = timer.ms(lambda: qmodel.graphed(("qpass", rows, linear_mode), qpass))
    qmodel.release_buffers()
    return ms


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="the shapes' smoke versions (CPU dry run)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rows", type=int, default=33, help="a 32-node tree and its root")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    timer = Timer(device, args.iters if device.type == "cuda" else 1, bursts=5 if device.type == "cuda" else 1)
    shape = get_shape("qwen3.8-27b-like", args.smoke)
    result = {
        **result_header("tlv_cycle_bench"),
        "shape": shape.to_dict(),
        "context": args.context,
        "rows": args.rows,
        "weights": "synthetic: seeded N(0, 0.02)",
        "dry_run": device.type != "cuda",
    }
    started = time.perf_counter()
    weights = Weights.synthetic(shape, device, dtype)
    caches = Caches(shape, 1, args.context + args.rows + 8, device, dtype)
    caches.randomize(args.context)
    exact = SystemModel(weights, EXACT)
    result["T_draft_ms"] = time_draft(exact, 1, timer)
    result["T_exact_step_ms"] = time_model(exact, caches, 1, args.rows, args.context, timer)
    qmodel = SystemModel(qpass_view(weights, "midpoint"), EXACT)
    result["T_qpass_ms"] = time_qpass(qmodel, caches, args.rows, args.context, timer)
    result["q_over_exact_step"] = result["T_qpass_ms"] / result["T_exact_step_ms"]
    if device.type == "cuda":  # the engine's hook: the W12 CUDA kernels' own Q mode
        result["T_qpass_cuda_q8_ms"] = time_qpass(exact, caches, args.rows, args.context, timer, "q8_midpoint")
    result["T_cycle_ms"] = 2 * result["T_draft_ms"] + result["T_qpass_ms"] + result["T_exact_step_ms"]
    result["T_single_step_ms"] = result["T_draft_ms"] + result["T_exact_step_ms"]
    result["cycle_over_single"] = result["T_cycle_ms"] / result["T_single_step_ms"]
    result["break_even_tau_ratio"] = result["cycle_over_single"]
    result["headline"] = (
        f"27B-like, 1 request, {args.rows} rows: Q pass {result['T_qpass_ms']:.2f} ms vs exact step "
        f"{result['T_exact_step_ms']:.2f} ms ({result['q_over_exact_step']:.2f}x); cycle "
        f"{result['T_cycle_ms']:.2f} ms = {result['cycle_over_single']:.2f}x a single-pass step"
    )
    if qmodel.graph_error or exact.graph_error:
        result["graph_error"] = qmodel.graph_error or exact.graph_error
    result["wall_s"] = time.perf_counter() - started
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
