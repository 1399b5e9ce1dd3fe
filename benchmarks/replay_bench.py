"""Benchmark of exact replay on the CPU (issue 5). Prints JSON.

1. Best-first build of a 32-node tree (depth cap 15) from a 16-position x 16-candidate lattice,
   amortized per request-step over batches of steps (target <= 50 µs).
2. Exact replay of a 100,000-step lattice set by one builder at one node budget (target <= 10 s);
   also reported per replayed step and extrapolated to 100,000 replayed steps.

Lattices are SYNTHETIC (specpilot_mem.replay.synthetic, default statistics). Timings give wall
clock and this process's CPU time: on a shared machine the wall clock includes waiting for a core,
so the load average is reported too.

    python benchmarks/replay_bench.py [--build-steps 16384] [--replay-steps 100000] [--builder best-first] [--nodes 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from specpilot_mem.provenance import print_result, result_header
from specpilot_mem.replay.replay import builder_options, replay
from specpilot_mem.replay.synthetic import SyntheticSpec, generate
from specpilot_mem.replay.trees import get_builder
from specpilot_mem.replay.trees.base import StepBatch


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def bench_build(steps: int, batch: int, nodes: int, depth_cap: int, repeats: int) -> dict:
    lat = generate(SyntheticSpec(requests=max(1, steps // 512), length=512, positions=16, candidates=16, seed=1))
    build = get_builder("best-first")
    walls, cpus = [], []
    for _ in range(repeats):
        wall = cpu = 0.0
        for lo in range(0, lat.num_steps, batch):
            ids = np.arange(lo, min(lo + batch, lat.num_steps))
            sb = StepBatch.from_lattice(lat, ids, with_greedy=False)
            trees, w, c = timed(lambda sb=sb: build(sb, nodes, depth_cap))
            wall, cpu = wall + w, cpu + c
        walls.append(wall / lat.num_steps * 1e6)
        cpus.append(cpu / lat.num_steps * 1e6)
    return {
        "what": "best-first build",
        "nodes": nodes,
        "depth_cap": depth_cap,
        "positions": 16,
        "candidates": 16,
        "request_steps": lat.num_steps,
        "batch": batch,
        "repeats": repeats,
        "us_per_step_wall_median": statistics.median(walls),
        "us_per_step_wall_min": min(walls),
        "us_per_step_cpu_median": statistics.median(cpus),
        "us_per_step_cpu_min": min(cpus),
        "mean_nodes": float(trees.num_nodes.mean()),
        "target_us": 50.0,
    }


def bench_replay(steps: int, builder: str, nodes: int, requests: int) -> dict:
    lat = generate(SyntheticSpec(requests=requests, length=steps // requests, positions=16, candidates=16, seed=2))
    options = builder_options(builder, [lat])
    (replayed, tokens), wall, cpu = timed(lambda: replay(lat, builder, nodes, None, 1, options))
    done = int(replayed.sum())
    return {
        "what": "exact replay",
        "builder": builder,
        "nodes": nodes,
        "lattice_steps": lat.num_steps,
        "requests": requests,
        "replayed_steps": done,
        "tau": float(tokens.sum() / done),
        "seconds_wall": wall,
        "seconds_cpu": cpu,
        "us_per_replayed_step_wall": wall / done * 1e6,
        "us_per_replayed_step_cpu": cpu / done * 1e6,
        "seconds_wall_per_100k_replayed_steps": wall / done * 1e5,
        "seconds_cpu_per_100k_replayed_steps": cpu / done * 1e5,
        "target_s": 10.0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-steps", type=int, default=16384)
    ap.add_argument("--build-batch", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--replay-steps", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--builder", default="best-first")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    result = {
        **result_header("replay_bench"),
        "synthetic": True,
        "numpy": np.__version__,
        "load_average_before": os.getloadavg(),
        "build": bench_build(args.build_steps, args.build_batch, args.nodes, 15, args.repeats),
        "replay": bench_replay(args.replay_steps, args.builder, args.nodes, args.requests),
        "load_average_after": os.getloadavg(),
    }
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
