"""What the GPU kernel benchmarks share: CUDA-graph replay timing (the method every committed GPU figure
uses) and sections that survive each other's failures, so one device call keeps every figure it got.

A graph that makes ``calls`` calls (``fn_for_copy(i % copies)``, so rotating weight copies larger than
L2 are each read cold) is captured after one warm-up on a side stream, replayed once, then timed by CUDA
events over ``replays`` replays; the median replay divided by ``calls`` is the figure.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable

import torch


def graph_replay_us(fn_for_copy: Callable[[int], object], copies: int = 1, calls: int | None = None,
                    replays: int = 20) -> float:
    """Median µs per call of ``fn_for_copy`` under CUDA-graph replay (``calls`` defaults to ``copies``)."""
    calls = calls or copies
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(calls):
            fn_for_copy(i % copies)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn_for_copy(i % copies)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def record_section(result: dict, name: str, run: Callable[[], object], out: str | None) -> None:
    """``result[name] = run()``, or the error it raised; echoed to stderr and saved to ``out`` at once."""
    try:
        result[name] = run()
    except Exception as exc:
        result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=1)
