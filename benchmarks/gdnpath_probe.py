"""GDN path verify against stock on the 27B-like single-request step, interleaved in one process (issue 28's
``gdn_path`` at 0.95x stock).

    PYTHONPATH=kernels:. python benchmarks/gdnpath_probe.py --out gdnpath.json                        # H200
    PYTHONPATH=kernels:. TRITON_INTERPRET=1 python benchmarks/gdnpath_probe.py --device cpu --smoke   # dry run

Variants, each its own SystemModel with one CUDA graph per row count (captured once, then only replayed):
- ``stock``: SGLang's snapshot verify, every layer's accepted snapshot committed in one launch.
- ``path``: GDN path verify + commit as the engine runs it now.
- ``path_before``: the same at main 72fc6e2: every view copied (``torch.split_with_sizes_copy`` clones each split,
  so one row copies too), tree_accept's int64 indices cast inside every layer's commit.
- ``stock_nopdl`` / ``path_nopdl``: stock and path captured with ``SPECPILOT_PDL=0`` (the fused ops without
  programmatic dependent launch; SGLang's kernel keeps its own): how much of the gap is PDL's asymmetry (stock's
  GDN chain is PDL kernels throughout, path's own kernels and copies are not).

Timing: per row count, ``--rounds`` rounds; a round replays every variant ``--iters`` times between CUDA events,
the variants' order rotated each round. Per variant the median over rounds and the first and last rounds; per
round the paired differences to stock. nvidia-smi samples the SM clock, power and temperature under load about
every 250 ms, matched to each round (the thermal suspect). Kernels: torch.profiler over graph replays of stock, path
and path_before at ``--profile-rows``: launches and GPU µs a step per kernel name.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specpilot_mem.engine.options import SystemOptions  # noqa: E402
from specpilot_mem.engine.shapes import get_shape  # noqa: E402
from specpilot_mem.engine.system import Caches, StepBuffers, SystemModel, Weights, pack_trees  # noqa: E402
from specpilot_mem.provenance import print_result, result_header, write_result  # noqa: E402
from system_kernel_probe import LABEL, READ_BW, kineto_tables  # noqa: E402

PDL_OFF = {"stock_nopdl", "path_nopdl"}
PROFILED = ("stock", "path", "path_before")


class PathBefore(SystemModel):
    """The path step as main 72fc6e2 ran it, for the A/B in one process: its two differences, nothing else."""

    @staticmethod
    def _path_inputs(q, k, v, a, b):
        # split_with_sizes_copy without out= is split_with_sizes + a contiguous clone of each split
        return tuple(x.clone(memory_format=torch.contiguous_format) for x in (q, k, v, a, b))

    @staticmethod
    def _commit_indices(accepted, accept_len):
        return accepted, accept_len  # int64: gdn_tree_commit casts them in each layer's call


VARIANTS = {
    "stock": (SystemModel, SystemOptions()),
    "path": (SystemModel, SystemOptions(gdn_verify="path")),
    "path_before": (PathBefore, SystemOptions(gdn_verify="path")),
    "stock_nopdl": (SystemModel, SystemOptions()),
    "path_nopdl": (SystemModel, SystemOptions(gdn_verify="path")),
}


@contextlib.contextmanager
def pdl_setting(off: bool):
    """SPECPILOT_PDL=0 while a variant captures (the fused ops read it at launch; a graph keeps what it captured)."""
    before = os.environ.get("SPECPILOT_PDL")
    if off:
        os.environ["SPECPILOT_PDL"] = "0"
    try:
        yield
    finally:
        if off:
            if before is None:
                os.environ.pop("SPECPILOT_PDL", None)
            else:
                os.environ["SPECPILOT_PDL"] = before


class ClockSampler:
    """nvidia-smi's SM clock, power draw and temperature about every 250 ms from a thread, stamped with time.time()
    (one query a sample: nothing sits in a pipe's buffer when the probe stops it)."""

    FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")

    def __init__(self, enabled: bool):
        self.samples: list[tuple[float, dict]] = []
        self.smi = shutil.which("nvidia-smi") if enabled else None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True) if self.smi else None
        if self.thread:
            self.thread.start()

    def _run(self):
        query = [self.smi, "-i", "0", f"--query-gpu={','.join(self.FIELDS)}", "--format=csv,noheader,nounits"]
        while not self.done.is_set():
            t = time.time()
            try:
                done = subprocess.run(query, capture_output=True, text=True, timeout=5)
                values = [float(v) for v in done.stdout.strip().split(",")]
            except (OSError, subprocess.TimeoutExpired, ValueError):
                values = []
            if len(values) == len(self.FIELDS):
                self.samples.append((t, dict(zip(self.FIELDS, values))))
            self.done.wait(0.25)

    def stop(self) -> list[tuple[float, dict]]:
        if self.thread:
            self.done.set()
            self.thread.join(timeout=10)
        return self.samples


