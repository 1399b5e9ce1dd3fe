"""Paired runs (§3.2): two systems serve the same requests, and the controller times both.

On one device the two run one after the other, in A-B then B-A order on alternate repeats, so a
slow drift (clocks, temperature) hits both equally. With a pool of two or more devices they run at
the same time on the pool's first two devices and swap them in A/B/B/A order (each device serves
A, B, B, A over four repeats), so neither a faster device nor a drift on one favours either system.
Stock-vs-stock noise is a paired run of stock against itself.

``paired_run`` drives systems in this process (``System`` objects, e.g. ``EngineSystem``);
``specpilot_mem.controller.pool`` runs the same schedule with every system in its own process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from specpilot_mem.controller.gains import GainEstimate, Run, divergent_requests, gain
from specpilot_mem.controller.requests import Request
from specpilot_mem.controller.system import RequestOutput, System
from specpilot_mem.errors import RoundError

Slot = tuple[str, str]  # ("a" or "b", device)


def schedule(repeats: int, devices: Sequence[str]) -> list[list[Slot]]:
    """The order of a paired run: a list of steps, each a list of (system, device) that run together."""
    if repeats < 1:
        raise RoundError(
            f"a paired run needs at least one repeat, got {repeats}", where="repeats", fix="use repeats >= 1"
        )
    if not devices:
        raise RoundError("a paired run needs a device", where="devices", fix="pass e.g. ['cuda:0'] or ['cpu']")
    if len(set(devices)) != len(devices):
        raise RoundError(f"devices listed twice in {list(devices)}", where="devices", fix="list each device once")
    steps: list[list[Slot]] = []
    for repeat in range(repeats):
        if len(devices) == 1:
            order = ("a", "b") if repeat % 2 == 0 else ("b", "a")
            steps.extend([[(order[0], devices[0])], [(order[1], devices[0])]])
        else:
            swapped = (repeat + 1) // 2 % 2  # 0, 1, 1, 0, 0, 1, ...: A/B/B/A on each device
            steps.append([("a", devices[swapped]), ("b", devices[1 - swapped])])
    return steps


@dataclass(frozen=True)
class PairedResult:
    a: str
    b: str
    runs_a: tuple[Run, ...]
    runs_b: tuple[Run, ...]

    def gain(self, requests: Sequence[Request]) -> GainEstimate:
        """Gain of b over a."""
        return gain(self.runs_a, self.runs_b, requests)

    def divergent(self) -> list[str]:
        return divergent_requests(self.runs_a, self.runs_b)

    def to_dict(self) -> dict:
        return {
            "a": self.a,
            "b": self.b,
            "runs_a": [r.to_dict() for r in self.runs_a],
            "runs_b": [r.to_dict() for r in self.runs_b],
        }


def _checked(
    system: System, requests: Sequence[Request], outputs: list[RequestOutput], device: str
) -> tuple[RequestOutput, ...]:
    got = [o.id for o in outputs]
    wanted = [r.id for r in requests]
    if got != wanted:
        raise RoundError(
            f"system {system.name!r} on {device} returned outputs for {got[:5]}... instead of {wanted[:5]}...",
            where=f"system {system.name}",
            fix="System.run must return one output per request, in request order",
        )
    return tuple(outputs)


def _serve(
    which: str, system: System, requests: Sequence[Request], batch_size: int, repeat: int, device: str
) -> tuple[str, Run]:
    outputs = system.run(list(requests), batch_size=batch_size, device=device)
    return which, Run(system.name, device, batch_size, repeat, _checked(system, requests, outputs, device))


def paired_run(
    a: System,
    b: System,
    requests: Sequence[Request],
    *,
    batch_sizes: Sequence[int] = (1,),
    repeats: int = 2,
    devices: Sequence[str] = ("cuda:0",),
    on_run: Callable[[Run], None] | None = None,
) -> PairedResult:
    """Time ``a`` and ``b`` on ``requests`` at every batch size, ``repeats`` times, per ``schedule``.

    With several devices both systems run at once from two threads, so ``System.run`` must be safe
    to call concurrently for different devices (an SGLang adapter talks to two servers; the engine's
    ``EngineSystem`` takes one engine per device).
    """
    if not requests:
        raise RoundError("a paired run needs requests", where="requests", fix="load a request set")
    if any(size < 1 for size in batch_sizes) or not batch_sizes:
        raise RoundError(f"bad batch sizes {list(batch_sizes)}", where="batch_sizes", fix="use positive integers")
    systems = {"a": a, "b": b}
    runs: dict[str, list[Run]] = {"a": [], "b": []}
    steps = schedule(repeats, devices)
    per_repeat = len(steps) // repeats
    for index, step in enumerate(steps):
        repeat = index // per_repeat
        for batch_size in batch_sizes:
            jobs = [(which, systems[which], requests, batch_size, repeat, device) for which, device in step]
            if len(jobs) == 1:
                finished = [_serve(*jobs[0])]
            else:
                with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
                    finished = list(pool.map(lambda job: _serve(*job), jobs))
            for which, run in finished:
                runs[which].append(run)
                if on_run is not None:
                    on_run(run)
    return PairedResult(a.name, b.name, tuple(runs["a"]), tuple(runs["b"]))


@dataclass(frozen=True)
class Noise:
    """Stock-vs-stock noise: how far from 1 a paired run of a system against itself lands."""

    noise: float
    estimate: GainEstimate
    result: PairedResult  # the runs behind it (left out of to_dict: round records keep the numbers)

    def to_dict(self) -> dict:
        return {"noise": self.noise, "estimate": self.estimate.to_dict()}


def stock_noise(
    stock: System,
    requests: Sequence[Request],
    *,
    stock_b: System | None = None,
    batch_sizes: Sequence[int] = (1,),
    repeats: int = 2,
    devices: Sequence[str] = ("cuda:0",),
    on_run: Callable[[Run], None] | None = None,
) -> Noise:
    """|gain - 1| of stock over itself: the systematic error a paired run shows when there is nothing to find.

    The candidate's own sampling error is already in its interval, so the noise term of the
    promotion rule covers what an interval cannot see (device and order effects).
    """
    result = paired_run(
        stock, stock_b or stock, requests, batch_sizes=batch_sizes, repeats=repeats, devices=devices, on_run=on_run
    )
    estimate = result.gain(requests)
    return Noise(abs(estimate.gain - 1.0), estimate, result)
