"""What the run-level benchmarks share: progress lines on stderr (stdout carries the JSON document), the
request subset a paired run measures, and whole commands timed in fresh processes."""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from specpilot_mem.controller.requests import load_requests


def log(*parts) -> None:
    """A progress line on stderr, flushed at once (a device call's log shows how far a run got)."""
    print(*parts, file=sys.stderr, flush=True)


def pick_requests(args) -> list:
    """The first ``args.per_benchmark`` requests of each benchmark in ``args.split`` of ``args.requests``, each
    capped at ``args.max_new_tokens``."""
    taken: dict[str, int] = defaultdict(int)
    picked = []
    for request in load_requests(args.requests, split=args.split):
        if taken[request.benchmark] < args.per_benchmark:
            taken[request.benchmark] += 1
            picked.append(dataclasses.replace(request, max_new_tokens=min(request.max_new_tokens, args.max_new_tokens)))
    return picked


def checkout_environment(root: Path, **extra: str) -> dict[str, str]:
    """This process's environment with the checkout at ``root`` (and its ``kernels/``) first on the path, as the
    tests and benchmarks run it, and ``extra`` variables set."""
    paths = [str(root), str(root / "kernels"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **extra}


def fresh_process_times(command: list[str], repeats: int, env: dict[str, str]) -> dict:
    """Median and max wall seconds and median CPU seconds (the child's user + system) of ``command`` over
    ``repeats`` fresh processes, after one untimed run that warms the file cache and the bytecode."""
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall, cpu = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True)
        wall.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return {
        "median_s": round(statistics.median(wall), 3),
        "max_s": round(max(wall), 3),
        "median_cpu_s": round(statistics.median(cpu), 3),
        "repeats": repeats,
    }