def window_stats(samples, start: float, end: float) -> dict | None:
    """Median of each sampled field between two wall-clock times (None: no sample fell inside)."""
    inside = [s for t, s in samples if start <= t <= end]
    if not inside:
        return None
    return {f: statistics.median(s[f] for s in inside) for f in ClockSampler.FIELDS} | {"samples": len(inside)}


def build(name, weights, rows, shape, device):
    cls, options = VARIANTS[name]
    model = cls(weights, options)
    buf = StepBuffers.empty(1, rows, shape.conv_size, device)
    buf.fill(pack_trees([(list(range(rows)), list(range(-1, rows - 1)))], rows, shape.conv_size))
    buf.forced.fill_(rows - 1)  # the deepest node: the largest commit, as system_bench pins it
    return model, buf


def probe_rows(args, rows, shape, weights, caches, device) -> dict:
    cuda = device.type == "cuda"
    base = torch.full_like(caches.lengths, args.context)
    names = args.variants.split(",")
    models = {}
    t0 = time.perf_counter()
    for name in names:
        model, buf = build(name, weights, rows, shape, device)

        def step(model=model, buf=buf):
            caches.lengths.copy_(base)
            return model.graphed(("gdnpath", rows), lambda: model.step(buf, caches))

        with pdl_setting(name in PDL_OFF):
            step()  # builds kernels, captures the graph
        for _ in range(3):
            step()
        models[name] = (model, step)
    if cuda:
        torch.cuda.synchronize()
    capture_s = round(time.perf_counter() - t0, 1)
    rounds = {n: [] for n in names}
    windows = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        wall0 = time.time()
        for name in order:
            step = models[name][1]
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.iters):
                    step()
                end.record()
                torch.cuda.synchronize()
                rounds[name].append(start.elapsed_time(end) / args.iters)
            else:
                t1 = time.perf_counter()
                for _ in range(args.iters):
                    step()
                rounds[name].append((time.perf_counter() - t1) * 1000 / args.iters)
        windows.append((wall0, time.time()))
    out = {"capture_s": capture_s, "variants": {}, "paired_vs_stock_ms": {}}
    for name, ms in rounds.items():
        out["variants"][name] = {
            "ms": round(statistics.median(ms), 4),
            "first_round_ms": round(ms[0], 4),
            "last_round_ms": round(ms[-1], 4),
            "rounds_ms": [round(x, 4) for x in ms],
        }
    for name, ref in (("path", "stock"), ("path_before", "stock"), ("path_nopdl", "stock_nopdl")):
        if name in rounds and ref in rounds:
            diff = [a - b for a, b in zip(rounds[name], rounds[ref])]
            out["paired_vs_stock_ms"][f"{name}-{ref}"] = {
                "median": round(statistics.median(diff), 4),
                "min": round(min(diff), 4),
                "max": round(max(diff), 4),
                "ratio": round(out["variants"][ref]["ms"] / out["variants"][name]["ms"], 4),
            }
    if "path" in rounds and "path_before" in rounds:
        diff = [a - b for a, b in zip(rounds["path_before"], rounds["path"])]
        out["paired_vs_stock_ms"]["path_before-path"] = {"median": round(statistics.median(diff), 4)}
    out["rounds_wall"] = windows
    if str(rows) in args.profile_rows.split(","):
        activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        out["kernels"], counts = {}, {}
        for name in (n for n in PROFILED if n in models):
            step = models[name][1]
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(args.graph_steps):
                    step()
                if cuda:
                    torch.cuda.synchronize()
            table = kineto_tables(prof, args.graph_steps, cuda)
            counts[name] = {k["name"][:80]: k["count"] for k in table["by_kernel"]}
            table["by_kernel"] = table["by_kernel"][: args.top]
            table.pop("by_part", None)  # graph replays: no launch to attribute a kernel to
            out["kernels"][name] = table
        base_k = out["kernels"].get("stock", {}).get("kernels_per_step")
        out["launches_over_stock"] = {
            n: round(t["kernels_per_step"] - base_k, 2)
            for n, t in out["kernels"].items()
            if base_k is not None and t.get("kernels_per_step") is not None
        }
        # which kernels the extra launches are: launches a step by name, each variant minus stock (nonzero only)
        ref = counts.get("stock", {})
        out["launches_by_kernel_vs_stock"] = {
            n: {
                k: round(c.get(k, 0) - ref.get(k, 0), 2)
                for k in sorted(set(c) | set(ref))
                if c.get(k, 0) != ref.get(k, 0)
            }
            for n, c in counts.items()
            if n != "stock"
        }
    for model, _ in models.values():
        model.release_buffers()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--profile-rows", default="1,8")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--graph-steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=30, help="kernel names kept per table")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    unknown = [n for n in args.variants.split(",") if n not in VARIANTS]
    if unknown or "stock" not in args.variants.split(","):
        raise SystemExit(f"--variants {args.variants!r}: needs stock, from {', '.join(VARIANTS)}")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.smoke:
        args.context = min(args.context, 24)
    shape = get_shape("qwen3.8-27b-like", args.smoke)
    rows_list = [int(r) for r in args.rows.split(",")]
    result = {
        **result_header("gdnpath_probe"),
        "label": LABEL,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "shape": shape.name,
        "smoke": args.smoke,
        "context": args.context,
        "requests": 1,
        "weight_floor_ms": round(shape.weight_floor_ms(READ_BW), 4),
        "variants": {n: VARIANTS[n][1].label() + (", SPECPILOT_PDL=0" if n in PDL_OFF else "") for n in VARIANTS},
        "by_rows": {},
    }
    result["variants"]["path_before"] += " (main 72fc6e2's input copies and per-layer commit casts)"
    t0 = time.perf_counter()
    sampler = ClockSampler(cuda)
    weights = Weights.synthetic(shape, device, torch.bfloat16 if cuda else torch.float32)
    caches = Caches(shape, 1, args.context + max(rows_list) + 8, device, weights.dtype)
    caches.randomize(args.context)
    with torch.no_grad():
        for rows in rows_list:
            try:
                result["by_rows"][str(rows)] = probe_rows(args, rows, shape, weights, caches, device)
            except Exception as exc:  # noqa: BLE001 - one failing row count keeps the others'
                result["by_rows"][str(rows)] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
            entry = result["by_rows"][str(rows)]
            print(f"rows {rows}: {entry.get('paired_vs_stock_ms', entry.get('error'))}", file=sys.stderr, flush=True)
            if args.out:  # each row count recorded as it ends (a stage's time limit keeps the ones before)
                write_result(result, args.out)
    samples = sampler.stop()
    for entry in result["by_rows"].values():
        windows = entry.pop("rounds_wall", [])
        if samples:
            entry["clocks_by_round"] = [window_stats(samples, a, b) for a, b in windows]
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
