"""What the GPU kernel benchmarks share: CUDA-graph replay timing (the method every committed GPU figure
uses) and sections that survive each other's failures, so one device call keeps every figure it got.

A graph that makes ``calls`` calls (``fn_for_copy(i % copies)``, so rotating weight copies larger than
L2 are each read cold) is captured after one warm-up on a side stream, replayed once, then timed by CUDA
events over ``replays`` replays; the median replay divided by ``calls`` is the figure.

Such a burst starts at whatever SM clock the GPU is at. Under sustained load an H200 holds its 700 W cap by
lowering the SM clock, by how much depending on the kernel's power (W12's kernels at 16-64 rows: to 1.44-1.87 GHz;
cuBLAS's BF16 GEMV: hardly). ``settle_s`` replays the graph that long before timing, so the figure is the kernel's pace at the clock
its own power settles at; :class:`ClockLog` records the SM clock, power and throttle reasons over any window.
``read_bandwidth`` is the streaming-read rate the byte floors divide by.
"""

from __future__ import annotations

import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from specpilot_mem.provenance import write_result


def graph_replay_us(
    fn_for_copy: Callable[[int], object],
    copies: int = 1,
    calls: int | None = None,
    replays: int = 20,
    settle_s: float = 0.0,
) -> float:
    """Median µs per call of ``fn_for_copy`` under CUDA-graph replay (``calls`` defaults to ``copies``), timed after
    ``settle_s`` seconds of untimed replays."""
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
    settled = time.monotonic() + settle_s
    while time.monotonic() < settled:
        for _ in range(4):
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


def read_bandwidth() -> float:
    """Bytes/s of a read-only reduction over 4 GiB (median of 10 after 3 warm-ups): the denominator of every
    byte floor, so the W12 GEMM, HF decode, device check and certified-head figures share one."""
    buf = torch.ones(2**31, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        buf.sum(dtype=torch.float32)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        buf.sum(dtype=torch.float32)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    bandwidth = buf.numel() * buf.element_size() / statistics.median(times)
    del buf
    return bandwidth


def record_section(result: dict, name: str, run: Callable[[], object], out: str | None) -> None:
    """``result[name] = run()``, or the error it raised; echoed to stderr and saved to ``out`` at once."""
    try:
        result[name] = run()
    except Exception as exc:
        result[name] = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps({name: result[name]}), file=sys.stderr, flush=True)
    if out:
        write_result(result, out)


class ClockLog:
    """nvidia-smi sampling the SM clock, board power and throttle reasons every ``period_ms`` while open;
    :meth:`summaries` sums up windows of samples. Without nvidia-smi it records nothing (every window: None)."""

    FIELDS = "timestamp,clocks.sm,power.draw,clocks_throttle_reasons.active"
    POWER_CAP = 0x4  # clocks_throttle_reasons.active bit: SW power cap

    def __init__(self, period_ms: int = 100):
        self.period_ms = period_ms
        self.process = None
        self.closed_samples = None  # every sample, kept once the log is closed

    def __enter__(self) -> ClockLog:
        smi = shutil.which("nvidia-smi")
        if smi:
            self.file = tempfile.NamedTemporaryFile("w+", suffix=".csv")
            self.process = subprocess.Popen(
                [smi, f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits", f"-lms={self.period_ms}"],
                stdout=self.file,
                stderr=subprocess.DEVNULL,
            )
        return self

    def __exit__(self, *exc) -> None:
        if self.process:
            self.process.terminate()
            self.process.wait()
            self.closed_samples = self.samples()
            self.file.close()

    def samples(self) -> list[tuple[float, float, float, int]]:
        """(unix time, SM MHz, W, throttle reasons) of every sample so far."""
        if self.closed_samples is not None or not self.process:
            return self.closed_samples or []
        self.file.flush()
        with open(self.file.name) as fh:
            rows = []
            for row in csv.reader(fh):
                try:
                    stamp, fraction = row[0].strip().split(".")  # local time, as time.mktime reads it
                    rows.append(
                        (
                            time.mktime(time.strptime(stamp, "%Y/%m/%d %H:%M:%S")) + float("0." + fraction),
                            float(row[1]),
                            float(row[2]),
                            int(row[3], 16),
                        )
                    )
                except (IndexError, ValueError):  # a line being written, or a field the GPU does not report
                    continue
        return rows

    def summaries(self, windows: dict) -> dict:
        """{key: the clock over wall-clock window (start, end)} for every key of ``windows``, from one read of the log
        (call it once the windows' samples are written, e.g. after the next measurement): median and minimum SM MHz,
        peak W and whether the power cap throttled, or None for a window without samples."""
        samples = self.samples()
        out = {}
        for key, (start, end) in windows.items():
            window = [s for s in samples if start <= s[0] <= end + self.period_ms / 1000]
            out[key] = (
                {
                    "sm_mhz": statistics.median(s[1] for s in window),
                    "sm_mhz_min": min(s[1] for s in window),
                    "power_w": max(s[2] for s in window),
                    "power_capped": any(s[3] & self.POWER_CAP for s in window),
                    "samples": len(window),
                }
                if window
                else None
            )
        return out
