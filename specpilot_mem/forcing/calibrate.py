"""δ, the near-tie threshold (§3.3): the largest margin at stock's first departures from AR decoding,
rounded up to a multiple of 1/8.

At stock's first departure from AR on a request the two outputs share every earlier token, so the
scorer saw the same context for both tokens and their log-probability gap is the margin that
floating-point rounding alone produced there (the paper measures at most 0.232 nats, so δ = 0.25).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from specpilot_mem.forcing.scorer import ForcingError, ScoredOutput

STEP = 1 / 8


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

    def to_dict(self) -> dict:
        return {"delta": self.delta, "requests": self.requests, "largest_gap": self.largest_gap,
                "departures": [asdict(d) for d in self.departures]}


def first_departure(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """First position where two outputs differ; None if one is a prefix of the other."""
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return None


def round_up_to_step(gap: float) -> float:
    """Up to a multiple of 1/8, and at least 1/8: a zero threshold would call every mismatch an event."""
    return max(STEP, math.ceil(gap / STEP - 1e-9) * STEP)


def calibrate_delta(ar: Mapping[str, ScoredOutput], stock: Mapping[str, ScoredOutput]) -> Calibration:
    """δ from scored AR and stock outputs of the same requests (Phase 0)."""
    if set(ar) != set(stock):
        raise ForcingError("AR and stock outputs cover different requests", where="calibration",
                           fix="run AR and stock on the same request set")
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
    return Calibration(round_up_to_step(largest), len(ar), tuple(departures))
