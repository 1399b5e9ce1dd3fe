"""δ, the near-tie threshold (§3.3): the largest margin at stock's first departures from AR decoding,
rounded up to a multiple of 1/8 (below 1/16: up to a power of two, at least 2^-10).

At stock's first departure from AR on a request the two outputs share every earlier token, so the
scorer saw the same context for both tokens and their log-probability gap is the margin that
floating-point rounding alone produced there (the paper measures at most 0.232 nats, so δ = 0.25).
In FP32 rounding gaps are ~1e-6 nats and stock rarely departs at all, so a fixed 1/8 floor would
hide every lossy flip below 2δ = 0.25; the floor is 2^-10 instead, still far above FP32 rounding.

δ is bounded: a departure whose gap exceeds ``DELTA_MAX`` (1 nat, four times the paper's largest) is
not a near-tie, so stock is not lossless against AR (or the outputs are not the pair's) and the
calibration is refused: a δ of 7 nats would remove every event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from specpilot_mem.forcing.scorer import ForcingError, ScoredOutput

STEP = 1 / 8
FLOOR = 2.0**-10
DELTA_MAX = 1.0


@dataclass(frozen=True)
class Departure:
    id: str
    position: int
    ar_token: int
    stock_token: int
    gap: float


@dataclass(frozen=True)
class Calibration:
    delta: float
    requests: int
    departures: tuple[Departure, ...]

    @property
    def largest_gap(self) -> float:
        return max((d.gap for d in self.departures), default=0.0)

    @property
    def basis(self) -> str:
        """Where δ comes from, in words (printed with every verdict)."""
        if not self.departures:
            return f"floor 2^-10: stock never departed from AR on {self.requests} requests"
        return (
            f"largest gap {self.largest_gap:.3g} nats at {len(self.departures)} first departures on "
            f"{self.requests} requests, rounded up"
        )

    def to_dict(self) -> dict:
        return {
            "delta": self.delta,
            "requests": self.requests,
            "largest_gap": self.largest_gap,
            "basis": self.basis,
            "delta_max": DELTA_MAX,
            "departures": [asdict(d) for d in self.departures],
        }


def first_departure(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """First position where two outputs differ; None if one is a prefix of the other."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None


def round_up_to_step(gap: float) -> float:
    """Up to a multiple of 1/8 from 1/16 on; below, up to a power of two, and at least 2^-10 (a zero
    threshold would call every mismatch an event)."""
    if gap >= STEP / 2:
        return max(STEP, math.ceil(gap / STEP - 1e-9) * STEP)
    return max(FLOOR, 2.0 ** math.ceil(math.log2(gap))) if gap > 0 else FLOOR


def calibrate_delta(ar: Mapping[str, ScoredOutput], stock: Mapping[str, ScoredOutput]) -> Calibration:
    """δ from scored AR and stock outputs of the same requests (Phase 0)."""
    if set(ar) != set(stock):
        raise ForcingError(
            "AR and stock outputs cover different requests",
            where="calibration",
            fix="run AR and stock on the same request set",
        )
    if not ar:
        raise ForcingError("no requests to calibrate δ on", where="calibration", fix="run AR and stock first")
    departures = []
    for rid in sorted(ar):
        position = first_departure(ar[rid].output_ids, stock[rid].output_ids)
        if position is None:
            continue
        gap = abs(float(stock[rid].scores.token_logprob[position]) - float(ar[rid].scores.token_logprob[position]))
        departures.append(Departure(rid, position, ar[rid].output_ids[position], stock[rid].output_ids[position], gap))
    largest = max((d.gap for d in departures), default=0.0)
    if largest > DELTA_MAX:
        wide = sorted((d for d in departures if d.gap > DELTA_MAX), key=lambda d: -d.gap)
        examples = ", ".join(f"{d.id}@{d.position} ({d.gap:.3g} nats)" for d in wide[:5])
        raise ForcingError(
            f"{len(wide)} of stock's first departures from AR are not near-ties (gap > {DELTA_MAX:g} nat): {examples}",
            where="calibration",
            fix="stock must be lossless against AR: check that stock's and AR's outputs come from the same model and "
            "request set, and that stock carries no fault; δ is not calibrated on such a run",
        )
    return Calibration(round_up_to_step(largest), len(ar), tuple(departures))
