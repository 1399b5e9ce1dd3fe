"""δ, the near-tie threshold (§3.3): the largest margin at stock's first departures from AR decoding and at AR's
own departures from the scorer's argmax, rounded up to a multiple of 1/8 (below 1/16: up to a power of two, at least
2^-10).

At stock's first departure from AR on a request the two outputs share every earlier token, so the
scorer saw the same context for both tokens and their log-probability gap is the margin that
floating-point rounding alone produced there (the paper measures at most 0.232 nats, so δ = 0.25).
AR is greedy decoding by definition, so where its token is not the scorer's argmax the two computed the same model on
the same context and the gap is the rounding between the decode's arithmetic and the scorer's: the same quantity,
and in BF16 the more frequent one (on 24,000 tokens stock often never departs from AR while AR departs from the
scorer a dozen times; without them δ sat on its floor and stock's own rounding flips counted as events).
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
    # AR's tokens that are not the scorer's argmax (``ar_token`` AR's, ``stock_token`` the scorer's argmax)
    scorer_departures: tuple[Departure, ...] = ()

    @property
    def largest_gap(self) -> float:
        return max((d.gap for d in (*self.departures, *self.scorer_departures)), default=0.0)

    @property
    def basis(self) -> str:
        """Where δ comes from, in words (printed with every verdict)."""
        if not self.departures and not self.scorer_departures:
            return f"floor 2^-10: stock never departed from AR, nor AR from the scorer, on {self.requests} requests"
        return (
            f"largest gap {self.largest_gap:.3g} nats at {len(self.departures)} first departures of stock from AR "
            f"and {len(self.scorer_departures)} of AR from the scorer's argmax on {self.requests} requests, rounded up"
        )

    def to_dict(self) -> dict:
        return {
            "delta": self.delta,
            "requests": self.requests,
            "largest_gap": self.largest_gap,
            "basis": self.basis,
            "delta_max": DELTA_MAX,
            "departures": [asdict(d) for d in self.departures],
            "scorer_departures": [asdict(d) for d in self.scorer_departures],
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
    scorer_departures = []
    for rid in sorted(ar):
        output = ar[rid]
        margins = output.margin
        for position in output.mismatch.nonzero()[0]:
            p = int(position)
            token, argmax = output.output_ids[p], int(output.scores.argmax[p])
            scorer_departures.append(Departure(rid, p, token, argmax, float(margins[p])))
    everything = departures + scorer_departures
    largest = max((d.gap for d in everything), default=0.0)
    if largest > DELTA_MAX:
        wide = sorted((d for d in everything if d.gap > DELTA_MAX), key=lambda d: -d.gap)
        examples = ", ".join(f"{d.id}@{d.position} ({d.gap:.3g} nats)" for d in wide[:5])
        raise ForcingError(
            f"{len(wide)} of stock's first departures from AR (or AR's from the scorer's argmax) are not near-ties "
            f"(gap > {DELTA_MAX:g} nat): {examples}",
            where="calibration",
            fix="stock must be lossless against AR: check that stock's and AR's outputs come from the same model and "
            "request set, and that stock carries no fault; δ is not calibrated on such a run",
        )
    return Calibration(round_up_to_step(largest), len(ar), tuple(departures), tuple(scorer_departures))
